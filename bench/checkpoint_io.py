"""What checkpoint checksums cost: save and restore of a model's train state, with and without.

    python bench/checkpoint_io.py [--config=base] [--repeats=2]

Saves the whole train state (params + Adam moments + step + RNG) of `configs/wmt14_<config>`
(the paper's base model by default, 63M parameters, ~760 MB) with `workdir.checkpoint.
Checkpointer` into two workdirs, one with checksums (the default) and one without, then
restores each (the trainer's full-state restore and decode.py's `restore_params`). The two
variants alternate `--repeats` times in one process; the best time of each is kept. Prints
one JSON object with the seconds and the ratios with/without:
  save_blocking   the `save()` call (what the training loop waits for)
  save_total      `save()` + `wait()` (the background write, where the checksums are computed)
  restore         `Checkpointer.restore` of the full state (checksums verified first)
  restore_params  `restore_params` (params only; verifies every file of the state)
and, measured alone on the same files, `checksum_write` / `checksum_verify` seconds and their
share of `save_total` / `restore` without checksums.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
from absl import logging

import optim
from configs import wmt14_base, wmt14_big
from model import ModelConfig
from training import mesh as mesh_lib, state as state_lib
from workdir import checkpoint, checkpoint_files

PRESETS = {'base': wmt14_base, 'big': wmt14_big}


def _state(config):
  """A train state as after training: Adam's moments are zeros at initialisation (which zstd
  shrinks to nothing on disk), so every float array gets random values."""
  model_config = ModelConfig.from_config(config.model)
  tx = optim.make_optimizer(config)
  mesh = mesh_lib.make_mesh()
  state = state_lib.create_train_state(model_config, tx, config.train.seed, mesh)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  leaves = [jax.random.normal(k, x.shape, x.dtype) * 0.02
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x
            for k, x in zip(keys, leaves, strict=True)]
  state = jax.tree.unflatten(treedef, leaves)
  abstract = state_lib.abstract_train_state(model_config, tx, mesh)
  return state, abstract


def _once(root, state, abstract, checksums: bool, step: int) -> dict[str, float]:
  workdir = os.path.join(root, f'{"with" if checksums else "without"}_{step}')
  times = {}
  checkpointer = checkpoint.Checkpointer(workdir, checksums=checksums)
  start = time.perf_counter()
  checkpointer.save(step, state, {'index': step})
  times['save_blocking'] = time.perf_counter() - start
  checkpointer.wait()
  times['save_total'] = time.perf_counter() - start
  start = time.perf_counter()
  restored, _, _ = checkpointer.restore(abstract)
  jax.block_until_ready(restored)
  times['restore'] = time.perf_counter() - start
  checkpointer.close()
  del restored
  if checksums:  # the hashing alone, on the same files (steadier than differences of totals)
    directory = checkpoint.step_dir(workdir, step)
    start = time.perf_counter()
    checkpoint_files.write_checksums(directory)
    times['checksum_write'] = time.perf_counter() - start
    start = time.perf_counter()
    assert checkpoint_files.verify_checksums(directory) is None
    times['checksum_verify'] = time.perf_counter() - start
    times['bytes_on_disk'] = checkpoint_files.tree_size(directory)
  start = time.perf_counter()
  params, _ = checkpoint.restore_params(workdir)
  jax.block_until_ready(params)
  times['restore_params'] = time.perf_counter() - start
  shutil.rmtree(workdir)
  return times


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', choices=sorted(PRESETS), default='base')
  parser.add_argument('--repeats', type=int, default=2)
  args = parser.parse_args()
  logging.set_verbosity(logging.ERROR)  # Orbax's read-only notices
  config = PRESETS[args.config].get_config()
  state, abstract = _state(config)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  best = {True: {}, False: {}}
  with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_DIR')) as root:
    for repeat in range(args.repeats):
      for checksums in (False, True):
        for name, value in _once(root, state, abstract, checksums, repeat + 1).items():
          best[checksums][name] = min(value, best[checksums].get(name, float('inf')))
  with_, without = best[True], best[False]
  on_disk = with_.pop('bytes_on_disk')
  result = {
      'config': args.config, 'state_mb': round(nbytes / 2**20, 1),
      'checkpoint_mb_on_disk': round(on_disk / 2**20, 1), 'repeats': args.repeats,
      'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs',
      'seconds_with_checksums': {k: round(v, 3) for k, v in with_.items()},
      'seconds_without': {k: round(v, 3) for k, v in without.items()},
      'ratio_with_over_without': {k: round(with_[k] / without[k], 3) for k in without},
      'hashing_share': {
          'checksum_write_over_save_total':
              round(with_['checksum_write'] / without['save_total'], 3),
          'checksum_verify_over_restore': round(with_['checksum_verify'] / without['restore'], 3),
          'checksum_verify_over_restore_params': round(
              with_['checksum_verify'] / without['restore_params'], 3)},
  }
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
