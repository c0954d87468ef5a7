"""Compiled temporary memory of attention (forward + backward) against sequence length.

    python bench/attention_memory.py                       # lengths 1024 .. 8192, CPU
    python bench/attention_memory.py --lengths=8192,32768 --platform=gpu

For each length, `jax.jit(grad).lower(...).compile().memory_analysis()` of
`chunked_dot_product_attention` (online softmax over key blocks) and of the reference
`dot_product_attention`, causal, batch 1, one head of 64 (float32): no run, the compiler's
own figure, so it is deterministic. The chunked path's temporaries grow as length x block,
the reference's as length^2 (its logits, weights and their gradients). Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def temp_mib(fn, length: int, heads: int, head_dim: int, dtype) -> float:
  import jax  # after main() set JAX_PLATFORMS (JAX reads it once, at import)
  x = jax.ShapeDtypeStruct((1, length, heads, head_dim), dtype)
  grad = jax.grad(lambda q, k, v: fn(q, k, v).astype('float32').sum(), argnums=(0, 1, 2))
  compiled = jax.jit(grad).lower(x, x, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes / 2 ** 20


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--lengths', default='1024,2048,4096,8192')
  parser.add_argument('--block_size', type=int, default=512)
  parser.add_argument('--heads', type=int, default=1)
  parser.add_argument('--head_dim', type=int, default=64)
  parser.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  parser.add_argument('--platform', default='cpu', help="cpu, gpu, or auto (JAX's choice)")
  parser.add_argument('--skip_reference_above', type=int, default=16384,
                      help='lengths above this compile only the chunked path')
  args = parser.parse_args()
  if args.platform != 'auto':
    os.environ.setdefault('JAX_PLATFORMS', args.platform)
  # Imported now that JAX_PLATFORMS is set (JAX reads it once, at import; model imports JAX).
  import jax

  from model import attention as attn
  causal = attn.FactoredMask(causal=True)
  for length in (int(n) for n in args.lengths.split(',')):
    shape = (length, args.heads, args.head_dim, args.dtype)
    row = {'bench': 'attention_memory', 'backend': jax.default_backend(), 'length': length,
           'block_size': args.block_size, 'heads': args.heads, 'head_dim': args.head_dim,
           'dtype': args.dtype, 'chunked_temp_mib': round(temp_mib(
               lambda q, k, v: attn.chunked_dot_product_attention(
                   q, k, v, mask=causal, block_size=args.block_size), *shape), 1)}
    if length <= args.skip_reference_above:
      row['reference_temp_mib'] = round(temp_mib(
          lambda q, k, v, n=length: attn.dot_product_attention(q, k, v, mask=causal.dense(n, n)),
          *shape), 1)
      row['ratio'] = round(row['reference_temp_mib'] / max(row['chunked_temp_mib'], 1e-9), 1)
    print(json.dumps(row), flush=True)


if __name__ == '__main__':
  main()
