"""The Tiny Shakespeare train step (configs/shakespeare_char.py) alone, on N CPU devices.

    python bench/shakespeare_step.py --devices=1
    python bench/shakespeare_step.py --devices=2          # data parallel over both cores
    python bench/shakespeare_step.py --devices=1 --scan_layers

Times the trainer's own jitted step (`steps.jit_train_step`: mesh shardings, donated state)
on random character batches, outside the training loop: `rounds` medians of 10 back-to-back
steps. Prints one JSON object. Run the settings
alternately, a process each: `--devices` sets `XLA_FLAGS` before JAX starts.
The full-run comparison with nanoGPT is `train.py --config=configs/shakespeare_char.py`
(bench/results/shakespeare.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--devices', type=int, default=1, help='simulated CPU devices')
  parser.add_argument('--rounds', type=int, default=12, help='timed rounds of 10 steps')
  parser.add_argument('--scan_layers', action='store_true')
  args = parser.parse_args()
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             f' --xla_force_host_platform_device_count={args.devices}').strip()
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  sys.path.insert(0, ROOT)
  # Imported now that XLA_FLAGS and JAX_PLATFORMS are set: JAX reads them once, at import
  # (and the project's modules import JAX).
  import jax

  import optim
  from configs import shakespeare_char
  from model import ModelConfig
  from training import mesh as mesh_lib, state as state_lib, steps

  config = shakespeare_char.get_config()
  config.model.scan_layers = args.scan_layers
  model_config = ModelConfig.from_config(config.model)
  schedule = optim.make_schedule(config)
  tx = optim.make_optimizer(config, schedule)
  mesh = mesh_lib.make_mesh()
  start = time.perf_counter()
  state = state_lib.create_train_state(model_config, tx, 0, mesh)
  t = config.train
  train_step = steps.jit_train_step(model_config, tx, schedule, mesh,
                                    label_smoothing=t.label_smoothing)
  rng = np.random.default_rng(0)
  shape = (t.batch_size, config.data.max_length + 1)
  batches = [mesh_lib.shard_batch({'targets': rng.integers(1, config.model.vocab_size, shape,
                                                           dtype=np.int32)}, mesh)
             for _ in range(8)]
  state, metrics = train_step(state, batches[0])
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  times = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    for i in range(10):
      state, metrics = train_step(state, batches[i % len(batches)])
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / 10 * 1000)
  print(json.dumps({
      'bench': 'shakespeare_step', 'devices': jax.device_count(),
      'scan_layers': args.scan_layers, 'batch': list(shape),
      'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'jax': jax.__version__,
      'init_and_compile_s': round(first, 2),
      'ms_per_step_median': round(float(np.median(times)), 1),
      'ms_per_step_min': round(min(times), 1), 'ms_per_step_max': round(max(times), 1),
      'tokens_per_s': round(t.batch_size * config.data.max_length / np.median(times) * 1000)}))


if __name__ == '__main__':
  main()
