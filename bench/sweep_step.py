"""The training step's cost of each row of a sweep, measured in one process: the "cost in time
per step" of an ablation, as a ratio that another machine can reproduce.

    python bench/sweep_step.py --sweep=configs/sweeps/ladder_multi30k.py
    python bench/sweep_step.py --sweep=configs/sweeps/final_multi30k.py --steps=60

Each row's real train step (`training/steps.py: jit_train_step` with the row's resolved config:
its model, optimizer, schedule and loss terms, exactly as train.py builds them) runs on the
same random batches of the config's shape (ids in [3, vocab), the pipeline's packed layout
with one segment per row). The rows are timed in rounds, one step of each per round, so that
a drift of the machine's speed (another process, a frequency change) falls on every row
alike. A sweep's runs report their own `train/step_ms`, but each run at its own time; this
is the comparison.

Prints one JSON object: per row, the median, p10 and p90 ms/step, and the median's ratio to
the baseline row's (the sweep's `baseline`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import optim  # noqa: E402
from configs import resolve  # noqa: E402
from experiments import sweep_file  # noqa: E402
from model.kinds import adapter_of  # noqa: E402
from training import config_check, mesh as mesh_lib, state as state_lib, steps  # noqa: E402


def row_configs(path: str) -> tuple[dict, str]:
  """(row -> its resolved config (seed 0's command line, parsed as train.py parses it), the
  baseline row) of the sweep file at `path`."""
  with tempfile.TemporaryDirectory() as root:
    plan = sweep_file.plan(sweep_file.load(path), root, path)
  first = {}
  for run in plan.runs:
    first.setdefault(run.row, run)
  return ({row: _command_line_config(run.args[0].split('=', 1)[1], list(run.args[2:]))
           for row, run in first.items()}, plan.baseline)


def _command_line_config(spec: str, args: list[str]):
  """The config train.py resolves from `--config=SPEC ARGS...`."""
  return resolve.resolve(spec, resolve.parse_command_line(spec, args))[0]


def batch_of(config, model_config, seed: int = 0) -> dict:
  """Random ids of the config's train batch shape; packed fields as one segment per row."""
  shapes = adapter_of(model_config).train_batch_shapes(
      config.train.batch_size, config.data.max_length, bool(config.data.get('packing', False)))
  rng = np.random.default_rng(seed)
  batch = {}
  for name, (shape, dtype) in shapes.items():
    if name.endswith('_segmentation'):
      value = np.ones(shape)
    elif name.endswith('_position'):
      value = np.broadcast_to(np.arange(shape[1]), shape)
    else:
      value = rng.integers(3, model_config.vocab_size, shape)
    batch[name] = jnp.asarray(value, dtype)
  return batch


def step_runner(config):
  """A closure running one train step of `config` (its state kept), and its parameter count."""
  model_config = config_check.validate_config(config, num_devices=1)
  mesh = mesh_lib.make_mesh(1)
  schedule = optim.make_schedule(config)
  tx = optim.make_optimizer(config, schedule)
  state = jax.jit(state_lib.make_init_fn(model_config, tx))(state_lib.seed_key(0))
  step = steps.jit_train_step(model_config, tx, schedule, mesh,
                              label_smoothing=config.train.label_smoothing,
                              grad_accum_steps=config.train.grad_accum_steps,
                              z_loss=config.train.get('z_loss', 0.0),
                              rdrop_alpha=config.train.get('rdrop_alpha', 0.0))
  batch = mesh_lib.shard_batch(batch_of(config, model_config), mesh)
  holder = {'state': state}

  def run():
    holder['state'], metrics = step(holder['state'], batch)
    return metrics['loss']
  return run, sum(int(x.size) for x in jax.tree.leaves(state.params))


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo), else what platform knows."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--sweep', required=True, help='a sweep file (configs/sweeps/NAME.py)')
  parser.add_argument('--steps', type=int, default=40, help='timed steps per row (after 3 '
                      'warm-up steps each)')
  args = parser.parse_args()
  try:
    configs, baseline = row_configs(args.sweep)
  except sweep_file.SweepError as e:
    sys.exit(f'sweep_step.py: error: {e}')
  runners, params = {}, {}
  for row, config in configs.items():
    runners[row], params[row] = step_runner(config)
    for _ in range(3):  # compile, then settle
      jax.block_until_ready(runners[row]())
  times = {row: [] for row in runners}
  for _ in range(args.steps):
    for row, run in runners.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      times[row].append((time.perf_counter() - start) * 1e3)
  base = float(np.median(times[baseline]))
  rows = {row: {'ms_per_step_median': round(float(np.median(ms)), 1),
                'ms_p10': round(float(np.percentile(ms, 10)), 1),
                'ms_p90': round(float(np.percentile(ms, 90)), 1),
                'ratio_to_baseline': round(float(np.median(ms)) / base, 3),
                'parameters': params[row]} for row, ms in times.items()}
  print(json.dumps({'sweep': args.sweep, 'baseline': baseline, 'steps': args.steps,
                    'backend': jax.default_backend(), 'devices': jax.device_count(),
                    'cpu': cpu_name(), 'cpu_count': os.cpu_count(),
                    'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                    'rows': rows}, indent=2))


if __name__ == '__main__':
  main()
