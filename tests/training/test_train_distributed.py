"""Data parallelism: 1 vs 8 simulated devices, checkpoints across device counts, 2 processes.

The runs on 8 devices share one process, and so do the runs on 2 processes x 2 devices (the
synthetic runner's 'then': one interpreter and JAX start-up for several runs)."""

import json
import os
import socket
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest

from tests.training import test_train_synthetic as syn
from workdir import checkpoint

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

OVERRIDES = {'train.num_steps': 6, 'train.checkpoint_every_steps': 3, 'train.log_every_steps': 3}


def _flat(tree):
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _assert_same(a: dict, b: dict, **tolerance):
  assert sorted(a) == sorted(b)
  for key in a:
    if tolerance:
      np.testing.assert_allclose(a[key], b[key], err_msg=key, **tolerance)
    else:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope='module')
def one_device_run(tmp_path_factory):
  """The 1-device reference run -> (workdir, {'losses': {step: loss}, 'best_eval_loss',
  'params': flat parameters}): in process where this host has one CPU device, else (several
  devices, or an accelerator) in a 1-device CPU subprocess, the backend of the 8-device and
  2-process runs, so that the comparisons hold on any host."""
  workdir = str(tmp_path_factory.mktemp('one'))
  if jax.device_count() == 1 and jax.default_backend() == 'cpu':
    summary = syn.run(workdir, 'encoder_decoder', OVERRIDES)
    return workdir, {'losses': summary['losses'], 'best_eval_loss': summary['best_eval_loss'],
                     'params': _flat(summary['state'].params)}
  proc, result = syn.run_subprocess(workdir, {'overrides': OVERRIDES}, num_devices=1)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return workdir, {'losses': {int(k): v for k, v in result['losses'].items()},
                   'best_eval_loss': result['best_eval_loss'],
                   'params': syn.load_npz(os.path.join(workdir, 'params.npz'))}


SHARDED = {**OVERRIDES, 'model.num_heads': 4, 'mesh.data': 2, 'mesh.fsdp': 4}


@pytest.fixture(scope='module')
def eight_device_runs(one_device_run, tmp_path_factory):
  """The runs on 8 devices, in one process: OVERRIDES (same config, same global batch as
  `one_device_run`; also restores its checkpoint), then
  `test_fsdp_checkpoint_restores_on_any_mesh_and_resumes_bitwise`'s three runs. -> (stdout,
  {name: workdir})."""
  dirs = {name: str(tmp_path_factory.mktemp(name)) for name in ('eight', 'whole', 'split')}
  then = [[dirs['whole'], {'overrides': SHARDED}],
          [dirs['split'], {'overrides': {**SHARDED, 'train.num_steps': 3}}],
          [dirs['split'], {'overrides': SHARDED, 'restore_from': dirs['whole'],
                           'restore_mesh': {'data': 1, 'fsdp': 2, 'tensor': 4}}]]
  proc, _ = syn.run_subprocess(
      dirs['eight'], {'overrides': OVERRIDES, 'restore_from': one_device_run[0], 'then': then},
      num_devices=8)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout, dirs


@pytest.fixture(scope='module')
def eight_device_run(eight_device_runs):
  """Same config, same global batch on 8 devices; also restores the 1-device checkpoint."""
  stdout, dirs = eight_device_runs
  assert 'mesh (data=8, fsdp=1, tensor=1) over 8 cpu device(s)' in stdout
  with open(os.path.join(dirs['eight'], 'result.json')) as f:
    return dirs['eight'], json.load(f)


def test_one_and_eight_devices_give_the_same_loss_curve(one_device_run, eight_device_run):
  _, one = one_device_run
  _, eight = eight_device_run
  assert eight['num_devices'] == 8
  steps = sorted(one['losses'])
  assert steps == [int(s) for s in sorted(eight['losses'], key=int)] == list(range(1, 7))
  np.testing.assert_allclose([eight['losses'][str(s)] for s in steps],
                             [one['losses'][s] for s in steps], rtol=2e-5)
  np.testing.assert_allclose(eight['best_eval_loss'], one['best_eval_loss'], rtol=2e-5)


def test_checkpoint_from_one_device_restores_on_eight(one_device_run, eight_device_run):
  _, one = one_device_run
  workdir, _ = eight_device_run
  _assert_same(syn.load_npz(os.path.join(workdir, 'restored.npz')), one['params'])


def test_checkpoint_from_eight_devices_restores_on_one(eight_device_run):
  workdir, _ = eight_device_run
  trained = syn.load_npz(os.path.join(workdir, 'params.npz'))
  # The whole TrainState on this host's devices (one on a CPU test host).
  state = syn.restore_full_state(workdir, overrides=OVERRIDES)
  assert int(state.step) == 6
  _assert_same(_flat(state.params), trained)
  params, step = checkpoint.restore_params(workdir)
  assert step == 6
  _assert_same(_flat(params), trained)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


# What the coordinator says when another program took the free port between `_free_port`
# releasing it and the coordinator binding it (a race no port choice avoids): start again.
_PORT_TAKEN = ('address already in use', 'failed to add port', 'failed to bind')


def _run_two_processes(runs: list[tuple[str, dict]], attempts: int = 3) -> list[str]:
  """jax.distributed on 127.0.0.1 with gloo CPU collectives; 2 processes x 2 devices, which
  make the runs `[(workdir, overrides), ...]` one after the other. -> each process's output."""
  for attempt in range(attempts):
    procs, outputs = _start_two_processes(runs, _free_port())
    taken = any(proc.returncode and any(m in out.lower() for m in _PORT_TAKEN)
                for proc, out in zip(procs, outputs, strict=True))
    if not taken or attempt == attempts - 1:
      break
  for proc, out in zip(procs, outputs, strict=True):
    assert proc.returncode == 0, out[-4000:]
  return outputs


def _start_two_processes(runs: list[tuple[str, dict]], port: int):
  """The two processes, their coordinator on `port`, waited for -> (processes, outputs).

  Each writes to a file, not a pipe: the processes wait for each other in collectives, so
  one blocked on a full pipe (64 KB of output: JAX_LOG_COMPILES, a new version's warnings)
  while the test waits for the other would hang both for ever."""
  procs, files = [], []
  (workdir, overrides), *later = runs
  try:
    for i in range(2):
      spec = {'overrides': overrides, 'coordinator': f'127.0.0.1:{port}', 'num_processes': 2,
              'process_id': i, 'then': [[w, {'overrides': o}] for w, o in later]}
      files.append(tempfile.TemporaryFile('w+'))  # pylint: disable=consider-using-with
      procs.append(subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, '-m', syn.__name__, workdir, json.dumps(spec)],
          env=syn.subprocess_env(2), stdout=files[-1], stderr=subprocess.STDOUT, text=True,
          cwd=syn.REPO))
    for proc in procs:
      proc.wait()
    outputs = []
    for file in files:
      file.seek(0)
      outputs.append(file.read())
  finally:
    for proc in procs:
      proc.kill()
    for file in files:
      file.close()
  return procs, outputs


FSDP_OVER_PROCESSES = {**OVERRIDES, 'mesh.data': 1, 'mesh.fsdp': 4}


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory, one_device_run):
  """Data parallelism over 2 processes x 2 devices (each process makes its own data); then, in
  the same processes, `test_two_processes_train_with_fsdp_across_them`'s run. -> (workdir,
  outputs, the FSDP run's workdir)."""
  workdir, fsdp = (str(tmp_path_factory.mktemp(name)) for name in ('two', 'two_fsdp'))
  outputs = _run_two_processes([(workdir, OVERRIDES), (fsdp, FSDP_OVER_PROCESSES)])
  return workdir, outputs, fsdp


def test_two_processes_agree_on_the_loss(two_process_run):
  workdir, outputs, _ = two_process_run
  results = []
  for i in range(2):
    with open(os.path.join(workdir, f'result.{i}.json')) as f:
      results.append(json.load(f))
  assert results[0]['num_devices'] == results[1]['num_devices'] == 4
  assert results[0]['losses'] == results[1]['losses']
  assert len(results[0]['losses']) == 6
  assert results[0]['losses']['6'] < results[0]['losses']['1']
  # Only process 0 logs; the checkpoint holds both processes' data iterator states.
  assert 'step 6/6' in outputs[0] and 'step 6/6' not in outputs[1]
  assert checkpoint.list_steps(workdir) == [3, 6]
  with open(os.path.join(checkpoint.checkpoint_dir(workdir), '6', 'data', 'metadata')) as f:
    # Several processes write no checksums.json (each would hash only its own files).
    assert json.load(f) == {'process_count': 2, 'states': [{'index': 6}, {'index': 6}],
                            'checksums': None}
  # The 2-process checkpoint restores in one process.
  params, _ = checkpoint.restore_params(workdir)
  _assert_same(_flat(params), syn.load_npz(os.path.join(workdir, 'params.0.npz')))


# -- FSDP and tensor parallelism: checkpoints across meshes, two processes --------------------

def test_fsdp_checkpoint_restores_on_any_mesh_and_resumes_bitwise(eight_device_runs):
  """A (2,4,1) run's checkpoint restores on 1 device and on (1,2,4); a run stopped at step 3
  and resumed on (2,4,1) ends bitwise equal to the uninterrupted one (CPU). (The three runs
  are `eight_device_runs`': whole, split to step 3, split resumed with whole restored.)"""
  stdout, dirs = eight_device_runs
  whole, split = dirs['whole'], dirs['split']
  assert 'mesh (data=2, fsdp=4, tensor=1) over 8 cpu device(s)' in stdout
  assert 'parameters and optimizer state sharded over fsdp' in stdout
  trained = syn.load_npz(os.path.join(whole, 'params.npz'))
  _assert_same(syn.load_npz(os.path.join(split, 'params.npz')), trained)
  _assert_same(syn.load_npz(os.path.join(split, 'restored.npz')), trained)
  state = syn.restore_full_state(whole, overrides=SHARDED)  # this host's devices, Adam too
  assert int(state.step) == 6
  _assert_same(_flat(state.params), trained)
  params, step = checkpoint.restore_params(workdir=whole)
  assert step == 6
  _assert_same(_flat(params), trained)


def test_two_processes_train_with_fsdp_across_them(two_process_run):
  """2 processes x 2 devices, mesh (1, 4, 1): each parameter is split over both processes'
  devices. Same losses as data parallelism on the same processes (the same global batches);
  the checkpoint restores in one process. (The run is `two_process_run`'s second.)"""
  _, outputs, workdir = two_process_run
  assert 'mesh (data=1, fsdp=4, tensor=1) over 4 cpu device(s) in 2 process(es)' in outputs[0]
  losses = []
  for run in (workdir, two_process_run[0]):
    with open(os.path.join(run, 'result.0.json')) as f:
      curve = json.load(f)['losses']
    losses.append([curve[str(s)] for s in range(1, 7)])
  np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5)
  assert checkpoint.list_steps(workdir) == [3, 6]
  params, _ = checkpoint.restore_params(workdir)
  _assert_same(_flat(params), syn.load_npz(os.path.join(workdir, 'params.0.npz')))
  _assert_same(syn.load_npz(os.path.join(workdir, 'params.1.npz')),
               syn.load_npz(os.path.join(workdir, 'params.0.npz')))
