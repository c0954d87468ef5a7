"""A synthetic-data stand-in for `input_pipeline` (tests only) and a subprocess runner.

Tasks a tiny model learns in a few steps: copy (encoder-decoder: targets = inputs) and
counting (decoder-only: each token is the previous one + 1). Batches depend only on
(seed, batch index, process index), so the iterator state is just the batch index.

  python -m tests.training.test_train_synthetic WORKDIR '{"kind": ..., "overrides": {...}}'
runs `train_and_evaluate` on it and writes WORKDIR/result.json and WORKDIR/params.npz (and
the runs of the spec's "then" after it, in the same process).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tests import REPO

VOCAB = 32
# Compiled programs are shared between the tests and their subprocesses (XLA compiles are
# most of these tests' time; the cache key is the program, so results are unaffected). Under
# pytest, conftest.py has set both to the suite's cache; run alone, a per-user directory.
CACHE_DIR = os.environ.get('JAX_COMPILATION_CACHE_DIR') or os.path.join(
    __import__('tempfile').gettempdir(), f'transformer-jax-tests-xla-cache-{os.getuid()}')
CACHE_MIN_SECS = float(os.environ.get('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5'))


def _set_cache(directory, min_secs) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', min_secs)
  try:
    from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=import-outside-toplevel
    compilation_cache.reset_cache()
  except (ImportError, AttributeError):
    pass


def enable_compilation_cache() -> None:
  import jax  # pylint: disable=import-outside-toplevel
  if jax.config.jax_compilation_cache_dir != CACHE_DIR:
    _set_cache(CACHE_DIR, CACHE_MIN_SECS)


def compilation_cache_fixture():
  """A module-scoped pytest fixture body: the cache on for this module's tests only."""
  import jax  # pylint: disable=import-outside-toplevel
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  enable_compilation_cache()
  yield
  _set_cache(*before)


def xla_flags(num_devices: int | None = None) -> str:
  """This process's XLA_FLAGS with `num_devices` simulated CPU devices (None: as many as the
  host has): the other flags are kept, as they are part of the compilation cache's key."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count=')]
  if num_devices:
    flags.append(f'--xla_force_host_platform_device_count={num_devices}')
  return ' '.join(flags)


def subprocess_env(num_devices: int | None = 1) -> dict[str, str]:
  env = dict(os.environ)
  env.update(XLA_FLAGS=xla_flags(num_devices),
             JAX_PLATFORMS='cpu', JAX_COMPILATION_CACHE_DIR=CACHE_DIR,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(CACHE_MIN_SECS),
             PYTHONPATH=os.pathsep.join([REPO, env.get('PYTHONPATH', '')]).rstrip(os.pathsep))
  return env


def run_subprocess(workdir: str, spec: dict, num_devices: int = 1):
  """Runs `main` in a fresh Python with `num_devices` CPU devices; -> (CompletedProcess, result)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([sys.executable, '-m', __name__, workdir, json.dumps(spec)],
                        env=subprocess_env(num_devices), capture_output=True, text=True,
                        cwd=REPO)
  path = os.path.join(workdir, 'result.json')
  result = None
  if proc.returncode == 0 and os.path.exists(path):
    with open(path) as f:
      result = json.load(f)
  return proc, result


def load_npz(path: str) -> dict[str, np.ndarray]:
  with np.load(path, allow_pickle=False) as data:
    return {k: data[k] for k in data.files}
ALPHABET = 'abcdefghijklmnopqrstuvwxyz'  # ids 3..28


class Tokenizer:
  vocab_size = VOCAB
  pad_id, eos_id = 0, 1

  def encode(self, text: str, target: bool = False) -> list[int]:
    del target  # one vocabulary for both sides
    return [ALPHABET.index(c) + 3 for c in text] + [1]

  def decode(self, ids) -> str:
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == 1:
        break
      if 3 <= i < 3 + len(ALPHABET):
        out.append(ALPHABET[i - 3])
    return ''.join(out)


def _copy_batch(rng: np.random.Generator, batch: int, length: int) -> dict[str, np.ndarray]:
  inputs = np.zeros((batch, length), np.int32)
  for row in range(batch):
    n = int(rng.integers(2, length))  # tokens before EOS
    inputs[row, :n] = rng.integers(3, 3 + len(ALPHABET), n)
    inputs[row, n] = 1
  return {'inputs': inputs, 'targets': inputs.copy()}


def _count_batch(rng: np.random.Generator, batch: int, length: int,
                 nan: bool = False) -> dict[str, np.ndarray]:
  start = rng.integers(0, len(ALPHABET), (batch, 1))
  targets = (3 + (start + np.arange(length + 1)[None]) % len(ALPHABET)).astype(np.int32)
  weights = np.ones(targets.shape, np.float32)
  if nan:
    weights[:] = np.nan
  return {'targets': targets, 'targets_weights': weights}


class SyntheticIterator:
  def __init__(self, kind: str, batch: int, length: int, seed: int, process_index: int,
               nan_at: int | None = None):
    self.kind, self.batch, self.length = kind, batch, length
    self.seed, self.process_index, self.nan_at = seed, process_index, nan_at
    self.index = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self.index, self.process_index])
    self.index += 1
    if self.kind == 'encoder_decoder':
      return _copy_batch(rng, self.batch, self.length)
    return _count_batch(rng, self.batch, self.length, nan=self.index == self.nan_at)

  def get_state(self) -> dict:
    return {'index': self.index}

  def set_state(self, state: dict) -> None:
    self.index = int(state['index'])


class SyntheticDatasets:
  """Same attributes as `input_pipeline.Datasets` (what the trainer uses)."""

  def __init__(self, config, process_index: int = 0, process_count: int = 1,
               nan_at: int | None = None):
    self.kind = config.model.kind
    self.batch_size = config.train.batch_size // process_count
    self.length = config.data.max_length
    self.process_index = process_index
    self.tokenizer = Tokenizer()
    self.train_iter = SyntheticIterator(self.kind, self.batch_size, self.length,
                                        config.train.seed, process_index, nan_at)

  def eval_batches(self, split=None):
    del split
    it = SyntheticIterator(self.kind, self.batch_size, self.length, 12345, self.process_index)
    return iter([next(it), next(it)])

  def eval_examples(self, split=None):
    del split
    rng = np.random.default_rng(7)
    words = [''.join(rng.choice(list(ALPHABET), int(rng.integers(2, 6)))) for _ in range(8)]
    return [{'source': w, 'target': w} for w in words]


def tiny_config(kind: str = 'encoder_decoder', **overrides):
  """The tiny presets shrunk further, on synthetic data; overrides: {'train.num_steps': 4}."""
  from configs import default, shakespeare_char  # pylint: disable=import-outside-toplevel
  if kind == 'encoder_decoder':
    config = default.get_config('tiny')
    config.model.num_encoder_layers = config.model.num_decoder_layers = 1
    config.data.max_length = 12
  else:
    config = shakespeare_char.get_config('tiny')
    config.model.num_decoder_layers = 1
    config.data.max_length = 12
  config.model.vocab_size = config.data.vocab_size = VOCAB
  config.model.max_len = 16
  config.model.d_model, config.model.d_ff, config.model.num_heads = 32, 64, 2
  t = config.train
  t.batch_size, t.num_steps = 8, 6
  t.log_every_steps = t.checkpoint_every_steps = 3
  t.eval_every_steps = 1000
  t.num_eval_batches = 2
  config.optimizer.warmup_steps = 3
  config.decode.max_new_tokens = 8
  config.decode.num_eval_sentences = 0
  return set_fields(config, overrides)


def set_fields(config, overrides: dict):
  """`config` with dotted fields set: {'train.num_steps': 4, 'mesh.fsdp': 2}."""
  for dotted, value in overrides.items():
    node = config
    *path, last = dotted.split('.')
    for key in path:
      node = node[key]
    node[last] = value
  return config


def _params_npz(params, path: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel

  from training import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  flat = jax.tree_util.tree_flatten_with_path(mesh_lib.to_host(params))[0]
  arrays = {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}
  np.savez(path, **arrays)


def run(workdir: str, kind: str = 'encoder_decoder', overrides: dict | None = None,
        nan_at: int | None = None) -> dict:
  """Trains on synthetic data; returns the summary (+ 'losses' {step: loss})."""
  import jax  # pylint: disable=import-outside-toplevel

  from training import trainer  # pylint: disable=import-outside-toplevel
  config = tiny_config(kind, **(overrides or {}))
  datasets = SyntheticDatasets(config, jax.process_index(), jax.process_count(), nan_at)
  return trainer.train_and_evaluate(config, workdir, datasets=datasets)


def restore_full_state(workdir: str, kind: str = 'encoder_decoder', overrides=None,
                       mesh_config=None):
  """The whole TrainState of `workdir`'s newest checkpoint on a mesh of all devices here
  (`mesh_config`: {'data': .., 'fsdp': .., 'tensor': ..}; default: all on 'data')."""
  import optim  # pylint: disable=import-outside-toplevel
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib, state as state_lib  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  config = tiny_config(kind, **(overrides or {}))
  tx = optim.make_optimizer(config)
  abstract = state_lib.abstract_train_state(ModelConfig.from_config(config.model), tx,
                                            mesh_lib.make_mesh(mesh_config=mesh_config))
  checkpointer = checkpoint.Checkpointer(workdir, max_to_keep=config.train.max_checkpoints)
  state, _, _ = checkpointer.restore(abstract)
  checkpointer.close()
  return state


def main(argv: list[str]) -> None:
  """`WORKDIR SPEC`: one run; SPEC's 'then' ([[workdir, spec], ...]) are more runs after it, in
  the same interpreter (one start-up for all)."""
  workdir, spec = argv[1], json.loads(argv[2])
  enable_compilation_cache()
  if spec.get('coordinator'):
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=spec['coordinator'],
                               num_processes=spec['num_processes'], process_id=spec['process_id'])
  for run_workdir, run_spec in [(workdir, spec), *spec.get('then', ())]:
    _run_and_write(run_workdir, run_spec)


def _run_and_write(workdir: str, spec: dict) -> None:
  """One run of `main`: WORKDIR/result.json, params.npz (and restored.npz)."""
  summary = run(workdir, spec.get('kind', 'encoder_decoder'), spec.get('overrides'),
                spec.get('nan_at'))
  import jax  # pylint: disable=import-outside-toplevel
  suffix = f'.{jax.process_index()}' if jax.process_count() > 1 else ''
  if spec.get('restore_from'):  # another workdir's checkpoint, on this many devices
    restored = restore_full_state(spec['restore_from'], spec.get('kind', 'encoder_decoder'),
                                  spec.get('overrides'), spec.get('restore_mesh'))
    _params_npz(restored.params, os.path.join(workdir, f'restored{suffix}.npz'))
  _params_npz(summary['state'].params, os.path.join(workdir, f'params{suffix}.npz'))
  result = {k: v for k, v in summary.items() if k != 'state'}
  result['num_devices'] = jax.device_count()
  with open(os.path.join(workdir, f'result{suffix}.json'), 'w') as f:
    json.dump(result, f)


if __name__ == '__main__':
  import common.command_line  # noqa: F401  (before JAX and flax: a command line's start)
  main(sys.argv)
