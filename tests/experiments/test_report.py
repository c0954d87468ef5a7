"""`python -m experiments.report`: curves and a table of runs from their event files, without
TensorBoard; and TensorBoard (the [tb] extra) reads the same files. The event files are
written here with tensorboardX as a run writes them, at chosen wall times (no training)."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest
from tensorboardX import SummaryWriter

from experiments import report
from tests import REPO, extras

T0 = 1_700_000_000.0


def _session(workdir, suffix, start, points, text=None, text_step=0):
  """One process's event file: `points` = [(step, seconds after `start`, {tag: value})]; the
  config `text`, if any, at `text_step` (train.py's: the step the session starts from)."""
  writer = SummaryWriter(logdir=str(workdir), filename_suffix=suffix)
  if text is not None:
    writer.add_text('config', text, text_step, walltime=start)
  for step, seconds, values in points:
    for tag, value in values.items():
      writer.add_scalar(tag, value, step, walltime=start + seconds)
  writer.close()


@pytest.fixture
def resumed(tmp_path):
  """A run stopped after step 8 (last checkpoint at 4) and resumed an hour later to step 12."""
  workdir = tmp_path / 'resumed'
  _session(workdir, '.1', T0, [
      (2, 60, {'train/loss': 5.0, 'train/learning_rate': 1e-3, 'train/step_ms': 100.0}),
      (4, 120, {'train/loss': 4.0, 'train/learning_rate': 2e-3, 'train/step_ms': 100.0,
                'eval/loss': 4.5, 'eval/bleu': 3.0}),
      (6, 180, {'train/loss': 3.5}), (8, 240, {'train/loss': 3.4, 'eval/loss': 3.9})],
      text='**configs/default.py**')
  _session(workdir, '.2', T0 + 3600, [
      (6, 60, {'train/loss': 3.0, 'train/step_ms': 300.0}),
      (8, 120, {'train/loss': 2.5, 'eval/loss': 3.0, 'eval/bleu': 9.0}),
      (12, 240, {'train/loss': 2.0, 'train/step_ms': 200.0, 'eval/loss': 3.2, 'eval/bleu': 8.5})])
  return str(workdir)


def test_a_resumed_run_is_one_run(resumed):
  run = report.load_run(resumed)
  assert run.name == 'resumed' and run.texts['config'] == '**configs/default.py**'
  loss = run.scalars['train/loss']
  # Steps 6 and 8 were redone after the resume: the second session's values replace them.
  assert [(p.step, p.value) for p in loss] == [(2, 5.0), (4, 4.0), (6, 3.0), (8, 2.5), (12, 2.0)]
  # Wall time: the first session's 4 minutes (from its first event, the config text), then
  # the second's own 3 (60 s to 240 s after it started); the hour between them is not counted.
  assert [p.minutes for p in loss] == pytest.approx([1, 2, 4, 5, 7])
  assert run.minutes == pytest.approx(7)
  assert [p.step for p in run.scalars['eval/loss']] == [4, 8, 12]


def test_a_session_redoes_the_steps_after_its_config_not_the_step_it_starts_from(tmp_path):
  """train.py logs its config text at the step it starts from. Resumed from step 4, the second
  session's steps 6-8 replace the first's; a finished run opened again (it evaluates step 12
  once more) keeps its training log at step 12, so the minutes there stay the training's."""
  workdir = tmp_path / 'reopened'
  _session(workdir, '.1', T0, [(4, 60, {'train/loss': 4.0}), (6, 120, {'train/loss': 3.5}),
                               (8, 180, {'train/loss': 3.4})], text='config')
  _session(workdir, '.2', T0 + 3600, [(6, 60, {'train/loss': 3.0}), (8, 120, {'train/loss': 2.5}),
                                      (12, 240, {'train/loss': 2.0})], text='config', text_step=4)
  _session(workdir, '.3', T0 + 7200, [(12, 10, {'eval/bleu': 9.0})], text='config', text_step=12)
  run = report.load_run(str(workdir))
  loss = run.scalars['train/loss']
  assert [(p.step, p.value) for p in loss] == [(4, 4.0), (6, 3.0), (8, 2.5), (12, 2.0)]
  assert [p.minutes for p in loss] == pytest.approx([1, 4, 5, 7])  # 3 min, then 4 of the second
  assert [(p.step, p.value) for p in run.scalars['eval/bleu']] == [(12, 9.0)]
  assert run.minutes == pytest.approx(7 + 10 / 60)  # the third session's own 10 seconds


def test_report_writes_curves_and_a_table_of_several_runs(resumed, tmp_path):
  other = tmp_path / 'other'
  _session(other, '.1', T0, [(5, 30, {'train/loss': 6.0}), (10, 60, {'train/loss': 5.5})])
  out = report.report([resumed, str(other)], str(tmp_path / 'out'), names=['base', 'small'])
  with open(out['curves'], 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with open(out['summary']) as f:
    table = f.read()
  assert table == out['table']
  rows = table.strip().splitlines()
  assert rows[0].startswith('| run | steps | wall time | final train loss | final val loss |')
  assert rows[2] == ('| base | 12 | 7.0 min | 2.0000 | 3.2000 | 3.0000 (step 8) | 8.50 | '
                     '9.00 (step 8) | 150.0 |')
  assert rows[3] == '| small | 10 | 0.5 min | 5.5000 | - | - | - | - | - |'


def test_cli_prints_the_table_and_refuses_bad_input_in_one_line(resumed, tmp_path):
  """The command lines run in one interpreter, each through report's main (`tests.mains`),
  the last refusal also as `python -m experiments.report` (its exit status and stderr as a
  process: the module's own entry point)."""
  from tests.mains import run_mains  # pylint: disable=import-outside-toplevel
  out_dir = tmp_path / 'out'
  refusals = [((f'--workdir={tmp_path / "none"}', f'--output_dir={out_dir}'),
               'no TensorBoard events in'),
              ((f'--workdir={resumed}',), '--output_dir=DIR'),
              ((f'--workdir={resumed}', f'--output_dir={resumed}/checkpoints'),
               "checkpoints/, a workdir's own folder"),
              ((f'--workdir={resumed}', f'--output_dir={out_dir}', '--names=a,b'),
               '--names has 2 names for 1 workdirs')]
  (code, out, err), *refused = run_mains(
      [[f'--workdir={resumed}', f'--output_dir={out_dir}'],
       *(list(args) for args, _ in refusals)], script='experiments.report')
  assert code == 0, err
  assert '| resumed | 12 | 7.0 min |' in out
  assert sorted(os.listdir(out_dir)) == ['curves.png', 'summary.md']
  proc = subprocess.run([sys.executable, '-m', 'experiments.report', *refusals[-1][0]],
                        cwd=REPO, capture_output=True, text=True, check=False)
  refused.append((proc.returncode, proc.stdout, proc.stderr))
  for (code, _, err), (_, message) in zip(refused, [*refusals, refusals[-1]], strict=True):
    assert code == 2, err
    assert err.startswith('python -m experiments.report: error: ')
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


def test_outputs_never_follow_a_planted_link_nor_replace_a_workdirs_file(resumed, tmp_path):
  """Issue 45 item 2: symlinks planted at OUT/summary.md and OUT/curves.png had their targets
  overwritten; a report may go inside a workdir, but never over its own files."""
  (pathlib.Path(resumed) / 'checkpoints').mkdir()  # with config.json: a workdir's marks
  (pathlib.Path(resumed) / 'config.json').write_text('{}')
  out, victim = tmp_path / 'out', tmp_path / 'victim.txt'
  out.mkdir()
  victim.write_text('precious\n')
  for name in ('curves.png', 'summary.md'):
    (out / name).symlink_to(victim)
    with pytest.raises(ValueError, match=f'{name} is a symbolic link: refusing'):
      report.report([resumed], str(out))
    (out / name).unlink()
  assert victim.read_text() == 'precious\n'
  with pytest.raises(ValueError, match="checkpoints/, a workdir's own folder"):
    report.report([resumed], os.path.join(resumed, 'checkpoints', 'report'))
  written = report.report([resumed], os.path.join(resumed, 'report'))  # beside its files: fine
  assert os.path.isfile(written['summary']) and os.path.isfile(written['curves'])


def test_a_fifo_among_the_event_files_is_refused_not_waited_on(resumed):
  os.mkfifo(os.path.join(resumed, 'events.out.tfevents.0.fifo'))
  def hung(*_):
    raise TimeoutError('report.load_run waited on the FIFO')
  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(10)  # an open() would wait for a writer forever: a failure, not a hang
  try:
    with pytest.raises(OSError, match='is a FIFO, not a regular file'):
      report.load_run(resumed)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_tensorboard_reads_the_same_event_files(resumed):
  """The guide's `tensorboard --logdir DIR` (the [tb] extra)."""
  event_accumulator = extras.require('tensorboard.backend.event_processing.event_accumulator')
  acc = event_accumulator.EventAccumulator(resumed)
  acc.Reload()
  assert 'train/loss' in acc.Tags()['scalars'] and 'eval/bleu' in acc.Tags()['scalars']


def test_a_flipped_bit_stops_the_reading_with_a_warning(resumed, tmp_path):
  """Every record's CRCs are checked: a flipped bit in a length or in a record's data (a
  step, a loss, a wall time) stops that file's reading at the record, with a warning naming
  the file and the offset, instead of a silently different table."""
  source = pathlib.Path(resumed)
  second = sorted(p.name for p in source.iterdir() if p.name.endswith('.2'))[0]
  header = next(report.read_records(str(source / second)))  # the file's version record
  start = 16 + len(header)  # where its first scalar record starts
  for where, byte in (('length', start + 3), ('data', start + 14)):
    copy = tmp_path / where
    copy.mkdir()
    for path in source.iterdir():
      data = bytearray(path.read_bytes())
      if path.name == second:
        data[byte] ^= 0x10
      (copy / path.name).write_bytes(bytes(data))
    warnings = []
    run = report.load_run(str(copy), warn=warnings.append)
    assert warnings == [f'{copy / second}: the record at byte {start} is damaged (CRC '
                        'mismatch); it and the records after it are left out'], where
    # Nothing of the damaged session is read: the first session's points only.
    loss = run.scalars['train/loss']
    assert [p.step for p in loss] == [2, 4, 6, 8], where
    assert [p.value for p in loss] == pytest.approx([5.0, 4.0, 3.5, 3.4]), where
