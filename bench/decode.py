"""Decoding speed: greedy and beam search on the KV cache, random weights.

    python bench/decode.py                      # 'small' and 'default', greedy + beam 4, CPU
    python bench/decode.py --configs=small --reps=10 --peer   # + the Flax WMT example
    python bench/decode.py --platform=gpu --configs=small --batch_size=16 --dtype=bfloat16

Runs on the CPU unless `--platform` names another JAX platform ('gpu', 'tpu', or 'auto' =
JAX's choice); `--batch_size` and `--dtype` size it for an accelerator.

Prints one JSON object per (config, method): ms per batch (median over timed calls),
sentences/s, generated tokens/s (best hypothesis: batch x steps; and x beam for all beams).

Setup (as the peers' harness, `../shared/bench/peers/jax_encdec_bench.py`): batch 16
(default), source length 32 (random ids in [3, vocab)), `max_new_tokens` 32 generated tokens, EOS
out of reach, so
every call runs the full 32 decoder steps (1 before the loop + 31 in it), encoder included.
`small` = vocab 8192, d_model 256, d_ff 1024, 4 heads, 3+3 layers, shared embeddings, tied
output (the harness's 'small'); `default` = the model of configs/default.py.

`--peer` also times the Flax WMT example's beam search (`decode.beam_search` + its
`predict_step` decoder, pre-LN, no biases) from `$FLAX_WMT_DIR` (default
`~/peers/flax/examples/wmt`) in the same process, interleaved with ours, so the ratio is
taken under the same machine load. Each timed call records the CPU that *other* processes
used meanwhile (`foreign_cores`); calls above `--max_foreign` are left out of the medians
(all are kept when that would leave fewer than 3).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _platform_flag(argv) -> str:
  """--platform's value, read before JAX is imported (it fixes the backend at import)."""
  for i, arg in enumerate(argv):
    if arg.startswith('--platform='):
      return arg.split('=', 1)[1]
    if arg == '--platform' and i + 1 < len(argv):
      return argv[i + 1]
  return 'cpu'


if _platform_flag(sys.argv) != 'auto':
  os.environ.setdefault('JAX_PLATFORMS', _platform_flag(sys.argv))

# Imported only now that JAX_PLATFORMS is set: JAX reads it once, at import.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from autoregressive.strategies import BeamSearch, Greedy, Limits  # noqa: E402
from configs import default  # noqa: E402
from model import build_model  # noqa: E402

BATCH, SRC_LEN, MAX_LEN, BEAM = 16, 32, 32, 4


def model_config(name: str, dtype: str = 'float32') -> dict:
  return {**_model_config(name), 'dtype': dtype}


def _model_config(name: str) -> dict:
  if name == 'small':
    return {'kind': 'encoder_decoder', 'vocab_size': 8192, 'num_encoder_layers': 3,
            'num_decoder_layers': 3, 'd_model': 256, 'num_heads': 4, 'd_ff': 1024,
            'dropout_rate': 0.0, 'max_len': 256, 'share_embeddings': True,
            'logits_via_embedding': True}
  if name == 'default':
    return dict(default.get_config().model)
  raise SystemExit(f'unknown config {name!r}; known: small, default')


def _cpu_snapshot():
  with open('/proc/stat') as f:
    v = [int(x) for x in f.readline().split()[1:9]]
  t = os.times()
  return sum(v) - v[3] - v[4], t.user + t.system, time.perf_counter()


def _timed(fn, reps: int, warmup: int, max_foreign: float):
  first = None
  calls = []
  for i in range(warmup + reps):
    a = _cpu_snapshot()
    jax.block_until_ready(fn())
    b = _cpu_snapshot()
    wall = b[2] - a[2]
    busy = (b[0] - a[0]) / os.sysconf('SC_CLK_TCK')
    foreign = max(0.0, busy - (b[1] - a[1])) / wall
    if i == 0:
      first = wall
    if i >= warmup:
      calls.append((wall, foreign))
  clean = [w for w, f in calls if f <= max_foreign]
  used = clean if len(clean) >= 3 else [w for w, _ in calls]
  return {'first_call_s(compile)': round(first, 2), 'calls': len(calls), 'clean_calls': len(clean),
          'median_ms': round(1e3 * statistics.median(used), 1),
          'min_ms': round(1e3 * min(used), 1),
          'foreign_cores_median': round(statistics.median(f for _, f in calls), 2)}


def bench_ours(name: str, reps: int, warmup: int, max_foreign: float, methods, dtype='float32'):
  module = build_model(model_config(name, dtype))  # random weights (seed 0)
  vocab = module.config.vocab_size
  rng = np.random.default_rng(7)
  inputs = [jnp.asarray(rng.integers(3, vocab, size=(BATCH, SRC_LEN)), jnp.int32)
            for _ in range(2)]
  # The token door (a row's `search`); eos_id None: every call decodes MAX_LEN tokens.
  fns = {
      'greedy': lambda x: Greedy().search(module, x, limits=Limits(max_new_tokens=MAX_LEN),
                                          eos_id=None, scores=False)[0],
      f'beam{BEAM}': lambda x: BeamSearch(beam_size=BEAM, alpha=0.6).search(
          module, x, limits=Limits(max_new_tokens=MAX_LEN, nbest=BEAM), eos_id=None)[0],
  }
  return {m: _counter(fns[m], inputs) for m in methods}


def _counter(fn, inputs):
  state = {'i': 0}

  def call():
    state['i'] += 1
    return fn(inputs[state['i'] % 2])
  return call


def bench_peer(reps, warmup, max_foreign):
  """The Flax WMT example's beam search through the peers' harness adapter."""
  peers = os.path.join(os.path.dirname(ROOT), 'shared', 'bench', 'peers')
  wmt = os.environ.get('FLAX_WMT_DIR', os.path.expanduser('~/peers/flax/examples/wmt'))
  if not (os.path.isdir(peers) and os.path.isdir(wmt)):
    return None
  sys.path.insert(0, peers)
  import jax_encdec_bench as harness  # pylint: disable=import-outside-toplevel
  cfg = {'vocab': 8192, 'd': 256, 'q': 256, 'f': 1024, 'heads': 4, 'enc_layers': 3,
         'dec_layers': 3, 'dropout': 0.1, 'max_len': 256, 'src_len': SRC_LEN}
  impl = harness.FlaxWMT(cfg, wmt)
  rng = np.random.default_rng(7)
  inputs = [jnp.asarray(rng.integers(3, 8192, size=(BATCH, SRC_LEN)), jnp.int32) for _ in range(2)]
  params = impl.init(jax.random.key(0), inputs[0], jnp.ones((BATCH, MAX_LEN), jnp.int32))
  fn = jax.jit(functools.partial(impl.beam_search, beam_size=BEAM, max_decode_len=MAX_LEN,
                                 eos_id=8192 + 1))
  return _counter(lambda x: fn(params, x), inputs)


def _rates(result, beam):
  steps = MAX_LEN  # tokens generated per sentence (the peer: MAX_LEN - 1)
  seconds = result['median_ms'] / 1e3
  result['sentences_per_s'] = round(BATCH / seconds, 1)
  result['gen_tokens_per_s'] = round(BATCH * steps / seconds)
  result['gen_tokens_per_s_all_beams'] = round(BATCH * steps * beam / seconds)
  return result


def main():
  global BATCH  # pylint: disable=global-statement  (--batch_size sets the module's setup)
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--configs', default='small,default')
  ap.add_argument('--methods', default=f'greedy,beam{BEAM}')
  ap.add_argument('--reps', type=int, default=10)
  ap.add_argument('--warmup', type=int, default=2)
  ap.add_argument('--max_foreign', type=float, default=0.15)
  ap.add_argument('--peer', action='store_true', help='also time the Flax WMT beam search')
  ap.add_argument('--batch_size', type=int, default=BATCH, help='sentences per call')
  ap.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
  ap.add_argument('--platform', default='cpu',
                  help="JAX platform: cpu (default), gpu, tpu, or auto (JAX's choice)")
  a = ap.parse_args()
  BATCH = a.batch_size
  stamp = {'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
           'cpus': os.cpu_count(), 'jax': jax.__version__, 'python': platform.python_version(),
           'load': os.getloadavg()[0], 'batch': BATCH, 'src_len': SRC_LEN,
           'max_new_tokens': MAX_LEN, 'dtype': a.dtype, 'backend': jax.default_backend(),
           'device': jax.devices()[0].device_kind}
  print(json.dumps({'bench': 'decode', **stamp}), flush=True)
  methods = a.methods.split(',')
  for name in a.configs.split(','):
    calls = bench_ours(name, a.reps, a.warmup, a.max_foreign, methods, a.dtype)
    if a.peer and name == 'small':
      peer = bench_peer(a.reps, a.warmup, a.max_foreign)
      if peer is not None:
        calls['flax_wmt_beam4'] = peer
    # Interleave the methods call by call so that they share the machine's load.
    results = {m: [] for m in calls}
    firsts = {}
    for m, fn in calls.items():
      t = time.perf_counter()
      jax.block_until_ready(fn())
      firsts[m] = time.perf_counter() - t
    for _ in range(a.warmup - 1):
      for fn in calls.values():
        jax.block_until_ready(fn())
    for _ in range(a.reps):
      for m, fn in calls.items():
        results[m].append(_timed(fn, 1, 0, a.max_foreign))
    for m, runs in results.items():
      ok = [r['median_ms'] for r in runs if r['foreign_cores_median'] <= a.max_foreign]
      used = ok if len(ok) >= 3 else [r['median_ms'] for r in runs]
      res = {'config': name, 'method': m, 'first_call_s(compile)': round(firsts[m], 2),
             'calls': len(runs), 'clean_calls': len(ok),
             'median_ms': round(statistics.median(used), 1), 'min_ms': round(min(used), 1),
             'foreign_cores_median': round(statistics.median(
                 r['foreign_cores_median'] for r in runs), 2)}
      beam = 1 if m == 'greedy' else BEAM
      res = _rates(res, beam)
      res['ms_per_decoder_step'] = round(res['median_ms'] / MAX_LEN, 2)
      res.update(batch=BATCH, dtype=a.dtype)
      if m == 'flax_wmt_beam4':
        res['gen_tokens_per_s'] = round(BATCH * (MAX_LEN - 1) / (res['median_ms'] / 1e3))
        res['gen_tokens_per_s_all_beams'] = res['gen_tokens_per_s'] * BEAM
      print(json.dumps(res), flush=True)


if __name__ == '__main__':
  main()
