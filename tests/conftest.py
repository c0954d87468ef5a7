"""Suite-wide settings, applied before any test imports JAX, and the shared trained workdirs.

Tests that compare two computations for equality (cache vs full pass, packed vs alone, 1 vs
8 devices, resume vs straight) must not depend on the backend's default matmul precision:
on GPUs and TPUs a float32 matmul runs by default with TF32/bf16 inputs (relative error
~1e-3), and scatter-add gradients are non-deterministic. So the whole suite (and every
subprocess it starts, which inherits the environment) runs float32 matmuls at full precision
and deterministic GPU ops. Reduced-precision behaviour has its own tests
(tests/model/test_precision.py), which ask for it explicitly.

XLA compiles are most of the suite's time, and many tests and subprocesses compile the same
small programs. One persistent compilation cache is shared by the test process, its xdist
workers and every subprocess (through the environment), and kept from one run to the next
(`TEST_XLA_CACHE_ENV`; `fresh` starts an empty one that the run deletes): a run after the first
on a machine compiles only what changed, 20-30% less CPU for the whole suite. Its key is
the program, the compile options, the devices, XLA_FLAGS and the jax and jaxlib versions, so a
cached program is exactly what compiling again would give, and no result depends on whether
it was cached. JAX deletes the least recently used programs beyond `CACHE_MAX_BYTES`.
The suite's programs are tiny, so XLA:CPU spends far longer optimising them than running them:
the suite compiles without LLVM's optimisation passes, with the classic fusion emitters and
with each program's machine code generated in one piece (XLA splits it to compile the parts on
several threads, which costs more than it saves for programs this small when both cores are
busy anyway) (`SUITE_XLA_FLAGS`; about 3x less CPU time on
tests/decoding/test_decode_speed.py for the first two, 14% less again for the third). Every
comparison in a test is between computations compiled with the same flags; the benchmarks in
bench/ and users' runs keep XLA's defaults.

The two xdist workers keep both cores busy, so a library's own thread pool only competes with
the other worker: torch's and CTranslate2's OpenMP threads spin while they wait for work.
The suite runs them on one thread (`OMP_NUM_THREADS=1`; the CTranslate2 tests also ask for
`intra_threads=1`): tests/hf_export/test_export_hf.py spends ~25% less CPU, the CTranslate2
tests' random models ~60% less, and no result depends on it (XLA's CPU client has its own
pool; the comparisons with torch and CTranslate2 have tolerances that no summation order
reaches).
"""

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest  # (no JAX: nothing imported here may import it before the settings below)

from tests import REPO
from tests.shared_dirs import built_once

# Tests import the project from the checkout, installed or not.
sys.path.insert(0, REPO)

SUITE_MATMUL_PRECISION = 'highest'
DETERMINISTIC_XLA_FLAG = '--xla_gpu_deterministic_ops=true'
SUITE_XLA_FLAGS = (DETERMINISTIC_XLA_FLAG, '--xla_backend_optimization_level=0',
                   '--xla_cpu_use_fusion_emitters=false',
                   '--xla_cpu_parallel_codegen_split_count=1')
# The compilation cache's directory, kept between runs; `fresh`: a new one for this run only.
TEST_XLA_CACHE_ENV = 'TRANSFORMER_JAX_TEST_XLA_CACHE'
# Set by the run's first process to the directory it chose; its xdist workers inherit it.
_RUN_CACHE_ENV = 'TRANSFORMER_JAX_TEST_RUN_XLA_CACHE'
# Programs that compile faster than this are not worth a disk write and read.
CACHE_MIN_COMPILE_SECS = '0.2'
# A whole run writes ~50 MB (bench/results/test_suite.md): room for many versions of the
# code. The limit also turns on JAX's file lock around cache reads and writes: without it a
# process can read an entry another one is still writing, and warn on stderr.
CACHE_MAX_BYTES = str(2 << 30)

# Set by the run's first process once it has checked SUITE_XLA_FLAGS: its workers inherit it.
_FLAGS_CHECKED_ENV = 'TRANSFORMER_JAX_TEST_XLA_FLAGS_CHECKED'


def _flags_this_xla_knows(flags: list[str]) -> list[str]:
  """`flags` less those the installed XLA does not know. XLA aborts a process whose XLA_FLAGS
  name an unknown flag, with no Python error: each xdist worker then dies at its first JAX
  call (jax 0.11.2's XLA dropped a CPU flag that 0.10.2 has). One short probe process says."""
  probe = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'], text=True,
                         env=dict(os.environ, XLA_FLAGS=' '.join(flags)), capture_output=True,
                         check=False)
  if probe.returncode == 0:
    return flags
  named = ' '.join(re.findall(r'Unknown flags? in XLA_FLAGS: (.*)', probe.stderr))
  unknown = {f.partition('=')[0] for f in named.split()}
  kept = [f for f in flags if f.partition('=')[0] not in unknown] if unknown else [
      f for f in flags if f not in SUITE_XLA_FLAGS or f == DETERMINISTIC_XLA_FLAG]
  sys.stderr.write(f'conftest: this XLA refuses {" ".join(sorted(set(flags) - set(kept)))}; '
                   'the suite runs without it\n')
  return kept


os.environ['JAX_DEFAULT_MATMUL_PRECISION'] = SUITE_MATMUL_PRECISION
os.environ.setdefault('OMP_NUM_THREADS', '1')
_flags = [*os.environ.get('XLA_FLAGS', '').split(),
          *(f for f in SUITE_XLA_FLAGS if f not in os.environ.get('XLA_FLAGS', ''))]
if not os.environ.get(_FLAGS_CHECKED_ENV):
  _flags = _flags_this_xla_knows(_flags)
  os.environ[_FLAGS_CHECKED_ENV] = '1'
else:  # a worker: the flags its controller kept, as the environment carries them
  _flags = os.environ.get('XLA_FLAGS', '').split()
os.environ['XLA_FLAGS'] = ' '.join(_flags)


def _kept_cache_dir() -> str | None:
  """The directory kept between runs (TEST_XLA_CACHE_ENV, else the user's cache folder), made
  if need be; None for `fresh` or where it cannot be made (a read-only home)."""
  chosen = os.environ.get(TEST_XLA_CACHE_ENV) or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache'),
      'transformer-jax', 'tests-xla')
  if chosen == 'fresh':
    return None
  chosen = os.path.abspath(os.path.expanduser(chosen))  # subprocesses start in other folders
  try:
    os.makedirs(chosen, exist_ok=True)
  except OSError as e:
    sys.stderr.write(f'conftest: no compilation cache at {chosen} ({e.strerror}); this run '
                     'starts an empty one\n')
    return None
  return chosen


def _run_cache_dir() -> str:
  """This test run's compilation cache directory (chosen here, or by the run's xdist
  controller)."""
  inherited = os.environ.get(_RUN_CACHE_ENV)
  if inherited and os.path.isdir(inherited):
    return inherited
  path = _kept_cache_dir()
  if path is None:
    path = tempfile.mkdtemp(prefix='transformer-jax-tests-xla-cache-')
    atexit.register(shutil.rmtree, path, ignore_errors=True)
  os.environ[_RUN_CACHE_ENV] = path
  return path


XLA_CACHE_DIR = _run_cache_dir()
os.environ['JAX_COMPILATION_CACHE_DIR'] = XLA_CACHE_DIR
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = CACHE_MIN_COMPILE_SECS
os.environ['JAX_COMPILATION_CACHE_MAX_SIZE'] = CACHE_MAX_BYTES

if 'jax' in sys.modules:  # a plugin imported JAX before us: set it there too
  _jax_config = sys.modules['jax'].config
  _jax_config.update('jax_default_matmul_precision', SUITE_MATMUL_PRECISION)
  _jax_config.update('jax_compilation_cache_dir', XLA_CACHE_DIR)
  _jax_config.update('jax_persistent_cache_min_compile_time_secs', float(CACHE_MIN_COMPILE_SECS))
  _jax_config.update('jax_compilation_cache_max_size', int(CACHE_MAX_BYTES))


# ----------------------------------------------------------------------------- scheduling

# xdist (`--dist loadfile --no-loadscope-reorder`, pyproject.toml) hands the files to its two
# workers in collection order as they free up. Its default order, most tests first, left the
# long files of few tests (8-device runs, subprocess scenarios) for the end, one worker
# finishing them while the other idled. The files of ~10 s or more go first, longest first
# (seconds of one worker in a run from the kept compilation cache, as most runs are:
# bench/results/test_suite.md), so that the short rest ends both workers within a few seconds
# of each other.
LONG_FILES = ('test_import_hf.py', 'test_sweeps.py', 'test_decode_cli.py', 'test_robustness.py',
              'test_checkpoint.py', 'test_train_distributed.py', 'test_decode_speed.py',
              'test_robustness_cli.py', 'test_model.py', 'test_decoding.py', 'test_train_cli.py',
              'test_export_hf.py', 'test_guide_snippets.py', 'test_ablation_options.py',
              'test_regularisation_options.py', 'test_sharded_decoding.py', 'test_export_ct2.py',
              'test_decode_engines_bench.py', 'test_export_safety.py', 'test_token_cache.py',
              'test_train_loop.py', 'test_sharding.py', 'test_inference.py',
              'test_attention_impls.py', 'test_input_pipeline.py', 'test_program_cache.py',
              'test_output_files.py', 'test_beam_vs_ctranslate2.py', 'test_attention.py')


def pytest_collection_modifyitems(items) -> None:
  rank = {name: i for i, name in enumerate(LONG_FILES)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))


# ----------------------------------------------------------------------------- shared workdirs


def train_py(workdir, config: str, *overrides: str):
  """`python train.py --config=CONFIG --workdir=WORKDIR OVERRIDES` started (not waited for), on
  the host's CPU devices, output (both streams) on its stdout."""
  from tests.training import test_train_synthetic as syn  # pylint: disable=import-outside-toplevel
  env = dict(os.environ, XLA_FLAGS=syn.xla_flags(),
             PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
  env.setdefault('JAX_PLATFORMS', 'cpu')
  cmd = [sys.executable, os.path.join(REPO, 'train.py'), f'--config={config}',
         f'--workdir={workdir}', *overrides]
  return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _train_workdirs(root) -> dict:
  """Tiny runs of train.py, trained concurrently: translation (2 checkpoints), char LM and one
  with `scan_layers` (stacked layer params). -> {name: workdir, f'{name}_log': its training
  log}. (A checkpoint of an 8-device run decoded on 1 device and on 8: test_sharded_decoding.)"""
  dirs = {name: str(root / name) for name in ('mt', 'lm', 'scan')}
  quick = ['--config.decode.num_eval_sentences=0', '--config.train.num_eval_batches=1']
  procs = {
      'mt': train_py(dirs['mt'], 'configs/default.py:tiny', *quick),
      'lm': train_py(dirs['lm'], 'configs/shakespeare_char.py:tiny', *quick),
      # BLEU on 2 validation sentences at the end: the trainer decodes the scanned model.
      # Two layers each (the preset has one): a scan over one layer would stack nothing.
      'scan': train_py(dirs['scan'], 'configs/default.py:tiny', '--config.model.scan_layers=True',
                       '--config.model.num_encoder_layers=2', '--config.model.num_decoder_layers=2',
                       '--config.train.num_steps=4', '--config.decode.num_eval_sentences=2',
                       '--config.train.num_eval_batches=1'),
  }
  for name, proc in procs.items():
    out, _ = proc.communicate()
    assert proc.returncode == 0, f'training {name} failed:\n{out[-3000:]}'
    dirs[f'{name}_log'] = out
  return dirs


@pytest.fixture(scope='session')
def workdirs(tmp_path_factory) -> dict:
  """The tiny train.py workdirs of `_train_workdirs`, trained once per test run (read-only)."""
  return built_once(tmp_path_factory, 'train_py_workdirs', _train_workdirs)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
  """An xdist worker ends here, its last report sent: its interpreter's shutdown would free
  every program and array of its tests (3-10 s after a full run) while the controller waits,
  then SIGINTs it (execnet, at 5 s: a KeyboardInterrupt traceback in JAX's gc callback) and
  kills it (at 10 s). Nothing of a worker's is left to save: the run's directories belong to
  the controller."""
  del config
  if os.environ.get('PYTEST_XDIST_WORKER'):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access
