"""Reduced-precision behaviour, with tolerances derived from the number formats.

The rest of the suite runs float32 matmuls at full precision (tests/conftest.py), so that its
equality tests hold on every backend. Here each precision is asked for explicitly, and the
error allowed is what the format's rounding can cause: a matmul with inputs rounded to unit
roundoff `u` (and float32 accumulation over `k` terms) is off by at most
`(2u + k * u32) * sum_k |a_ik| |b_kj|` per entry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import build_model
from training import accelerator

U32 = 2.0 ** -24  # unit roundoff of float32 (24-bit significand)
U_TF32 = 2.0 ** -11  # TF32: 11-bit significand (10 stored)
U_BF16 = 2.0 ** -8  # bfloat16: 8-bit significand (7 stored)


def input_roundoff(backend: str, precision: str) -> float:
  """Unit roundoff of a float32 matmul's inputs at `precision` on `backend`."""
  if backend == 'cpu' or precision == 'highest':
    return U32
  if precision == 'high':  # bf16_3x on TPU, TF32 or bf16_3x on GPU: at worst TF32
    return U_TF32
  return U_TF32 if backend == 'gpu' else U_BF16  # 'default': TF32 (GPU), one bf16 pass (TPU)


def test_suite_runs_at_highest_precision():
  assert jax.config.jax_default_matmul_precision == 'highest'


@pytest.mark.parametrize('precision', accelerator.MATMUL_PRECISIONS)
def test_float32_matmul_error_within_input_rounding(precision):
  rng = np.random.RandomState(0)
  k = 256
  a, b = rng.randn(64, k).astype(np.float32), rng.randn(k, 48).astype(np.float32)
  with accelerator.matmul_precision(precision):
    if precision == 'default':  # the backend's own default, not the suite's 'highest'
      with jax.default_matmul_precision(None):
        out = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
    else:
      out = np.asarray(jax.jit(jnp.matmul)(a, b), np.float64)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  magnitude = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
  u = input_roundoff(jax.default_backend(), precision)
  bound = (2 * u + k * U32) * magnitude
  assert np.all(np.abs(out - exact) <= bound)


def test_bfloat16_compute_error_scales_with_bfloat16_roundoff():
  """bf16 activations and matmul inputs (float32 params, softmax and LayerNorm statistics):
  the logits' relative error is a small multiple of bf16's roundoff per layer, far from what a
  wrong cast (e.g. bf16 softmax statistics, or bf16 params) would give."""
  config = dict(kind='encoder_decoder', vocab_size=64, num_encoder_layers=2,
                num_decoder_layers=2, d_model=64, num_heads=4, d_ff=128, max_len=32)
  rng = np.random.RandomState(1)
  src = jnp.asarray(rng.randint(3, 64, (4, 12)), jnp.int32)
  tgt = jnp.asarray(rng.randint(3, 64, (4, 10)), jnp.int32)
  reference = build_model(config)
  variables = reference.init(jax.random.key(0), src, tgt)
  exact = np.asarray(reference.apply(variables, src, tgt), np.float64)
  low = np.asarray(build_model({**config, 'dtype': 'bfloat16'}).apply(variables, src, tgt),
                   np.float64)
  relative = np.linalg.norm(low - exact) / np.linalg.norm(exact)
  sublayers = 2 * 2 + 2 * 3  # encoder: attention + FFN; decoder: + cross-attention
  assert relative <= 2 * U_BF16 * sublayers
  assert relative > U32 * 100  # it really computed in bf16
