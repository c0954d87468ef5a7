"""Checkpoints: damaged-checkpoint fallback and exact resume, params-only restore, signals."""

import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.training import test_train_synthetic as syn
from workdir import checkpoint

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

STRAIGHT = {'train.num_steps': 6, 'train.checkpoint_every_steps': 3, 'train.log_every_steps': 3}


def _assert_trees_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def straight_run(tmp_path_factory):
  """6 steps without interruption (checkpoints at 3 and 6), with dropout."""
  workdir = str(tmp_path_factory.mktemp('straight'))
  summary = syn.run(workdir, 'encoder_decoder', STRAIGHT)
  return workdir, summary


def test_restore_params_and_average(straight_run):
  workdir, straight = straight_run
  assert checkpoint.list_steps(workdir) == [3, 6]
  params, step = checkpoint.restore_params(workdir)
  assert step == 6
  _assert_trees_equal(params, straight['state'].params)
  p3, _ = checkpoint.restore_params(workdir, step=3)
  averaged, step = checkpoint.restore_params(workdir, average_last=2)
  assert step == 6
  jax.tree.map(lambda a, x, y: np.testing.assert_allclose(a, (x + y) / 2, rtol=1e-6, atol=1e-7),
               averaged, p3, params)
  leaf = jax.tree.leaves(params)[0]
  assert leaf.sharding.device_set == {jax.local_devices()[0]}


def test_a_params_only_checkpoint_starts_a_run_as_a_full_step_0_state_did(straight_run,
                                                                          tmp_path):
  """`save_params` (what an import writes): decode.py reads it as any checkpoint, the trainer's
  restore gives `ParamsOnly`, and a run started from it is bitwise the run started from a full
  step-0 train state holding those parameters (what imports wrote before)."""
  import optim  # pylint: disable=import-outside-toplevel
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib, state as state_lib  # pylint: disable=import-outside-toplevel
  params, _ = checkpoint.restore_params(straight_run[0])  # trained: not the run's own init
  only, full = str(tmp_path / 'only'), str(tmp_path / 'full')
  checkpoint.save_params(only, params)
  config = syn.tiny_config('encoder_decoder', **STRAIGHT)
  tx = optim.make_optimizer(config)
  model_config, mesh = ModelConfig.from_config(config.model), mesh_lib.make_mesh()
  saver = checkpoint.Checkpointer(full, async_save=False)
  saver.save(0, state_lib.create_train_state(model_config, tx, config.train.seed, mesh,
                                             params=params), None)
  saver.close()
  _assert_trees_equal(checkpoint.restore_params(only)[0], params)
  reader = checkpoint.Checkpointer(only)
  found, data, step = reader.restore(state_lib.abstract_train_state(model_config, tx, mesh))
  reader.close()
  assert isinstance(found, checkpoint.ParamsOnly) and (data, step) == (None, 0)
  _assert_trees_equal(found.params, params)
  runs = [syn.run(w, 'encoder_decoder', STRAIGHT) for w in (only, full)]
  assert runs[0]['losses'] == runs[1]['losses']
  _assert_trees_equal(runs[0]['state'].params, runs[1]['state'].params)


def test_restore_params_errors(straight_run, tmp_path):
  workdir, _ = straight_run
  with pytest.raises(checkpoint.CheckpointError, match='no checkpoint in'):
    checkpoint.restore_params(str(tmp_path))
  with pytest.raises(checkpoint.CheckpointError, match=r'step 5 .*available: \[3, 6\]'):
    checkpoint.restore_params(workdir, step=5)
  with pytest.raises(checkpoint.CheckpointError, match='average_last=3 needs 3'):
    checkpoint.restore_params(workdir, average_last=3)


def test_incompatible_checkpoint_is_a_clear_error(straight_run):
  workdir, _ = straight_run
  with pytest.raises(checkpoint.CheckpointError, match=r'does not fit the model: params/'):
    syn.restore_full_state(workdir, overrides={'model.d_ff': 128})


def test_a_checkpoint_of_version_0_1_is_refused_in_one_line(tmp_path):
  """Version 0.1's Linen parameter names (`layer_0`, `norm/LayerNorm_0`): resuming and
  restoring for decoding both refuse it, naming the version, and delete nothing."""
  workdir = str(tmp_path / 'old')
  v01 = {'encoder': {'layer_0': {'attention_block': {'norm': {'LayerNorm_0': {
      'scale': np.ones(4, np.float32)}}}}}}
  old = checkpoint.Checkpointer(workdir)
  old.save(3, {'params': v01, 'step': np.int32(3)}, {'position': 0})
  old.close()
  with pytest.raises(checkpoint.CheckpointError, match=r'checkpoint 3 in .* was written by '
                     r'version 0\.1 .*cannot restore it'):
    checkpoint.restore_params(workdir)
  with pytest.raises(checkpoint.CheckpointError, match=r'version 0\.1'):
    syn.restore_full_state(workdir)
  assert checkpoint.list_steps(workdir) == [3]


def _damage(step_dir):
  for root, _, files in os.walk(os.path.join(step_dir, 'state')):
    for name in files:
      with open(os.path.join(root, name), 'wb') as f:
        f.write(b'garbage')


def test_damaged_latest_checkpoint_falls_back(straight_run, tmp_path, capsys):
  source, straight = straight_run
  workdir = str(tmp_path / 'w')
  shutil.copytree(source, workdir)
  ckpt_dir = checkpoint.checkpoint_dir(workdir)
  _damage(os.path.join(ckpt_dir, '6'))
  # A save killed mid-write leaves only a temporary directory: never listed, cleaned up.
  os.makedirs(os.path.join(ckpt_dir, '6.orbax-checkpoint-tmp', 'state.orbax-checkpoint-tmp'))
  os.makedirs(os.path.join(ckpt_dir, '9.orbax-checkpoint-tmp', 'state'))
  assert checkpoint.list_steps(workdir) == [3, 6]

  params, step = checkpoint.restore_params(workdir)
  assert step == 3
  assert 'checkpoint 6' in capsys.readouterr().err
  expected, _ = checkpoint.restore_params(source, step=3)
  _assert_trees_equal(params, expected)

  # The trainer resumes from step 3 (warning, damaged step removed) and redoes 4..6 exactly:
  # the same losses, and bitwise the same params, optimizer state, step and RNG (CPU). (This
  # is the in-process exact resume, with dropout; a test of its own resumed a 3-step run the
  # same way. That a run's schedule does not read num_steps, so that a run stopped early
  # resumes exactly, is test_train_cli's end-to-end test, through train.py.)
  resumed = syn.run(workdir, 'encoder_decoder', STRAIGHT)
  err = capsys.readouterr().err
  assert 'checkpoint 6 is' in err and 'trying the previous one' in err
  assert sorted(resumed['losses']) == [4, 5, 6]
  assert [resumed['losses'][s] for s in (4, 5, 6)] == [straight['losses'][s] for s in (4, 5, 6)]
  _assert_trees_equal(resumed['state'], straight['state'])
  assert checkpoint.list_steps(workdir) == [3, 6]
  assert sorted(os.listdir(ckpt_dir)) == ['3', '6']
  _assert_trees_equal(checkpoint.restore_params(workdir)[0], straight['state'].params)


def _start(workdir, overrides):
  spec = {'kind': 'encoder_decoder', 'overrides': overrides}
  import json
  return subprocess.Popen([sys.executable, '-m', syn.__name__, workdir, json.dumps(spec)],
                          env=syn.subprocess_env(1), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=syn.REPO)


def _wait_for(proc, pattern):
  """`proc`'s lines up to the first holding `pattern`; a run that ends before it fails the
  test with what it printed. No time limit: a loaded machine is slow, not wrong."""
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if pattern in line:
      return lines
  proc.kill()
  raise AssertionError(f'{pattern!r} not seen before the run ended:\n{"".join(lines)}')


def test_sigterm_saves_and_sigkill_loses_only_recent_steps(tmp_path):
  workdir = str(tmp_path)
  overrides = {'train.num_steps': 100_000, 'train.checkpoint_every_steps': 5,
               'train.log_every_steps': 1}
  proc = _start(workdir, overrides)
  _wait_for(proc, 'step 7/')
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate()[0]
  assert proc.returncode == 0, out
  assert 'stopped by SIGTERM at step' in out
  stopped_at = int(out.split('stopped by SIGTERM at step ')[1].split(';')[0])
  assert stopped_at >= 7 and checkpoint.list_steps(workdir)[-1] == stopped_at

  # Resume, then SIGKILL at some moment: only the steps after the last checkpoint are lost.
  proc = _start(workdir, overrides)
  lines = _wait_for(proc, f'step {stopped_at + 6}/')
  assert any(f'resumed from the checkpoint at step {stopped_at}' in line for line in lines)
  proc.kill()
  proc.communicate()
  steps = checkpoint.list_steps(workdir)
  assert steps[-1] >= stopped_at
  params, step = checkpoint.restore_params(workdir)
  assert step == steps[-1] or step == steps[-2]
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


_ABANDONED_TASKS = '''
import asyncio, gc, os, threading
from absl import logging as _  # the CLIs' handler on the root logger
from workdir import orbax_noise

def orbax_loop():  # a loop created by Orbax's code (the file name is what tells)
  namespace = {'asyncio': asyncio}
  exec(compile('loop = asyncio.new_event_loop()',
               os.path.join(os.sep, 'site', 'orbax', 'asyncio_utils.py'), 'exec'), namespace)
  return namespace['loop']

async def fail(where):
  raise ValueError(f'lost error {where}')

async def wait_forever():
  await asyncio.get_running_loop().create_future()

class WakesAClosedLoop:  # as TensorStore's late callbacks do (an unraisable RuntimeError)
  def __init__(self, loop):
    self.loop = loop
  def __del__(self):
    self.loop.call_soon(print)

def wake_from_a_thread(loop):  # a thread that dies waking a closed loop
  thread = threading.Thread(target=loop.call_soon_threadsafe, args=(print,))
  thread.start()
  thread.join()

closed = asyncio.new_event_loop()
closed.close()
WakesAClosedLoop(closed)  # before any abandoned Orbax work: reported
wake_from_a_thread(closed)  # reported too
with orbax_noise.quiet_orbax_logs():  # our restore call; Orbax gives up on a damaged read
  orbax = orbax_loop()
  abandoned = [orbax.create_task(fail('of an abandoned Orbax loop')),
               orbax.create_task(wait_forever()), orbax.create_future()]
  abandoned[2].set_exception(ValueError('lost error of an abandoned Orbax loop'))
  orbax.run_until_complete(asyncio.sleep(0))
  orbax.close()
WakesAClosedLoop(closed)  # now: dropped
wake_from_a_thread(closed)  # dropped
other = asyncio.new_event_loop()  # not Orbax's, closed the same way: its reports stay
lost_other = other.create_task(fail('of another closed loop'))
other.run_until_complete(asyncio.sleep(0))
other.close()
ours = asyncio.new_event_loop()
lost = ours.create_task(fail('of a running loop'))
ours.run_until_complete(asyncio.sleep(0))
del abandoned, lost, lost_other
gc.collect()
ours.close()
'''


def test_only_what_orbax_abandoned_in_our_calls_is_dropped():
  """Tasks and futures Orbax abandons on its closed event loop inside our restore call can
  end after it (even at exit); asyncio's reports of them, and closed-loop wake-ups after
  such an abandonment (unraisable, or a thread's death), are dropped. Lost errors of any
  other loop, closed or running, and closed-loop wake-ups before Orbax abandoned anything,
  are still shown."""
  proc = subprocess.run([sys.executable, '-c', _ABANDONED_TASKS], env=syn.subprocess_env(1),
                        cwd=syn.REPO, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stderr.count('exception was never retrieved') == 2, proc.stderr[-2000:]
  assert 'of a running loop' in proc.stderr and 'of another closed loop' in proc.stderr
  assert 'abandoned Orbax loop' not in proc.stderr, proc.stderr
  assert proc.stderr.count('RuntimeError: Event loop is closed') == 2, proc.stderr[-2000:]
  assert proc.stderr.count('Exception in thread') == 1, proc.stderr[-2000:]
  assert 'destroyed but it is pending' not in proc.stderr, proc.stderr[-2000:]
