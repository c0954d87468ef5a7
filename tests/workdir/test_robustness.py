"""One writer per workdir; full disks, damaged and bit-rotted checkpoints, bad flags
and refused runs end in one clear line, with nothing lost and nothing silently wrong."""

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from input_pipeline import tokenizers
from tests import mains
from tests.training import test_train_synthetic as syn
from workdir import checkpoint, checkpoint_files, train_lock

compilation_cache = pytest.fixture(scope='module', autouse=True)(syn.compilation_cache_fixture)

# data.tokenizer='char': the character tokenizer `trained` saves for decode.py must be the kind
# config.json names (workdir.restore checks a workdir's tokenizer against its config).
RUN = {'train.num_steps': 6, 'train.checkpoint_every_steps': 2, 'train.log_every_steps': 2,
       'data.tokenizer': 'char'}


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A synthetic 6-step run (checkpoints 2, 4, 6) with a character tokenizer for decode.py."""
  workdir = str(tmp_path_factory.mktemp('robust') / 'w')
  summary = syn.run(workdir, 'encoder_decoder', RUN)
  tokenizers.CharTokenizer(list(syn.ALPHABET)).save(os.path.join(workdir, 'tokenizer'))
  return workdir, summary


def _copy(trained, tmp_path):
  workdir = str(tmp_path / 'w')
  shutil.copytree(trained[0], workdir)
  return workdir


def _largest_state_file(workdir, step):
  directory = os.path.join(checkpoint.step_dir(workdir, step), 'state')
  paths = [os.path.join(root, n) for root, _, names in os.walk(directory) for n in names]
  return max(paths, key=os.path.getsize)


def _flip_middle_byte(path):
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _run_cli(script, *args):
  return subprocess.run([sys.executable, os.path.join(syn.REPO, script), *args],
                        env=syn.subprocess_env(1), cwd=syn.REPO, capture_output=True, text=True,
                        check=False)


# tfds's notice for every parallel_text run (input_pipeline/sources.py), not an error report.
_TFDS_NOTICE = re.compile(r'^W\d{4} .*dataset_builder\.py:\d+\] Using custom data configuration')


def _one_error_line(proc, prefix, code=2):
  lines = [line for line in proc.stderr.strip().splitlines() if not _TFDS_NOTICE.match(line)]
  assert proc.returncode == code, proc.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr[-3000:]
  return lines[0]


# -- 1. one writer per workdir ------------------------------------------------------------------

def test_second_writer_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path):
  workdir = str(tmp_path / 'w')
  holder = subprocess.Popen(
      [sys.executable, '-c', ('import sys; from workdir import train_lock; '
                              'train_lock.acquire(sys.argv[1]); print("locked", flush=True); '
                              'sys.stdin.read()'), workdir],  # holds it until killed
      cwd=syn.REPO, env=syn.subprocess_env(1), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    proc = _run_cli('train.py', '--config=configs/default.py:tiny', f'--workdir={workdir}')
    line = _one_error_line(proc, 'train.py: error: ')
    assert line == (f'train.py: error: {workdir} is in use by another train.py '
                    f'(pid {holder.pid}, host {os.uname().nodename})')
    assert sorted(os.listdir(workdir)) == ['train.lock']  # nothing else written
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  lock = train_lock.acquire(workdir)  # the OS dropped the dead holder's lock
  with pytest.raises(train_lock.WorkdirBusyError, match=f'pid {os.getpid()}'):
    train_lock.acquire(workdir)
  lock.release()
  train_lock.acquire(workdir).release()


def test_readers_take_no_lock(trained):
  workdir = trained[0]
  lock = train_lock.acquire(workdir)
  try:
    params, step = checkpoint.restore_params(workdir)
  finally:
    lock.release()
  assert step == 6
  _assert_trees_equal(params, trained[1]['state'].params)


# -- 2. disk full -------------------------------------------------------------------------------

def test_disk_full_before_a_save_is_one_line_and_keeps_the_checkpoints(trained, tmp_path,
                                                                        monkeypatch):
  """The free-space check, on any machine (a tmpfs needs root): the run stops before writing,
  and leaves the checkpoints as they were. (That the run then resumes from them is
  test_robustness_cli's full-disk test, through train.py; an untouched checkpoint folder
  resumes as any other does.)"""
  workdir = _copy(trained, tmp_path)
  real = shutil.disk_usage
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage',
                      lambda p: real(p)._replace(free=1000))  # a full disk, simulated
  with pytest.raises(checkpoint.CheckpointWriteError) as e:
    syn.run(workdir, 'encoder_decoder', {**RUN, 'train.num_steps': 8})
  where = checkpoint.checkpoint_dir(workdir)
  assert str(e.value).startswith(
      f'no space left on device writing checkpoint 8 in {where}; checkpoints 2, 4, 6 are intact')
  assert sorted(os.listdir(where)) == ['2', '4', '6']
  assert checkpoint.list_steps(workdir) == [2, 4, 6]


# -- 3/4. damaged and bit-rotted checkpoints ----------------------------------------------------

def test_checksums_cover_every_item_file(trained):
  for step in (2, 4, 6):
    directory = checkpoint.step_dir(trained[0], step)
    with open(os.path.join(directory, checkpoint_files.CHECKSUM_FILE)) as f:
      listed = json.load(f)['files']
    on_disk = {os.path.relpath(os.path.join(r, n), directory)
               for item in ('state', 'data') for r, _, names in
               os.walk(os.path.join(directory, item)) for n in names}
    assert set(listed) == on_disk and 'data/metadata' in listed
    assert checkpoint_files.verify_checksums(directory) is None


def test_a_flipped_byte_makes_a_checkpoint_damaged(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  _flip_middle_byte(_largest_state_file(workdir, 6))
  params, step = checkpoint.restore_params(workdir)
  err = capfd.readouterr().err
  assert step == 4 and 'checkpoint 6' in err and 'checksum mismatch in state/' in err
  _assert_trees_equal(params, checkpoint.restore_params(trained[0], step=4)[0])
  with pytest.raises(checkpoint.CheckpointError, match='checkpoint 6 .* damaged: checksum'):
    checkpoint.restore_params(workdir, step=6)


def test_every_checkpoint_damaged_is_one_line(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  for step in (2, 4, 6):
    _flip_middle_byte(_largest_state_file(workdir, step))
  checkpointer = checkpoint.Checkpointer(workdir)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'no readable checkpoint in .* \(tried steps \[2, 4, 6\]\)'):
    checkpointer.restore(syn_abstract_state())
  warnings = capfd.readouterr().err.strip().splitlines()
  assert len(warnings) == 3 and all(len(w) < 200 and 'checksum mismatch' in w for w in warnings)
  proc = _run_cli('decode.py', f'--workdir={workdir}', '--compilation_cache=')
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert lines[-1].startswith('decode.py: error: no readable checkpoint in')
  assert all('is damaged (checksum mismatch' in line for line in lines[:-1]), lines


def test_damage_without_checksums_is_still_short_and_quiet(trained, tmp_path, capfd):
  """Checkpoints written before checksums existed: Orbax finds the damage while reading, and
  its pending reads are wound up before the error line."""
  workdir = _copy(trained, tmp_path)
  for step in (2, 4, 6):
    directory = checkpoint.step_dir(workdir, step)
    _as_before_checksums(directory)
    for root, _, names in os.walk(os.path.join(directory, 'state', 'ocdbt.process_0', 'd')):
      for name in names:  # zeroed data files: Orbax reads the metadata, then fails mid-read
        path = os.path.join(root, name)
        with open(path, 'r+b') as f:
          f.write(b'\0' * os.path.getsize(path))
  with pytest.raises(checkpoint.CheckpointError, match='no readable checkpoint'):
    checkpoint.restore_params(workdir)
  checkpointer = checkpoint.Checkpointer(workdir)
  with pytest.raises(checkpoint.CheckpointError, match='no readable checkpoint'):
    checkpointer.restore(syn_abstract_state())
  gc.collect()  # the abandoned reads' coroutines are finalised now (their reports dropped)
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 8 and all(line.startswith('WARNING: checkpoint ') and
                               len(line.replace(workdir, 'DIR')) < 300 for line in err), err
  assert sum('restoring it unverified' in line for line in err) == 2, err  # one per restore
  # The command line too, whose stderr is whole once it exits: nothing that the abandoned
  # reads print late, up to the interpreter's exit (TensorStore's wake-ups of the closed loop,
  # the coroutines the garbage collector finalises: thousands of lines of "Exception ignored in
  # <coroutine ...>" otherwise). In-process, no wait could be known to be long enough.
  proc = _run_cli('decode.py', f'--workdir={workdir}', '--compilation_cache=')
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 5, proc.stderr[-3000:]
  assert lines[-1].startswith('decode.py: error: no readable checkpoint in'), lines


def _as_before_checksums(step_dir):
  """A step as the version before checksums wrote it: no checksums.json, no marker."""
  os.remove(os.path.join(step_dir, checkpoint_files.CHECKSUM_FILE))
  path = os.path.join(step_dir, 'data', 'metadata')
  with open(path) as f:
    data = json.load(f)
  del data['checksums']
  with open(path, 'w') as f:
    json.dump(data, f)


def syn_abstract_state(**overrides):
  import optim  # pylint: disable=import-outside-toplevel
  from model import ModelConfig  # pylint: disable=import-outside-toplevel
  from training import mesh as mesh_lib, state as state_lib  # pylint: disable=import-outside-toplevel
  config = syn.tiny_config('encoder_decoder', **overrides)
  return state_lib.abstract_train_state(ModelConfig.from_config(config.model),
                                        optim.make_optimizer(config), mesh_lib.make_mesh())


# -- 9. a checkpoint without its data-iterator state --------------------------------------------

def test_missing_data_state_is_kept_and_resumed_only_when_asked(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  shutil.rmtree(os.path.join(checkpoint.step_dir(workdir, 6), 'data'))
  checkpointer = checkpoint.Checkpointer(workdir)
  with pytest.raises(checkpoint.CheckpointError,
                     match='checkpoint 6 has no data-iterator state .*allow_fresh_data_iterator'):
    checkpointer.restore(syn_abstract_state())
  assert checkpoint.list_steps(workdir) == [2, 4, 6]  # kept
  state, data_state, step = checkpointer.restore(syn_abstract_state(), allow_fresh_data=True)
  checkpointer.close()
  assert step == 6 and data_state is None
  assert 'resuming with a fresh data iterator' in capfd.readouterr().err
  _assert_trees_equal(state.params, trained[1]['state'].params)


def test_removed_checkpoints_restart_from_zero_with_a_warning(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  shutil.rmtree(checkpoint.checkpoint_dir(workdir))
  summary = syn.run(workdir, 'encoder_decoder', {**RUN, 'train.num_steps': 2})
  assert sorted(summary['losses']) == [1, 2]
  assert 'has a config.json but no checkpoint' in capfd.readouterr().err


def test_tokenizer_is_not_retrained_next_to_checkpoints(tmp_path):
  from configs import default  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path)
  os.makedirs(os.path.join(workdir, 'checkpoints', '20'))
  with pytest.raises(tokenizers.DataError, match='has checkpoints but no tokenizer'):
    tokenizers.get_tokenizer(default.get_config('tiny').data, workdir)


# -- 5/6. decode.py flags -----------------------------------------------------------------------

NON_FINITE = ['--alpha=nan', '--temperature=nan', '--temperature=inf', '--top_p=nan',
              '--alpha=1e308', '--temperature=1e308']


@pytest.fixture(scope='module')
def decode_runs(trained, tmp_path_factory) -> dict:
  """The decode.py command lines of the tests below, all in one interpreter (`mains`; a
  process each spent ~1.5 s of CPU on start-up): name -> (exit status, stdout, stderr); and
  the files they were given ('files': name -> path)."""
  folder = tmp_path_factory.mktemp('decode_runs')
  runs = {('non_finite', flag): [f'--workdir={trained[0]}', flag, '--compilation_cache=']
          for flag in NON_FINITE}
  # An output that is an input (itself, or through a symlink).
  source, other, link = folder / 'src.txt', folder / 'other.txt', folder / 'link.txt'
  source.write_text('abc\n')
  other.write_text('abc\n')
  link.symlink_to(source)
  for inputs, output, flag in ((source, source, '--input_file'), (source, link, '--input_file'),
                               (other, link, '--reference')):
    runs['output_is_input', flag, output.name] = [
        f'--workdir={trained[0]}', f'--input_file={inputs}', f'--reference={source}',
        f'--output_file={output}', '--compilation_cache=']
  # A changed tokenizer file (the character vocabulary, still valid JSON).
  workdir = str(folder / 'w')
  shutil.copytree(trained[0], workdir)
  meta = os.path.join(workdir, 'tokenizer', 'tokenizer.json')
  with open(meta) as f:
    text = f.read()
  with open(meta, 'w') as f:
    f.write(text.replace('"b"', '"B"'))
  runs['damaged_tokenizer'] = [f'--workdir={workdir}', '--compilation_cache=']
  # An output that is a workdir's own file (issue 45 item 1: a translation was written there).
  own = str(folder / 'own')
  shutil.copytree(trained[0], own)
  runs['workdir_file'] = [f'--workdir={own}', f'--input_file={source}',
                          f'--output_file={own}/config.json', '--compilation_cache=']
  with open(os.path.join(own, 'config.json'), 'rb') as f:
    config_json = f.read()
  results = dict(zip(runs, mains.run_mains(list(runs.values())), strict=True))
  results['files'] = {'source': source, 'damaged_workdir': workdir, 'tokenizer.json': meta,
                      'own': own, 'config.json': config_json}
  return results


def test_decode_rejects_non_finite_floats(decode_runs):
  """One line naming the flag (its wording is decode.py's: tests/inference/test_decode_cli.py)."""
  for flag in NON_FINITE:
    code, _, err = decode_runs['non_finite', flag]
    assert code == 2 and len(err.strip().splitlines()) == 1, (flag, err)
    assert err.startswith(f'decode.py: error: {flag.split("=")[0]}=') and 'must be' in err, err


def test_a_damaged_tokenizer_stops_decode_in_one_line(decode_runs):
  """Issue 27 item 3: a changed tokenizer file (here the character vocabulary, still valid
  JSON) is one line naming the file, exit 1, instead of silently other tokens."""
  code, out, err = decode_runs['damaged_tokenizer']
  workdir, meta = decode_runs['files']['damaged_workdir'], decode_runs['files']['tokenizer.json']
  lines = [line for line in err.strip().splitlines() if not _TFDS_NOTICE.match(line)]
  assert code == 1 and out == '', err[-3000:]
  assert lines == [f'decode.py: error: tokenizer file {meta} does not match its checksum in '
                   f'{workdir}/tokenizer/checksums.json: it was changed or damaged (restore it '
                   'from a backup, or use a new workdir)'], err[-3000:]


def test_output_file_may_not_be_an_input_nor_a_workdirs_own_file(decode_runs):
  """The workdir's own files are refused however spelled: tests/common/test_output_files.py,
  in-process; here decode.py's command line, which wrote a translation into W/config.json
  (exit 0)."""
  found = [(key[1], result) for key, result in decode_runs.items()
           if key[0] == 'output_is_input']
  assert len(found) == 3
  for flag, (code, _, err) in found:
    assert code == 2 and err.startswith('decode.py: error: --output_file '), err
    assert f'is the same file as {flag}' in err, err
  assert decode_runs['files']['source'].read_text() == 'abc\n'
  code, _, err = decode_runs['workdir_file']
  assert code == 2 and err.startswith('decode.py: error: --output_file '), err
  assert "a workdir's own file" in err and len(err.strip().splitlines()) == 1, err
  with open(os.path.join(decode_runs['files']['own'], 'config.json'), 'rb') as f:
    assert f.read() == decode_runs['files']['config.json']


# -- issue 27: deleted checksums, symlinked steps, garbage Orbax metadata --------------------------

def test_a_deleted_checksum_file_is_damage_and_old_steps_warn_once(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  os.remove(os.path.join(checkpoint.step_dir(workdir, 6), checkpoint_files.CHECKSUM_FILE))
  _, step = checkpoint.restore_params(workdir)
  err = capfd.readouterr().err.strip().splitlines()
  assert step == 4 and len(err) == 1 and 'checkpoint 6' in err[0], err
  assert 'is damaged (checksums.json is missing); skipping it' in err[0]
  checkpointer = checkpoint.Checkpointer(workdir)
  assert checkpointer.restore(syn_abstract_state())[2] == 4
  checkpointer.close()
  assert checkpoint.list_steps(workdir) == [2, 4]  # removed, as damaged steps are
  capfd.readouterr()
  old = _copy(trained, tmp_path / 'old')
  for step in (2, 4, 6):  # a workdir from before checksums: accepted, one warning per restore
    _as_before_checksums(checkpoint.step_dir(old, step))
  params, step = checkpoint.restore_params(old, average_last=2)
  err = capfd.readouterr().err.strip().splitlines()
  assert step == 6 and err == [f'WARNING: checkpoint 6 in {checkpoint.checkpoint_dir(old)} has no '
                               'checksums.json (written by a version from before checksums): '
                               'restoring it unverified'], err


def _victim_tree(root):
  return {os.path.relpath(os.path.join(r, n), root): open(os.path.join(r, n), 'rb').read()
          for r, _, names in os.walk(root) for n in names}


def test_a_symlinked_step_is_refused_by_training_and_never_deleted(trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  victim = tmp_path / 'victim'
  shutil.copytree(checkpoint.step_dir(workdir, 2), victim / 'state_like')  # not a checkpoint
  (victim / 'notes.txt').write_text('precious\n')
  before = _victim_tree(victim)
  os.symlink(victim, checkpoint.step_dir(workdir, 25))
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'checkpoints/25 is a symbolic link: train.py neither writes nor '):
    checkpoint.Checkpointer(workdir)
  _, step = checkpoint.restore_params(workdir)  # a reader reads through it, deletes nothing
  assert step == 6 and 'checkpoint 25' in capfd.readouterr().err
  assert _victim_tree(victim) == before and os.path.islink(checkpoint.step_dir(workdir, 25))


def test_symlinks_at_orbax_temporary_folders_are_unlinked_not_followed(trained, tmp_path, capfd,
                                                                      monkeypatch):
  """One planted before the run (Orbax would clean it up with rmtree) and one planted while it
  runs, at the name Orbax is about to write to: removed with a warning each, never followed."""
  workdir = _copy(trained, tmp_path)
  victim = tmp_path / 'victim'
  victim.mkdir()
  (victim / 'notes.txt').write_text('precious\n')
  where = checkpoint.checkpoint_dir(workdir)
  os.symlink(victim, os.path.join(where, '8.orbax-checkpoint-tmp'))
  save = checkpoint.Checkpointer.save

  def planting_save(self, step, state, data_state):
    if step == 10:
      os.symlink(victim, os.path.join(where, '10.orbax-checkpoint-tmp'))
    return save(self, step, state, data_state)

  monkeypatch.setattr(checkpoint.Checkpointer, 'save', planting_save)
  summary = syn.run(workdir, 'encoder_decoder', {**RUN, 'train.num_steps': 10})
  assert summary['step'] == 10 and checkpoint.list_steps(workdir) == [6, 8, 10]
  assert os.listdir(victim) == ['notes.txt'] and (victim / 'notes.txt').read_text() == 'precious\n'
  warnings = [line for line in capfd.readouterr().err.splitlines() if 'symbolic link' in line]
  assert [w.split(where + '/')[1] for w in warnings] == [
      '8.orbax-checkpoint-tmp is a symbolic link: removing the link (not following it)',
      '10.orbax-checkpoint-tmp is a symbolic link: removing the link (not following it)']


_RESTORE_QUIETLY = '''
import os
import sys
from absl import logging as _  # the CLIs' handler on the root logger
from workdir import checkpoint
params, step = checkpoint.restore_params(sys.argv[1])
checkpointer = checkpoint.Checkpointer(sys.argv[1])
leftover = os.path.exists(os.path.join(checkpoint.checkpoint_dir(sys.argv[1]),
                                       '8.orbax-checkpoint-tmp'))
print(step, checkpoint.list_steps(sys.argv[1]), checkpointer.latest_step(), leftover)
checkpointer.close()
'''


def test_garbage_orbax_metadata_and_read_only_notices_stay_quiet(trained, tmp_path):
  """A garbage `_CHECKPOINT_METADATA` (not ours, not checksummed) still restores the right
  parameters, with nothing from Orbax on stderr: no 'Failed to json parse', and none of its
  'Given directory is read only' notices for a reader. A killed save's leftover is gone when
  the trainer's `Checkpointer` is made, not in a background thread that a process closing at
  once would leave to die with a traceback (Orbax's own cleanup, which `close()` does not await)."""
  workdir = _copy(trained, tmp_path)
  with open(os.path.join(checkpoint.step_dir(workdir, 6), '_CHECKPOINT_METADATA'), 'w') as f:
    f.write('garbage{{')
  os.makedirs(os.path.join(checkpoint.checkpoint_dir(workdir), '8.orbax-checkpoint-tmp', 'state'))
  proc = subprocess.run([sys.executable, '-c', _RESTORE_QUIETLY, workdir], cwd=syn.REPO,
                        env=syn.subprocess_env(1), capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0 and proc.stderr == '', proc.stderr[-3000:]
  assert proc.stdout.split('\n')[0] == '6 [2, 4, 6] 6 False'
  params, step = checkpoint.restore_params(workdir)
  assert step == 6
  _assert_trees_equal(params, trained[1]['state'].params)


# A FIFO where a file is read (best_metrics.json, config.json, checksum files) is refused
# without waiting: tests/common/test_output_files.py's
# test_a_fifo_where_the_project_reads_a_file_is_refused_at_once, with the project's readers.


def test_best_metrics_on_a_full_disk_is_said_once(tmp_path, monkeypatch, capfd):
  """best_metrics.json failing on a full disk says nothing at once: the checkpoint that meets
  the full disk next ends the run with its one line; a run that finishes anyway warns at its
  end, once. Another failure warns at once."""
  import errno  # pylint: disable=import-outside-toplevel

  from training import progress  # pylint: disable=import-outside-toplevel
  best = progress.BestMetrics(str(tmp_path))

  def full(path, data):
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(progress, 'atomic_write', full)
  best.update('loss', 2.0, 10)
  assert capfd.readouterr().err == ''
  best.warn_unsaved()
  best.warn_unsaved()
  err = capfd.readouterr().err
  assert err.count('No space left on device') == 1 and 'best_metrics.json' in err

  def denied(path, data):
    raise OSError(errno.EACCES, 'Permission denied')
  monkeypatch.setattr(progress, 'atomic_write', denied)
  best.update('loss', 1.0, 20)
  assert 'Permission denied' in capfd.readouterr().err
