"""Train-step throughput of this codebase, with its references measured in the same process.

    python bench/train_step.py --config=small            # ours + the matmul reference
    python bench/train_step.py --config=base --flax_wmt_dir=~/peers/flax/examples/wmt
    python bench/train_step.py --config=base --only=flax_wmt --flax_wmt_dir=...  # its peak RSS
    python bench/train_step.py --config=base --batch_size=256 --dtype=bfloat16 \
        --attention_impl=cudnn --flax_wmt_dir=...   # the GPU speed target

Prints one JSON object: ms/step (median, p10, p90, min, max), target tokens/s, analytic
train FLOPs (the formula of ../shared/bench/peers/flops.py: 2 per multiply-add, matmuls
only, backward = 2 x forward), GFLOP/s and the fraction of a jitted 2048^2 f32 matmul's
rate measured in this process. With `--flax_wmt_dir` (a checkout of google/flax
examples/wmt, never copied here) the Flax WMT example's step is timed in the same process,
its steps interleaved with ours, with the same batches and optimizer and the example's own
label-smoothed loss (`compute_weighted_cross_entropy` of its train.py), in the same dtype,
and the ratio is reported. `--batch_size`, `--length` and `--dtype` size it for an
accelerator; the matmul reference is then an `--matmul_n`^3 matmul in the step's dtype
(default 8192 on GPU/TPU, 2048 on CPU), timed in this process, so `fraction_of_matmul` is
the MFU against what this device reaches, not against a datasheet.

The step timed is the real one (`training/steps.py: make_train_step`): label-smoothed loss,
Adam(0.9, 0.98, 1e-9), donated state, non-finite guard, metrics. Batches are random ids in
[3, vocab) with no padding (the peers' harness recipe).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from model.config import ATTENTION_IMPLS, RESIDUAL_DTYPES, ModelConfig  # noqa: E402
from training import mesh as mesh_lib, state as state_lib, steps, telemetry  # noqa: E402
from training.state import TrainState  # noqa: E402

# The peers' configs (../shared/bench/peers/RESULTS.md, section 3).
CONFIGS = {
    'small': dict(vocab=8192, d=256, f=1024, heads=4, layers=3, batch=64, src_len=32, tgt_len=32),
    'base': dict(vocab=32000, d=512, f=2048, heads=8, layers=6, batch=16, src_len=64, tgt_len=64),
}


def train_flops(c) -> int:
  """Analytic FLOPs of one train step (matmuls only; 3 x forward): the trainer's MFU count
  (`training.telemetry.train_step_flops`), the same formula as the peers' flops.py."""
  config = ModelConfig.from_config(model_config(c, 0.0))
  return telemetry.train_step_flops(config, {'inputs': (c['batch'], c['src_len']),
                                             'targets': (c['batch'], c['tgt_len'])})


def matmul_gflops(n=2048, reps=20, dtype='float32') -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(jnp.matmul)
  for _ in range(3):
    f(a, b).block_until_ready()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * n ** 3 / np.median(times) / 1e9


def model_config(c, dropout, attention_dropout=None, **overrides):
  attention_dropout = dropout if attention_dropout is None else attention_dropout
  return dict(kind='encoder_decoder', vocab_size=c['vocab'], num_encoder_layers=c['layers'],
              num_decoder_layers=c['layers'], d_model=c['d'], num_heads=c['heads'], d_ff=c['f'],
              dropout_rate=dropout, attention_dropout_rate=attention_dropout, max_len=256,
              share_embeddings=True, logits_via_embedding=True, **overrides)


def ours(c, batch, args):
  """A jitted step closure over our real train step."""
  config = ModelConfig.from_config(model_config(
      c, args.dropout, attention_dropout(args), dtype=args.dtype,
      residual_dtype=args.residual_dtype, attention_impl=args.attention_impl,
      scan_layers=args.scan_layers, remat=args.remat))
  tx = optax.adam(5e-4, b1=0.9, b2=0.98, eps=1e-9)
  params = jax.jit(state_lib.init_params, static_argnums=0)(config, jax.random.key(0))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.PRNGKey(1))
  step = steps.jit_train_step(config, tx, lambda s: 5e-4, mesh_lib.make_mesh(1),
                              label_smoothing=0.1)
  holder = {'state': state}

  def run():
    holder['state'], metrics = step(holder['state'], batch)
    return metrics['loss']

  return run, count_params(params)


def random_batch(c, seed: int = 0) -> dict[str, jax.Array]:
  """Random ids in [3, vocab), no padding (the peers' harness recipe), `[batch, len]`."""
  rng = np.random.default_rng(seed)
  def tokens(length):
    return jnp.asarray(rng.integers(3, c['vocab'], (c['batch'], length)), jnp.int32)
  return {'inputs': tokens(c['src_len']), 'targets': tokens(c['tgt_len'])}


def attention_dropout(args) -> float:
  """--attention_dropout, else --dropout; 0 for 'cudnn', which cannot drop attention weights."""
  if args.attention_dropout is not None:
    return args.attention_dropout
  return 0.0 if args.attention_impl == 'cudnn' else args.dropout


def count_params(params):
  return sum(int(x.size) for x in jax.tree.leaves(params))


def load_peer_function(path: str, name: str, namespace: dict):
  """Exec one top-level function of a peer's source file: the example's loss lives in its
  train.py, whose imports would pull TensorFlow and its input pipeline."""
  for node in ast.parse(open(path).read()).body:
    if isinstance(node, ast.FunctionDef) and node.name == name:
      exec(compile(ast.Module([node], []), path, 'exec'), namespace)  # noqa: S102
      return namespace[name]
  raise KeyError(f'{name} not found in {path}')


def flax_wmt(c, batch, args):
  """The Flax WMT example's model and its own label-smoothed loss (both from a checkout), the
  same Adam."""
  wmt_dir = os.path.expanduser(args.flax_wmt_dir)
  sys.path.insert(0, wmt_dir)
  import models  # noqa: E402  (peer checkout, not part of this project; a Linen model)
  from flax.training import common_utils  # noqa: E402
  # Its `nn.log_softmax` is flax.linen's re-export of jax.nn.log_softmax: the same function.
  cross_entropy = load_peer_function(
      os.path.join(wmt_dir, 'train.py'), 'compute_weighted_cross_entropy',
      {'jnp': jnp, 'np': np, 'nn': jax.nn, 'common_utils': common_utils})
  cfg = models.TransformerConfig(
      vocab_size=c['vocab'], output_vocab_size=c['vocab'], share_embeddings=True,
      logits_via_embedding=True, dtype=jnp.dtype(args.dtype), emb_dim=c['d'], num_heads=c['heads'],
      num_layers=c['layers'], qkv_dim=c['d'], mlp_dim=c['f'], max_len=256,
      dropout_rate=args.dropout, attention_dropout_rate=args.dropout, deterministic=False)
  model = models.Transformer(cfg)
  params = jax.jit(models.Transformer(cfg.replace(deterministic=True)).init)(
      jax.random.key(0), batch['inputs'], batch['targets'])['params']
  tx = optax.adam(5e-4, b1=0.9, b2=0.98, eps=1e-9)
  base_key = jax.random.key(1)

  def loss_fn(p, i):
    logits = model.apply({'params': p}, batch['inputs'], batch['targets'],
                         rngs={'dropout': jax.random.fold_in(base_key, i)})
    weights = (batch['targets'] > 0).astype(jnp.float32)
    loss_sum, normalizer = cross_entropy(logits, batch['targets'], weights, 0.1)
    return loss_sum / normalizer

  def step(params, opt_state, i):
    loss, grads = jax.value_and_grad(loss_fn)(params, i)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(step, donate_argnums=(0, 1))
  holder = {'params': params, 'opt': tx.init(params), 'i': 0}

  def run():
    holder['params'], holder['opt'], loss = step(holder['params'], holder['opt'],
                                                 jnp.int32(holder['i']))
    holder['i'] += 1
    return loss

  return run, count_params(params)


def peak_device_memory_mib():
  """Peak bytes in use on device 0 (GPU/TPU), in MiB; None where the backend keeps no count."""
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get('peak_bytes_in_use')
  return None if peak is None else peak / 2 ** 20


def summarize(times, flops, tokens, peak):
  ms = np.asarray(times) * 1e3
  median = float(np.median(ms))
  return {'ms_per_step_median': median, 'ms_p10': float(np.percentile(ms, 10)),
          'ms_p90': float(np.percentile(ms, 90)), 'ms_min': float(ms.min()),
          'ms_max': float(ms.max()), 'target_tokens_per_s': tokens / median * 1e3,
          'gflops': flops / median / 1e6, 'fraction_of_matmul': flops / median / 1e6 / peak}


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', choices=sorted(CONFIGS), default='small')
  parser.add_argument('--steps', type=int, default=20, help='timed steps (after 3 warm-up)')
  parser.add_argument('--dropout', type=float, default=0.1)
  parser.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  parser.add_argument('--residual_dtype', default='compute', choices=list(RESIDUAL_DTYPES),
                      help="ours only: 'float32' keeps the residual stream float32 (the Flax "
                           "WMT example's stream is in --dtype)")
  parser.add_argument('--batch_size', type=int, default=None, help="sentences per step "
                      "(default: the config's; the GPU target's figure: base at 256)")
  parser.add_argument('--length', type=int, default=None,
                      help="source and target length (default: the config's, 32 or 64)")
  parser.add_argument('--attention_impl', default='reference', choices=list(ATTENTION_IMPLS))
  parser.add_argument('--attention_dropout', type=float, default=None,
                      help="default: --dropout (0 with attention_impl='cudnn')")
  parser.add_argument('--matmul_n', type=int, default=None,
                      help='size of the reference matmul (default 8192 on GPU/TPU, 2048 on CPU)')
  parser.add_argument('--scan_layers', action='store_true',
                      help='scan over layers (first_step_s shows the compile time it saves)')
  parser.add_argument('--remat', action='store_true', help='rematerialise each layer')
  parser.add_argument('--flax_wmt_dir', default=None,
                      help='google/flax examples/wmt checkout: time it in the same process')
  parser.add_argument('--only', choices=['ours', 'flax_wmt'], default=None,
                      help='time one contender alone, so that the peak RSS is its own')
  args = parser.parse_args()
  if args.only == 'flax_wmt' and not args.flax_wmt_dir:
    parser.error('--only=flax_wmt needs --flax_wmt_dir')
  return args


def time_steps(contenders, steps: int):
  """Runs the contenders' steps interleaved (so load changes hit them alike) -> (first-step
  seconds, timed-step seconds) per contender, after 3 warm-up steps."""
  times = {name: [] for name in contenders}
  first = {}
  for i in range(3 + steps):
    for name, (run, _) in contenders.items():
      start = time.perf_counter()
      run().block_until_ready()
      elapsed = time.perf_counter() - start
      if i == 0:
        first[name] = elapsed
      elif i >= 3:
        times[name].append(elapsed)
  return first, times


def environment(args, c, flops):
  """What was run, where, and the in-process matmul reference."""
  matmul_n = args.matmul_n or (2048 if jax.default_backend() == 'cpu' else 8192)
  peak = matmul_gflops(matmul_n, dtype=args.dtype)
  return {'bench': 'train_step', 'config': args.config, **c, 'dropout': args.dropout,
          'attention_dropout': attention_dropout(args),
          'dtype': args.dtype, 'residual_dtype': args.residual_dtype,
          'attention_impl': args.attention_impl,
          'scan_layers': args.scan_layers, 'remat': args.remat,
          'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
          'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores',
          'jax': jax.__version__, 'backend': jax.default_backend(),
          'device': jax.devices()[0].device_kind, 'train_flops_per_step': flops,
          'matmul': {'n': matmul_n, 'dtype': args.dtype, 'gflops': peak},
          'matmul_2048_gflops': (peak if (matmul_n, args.dtype) == (2048, 'float32')
                                 else matmul_gflops(2048)),
          'peak_device_memory_mib': peak_device_memory_mib(),
          # ru_maxrss is KiB on Linux; the process's peak, so per contender only with --only.
          'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
  args = parse_args()
  c = dict(CONFIGS[args.config])
  if args.batch_size:
    c['batch'] = args.batch_size
  if args.length:
    c['src_len'] = c['tgt_len'] = args.length
  batch = random_batch(c)
  flops = train_flops(c)
  contenders = {}
  if args.only in (None, 'ours'):
    contenders['ours'] = ours(c, batch, args)
  if args.only == 'flax_wmt' or (args.only is None and args.flax_wmt_dir):
    contenders['flax_wmt'] = flax_wmt(c, batch, args)
  first, times = time_steps(contenders, args.steps)
  result = environment(args, c, flops)
  for name, (_, num_params) in contenders.items():
    result[name] = {'params': num_params, 'first_step_s': first[name],
                    **summarize(times[name], flops, c['batch'] * c['tgt_len'],
                                result['matmul']['gflops'])}
  if 'flax_wmt' in result and 'ours' in result:
    result['speedup_vs_flax_wmt'] = (result['flax_wmt']['ms_per_step_median'] /
                                     result['ours']['ms_per_step_median'])
  print(json.dumps(result))


if __name__ == '__main__':
  main()
