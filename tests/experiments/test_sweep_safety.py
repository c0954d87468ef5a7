"""sweep.py and experiments.archive against a hostile or careless root (issue 81): a table that
counts only runs trained and evaluated as its rows say, the files a sweep reads and writes
(links, FIFOs, damaged JSON, a full disk), archives from someone else, absurd plans and row
names. No training: each run here is a fake workdir (config.json, sweep_eval/) as a sweep
leaves it; the few command lines run through one interpreter (`run_mains`)."""

import errno
import gzip
import json
import os
import textwrap

import pytest

from configs.sweeps import Sweep
from experiments import archive, evaluate, job as job_lib, launch, sweep_file, table
from experiments.sweep_file import SweepError
from tests.common.test_output_files import no_hang
from tests.mains import run_mains
from tests.training import test_train_synthetic as syn

TINY = 'configs/default.py:tiny'
QUICK = {'train.num_steps': 40}
DECODE = {'beam_size': 1, 'max_new_tokens': 4}
SENTENCES = 3
ROWS = {'post': {'model.norm_position': 'post'}, 'pre': {'model.norm_position': 'pre'}}


def _sweep(**fields) -> Sweep:
  return Sweep(**{'config': TINY, 'overrides': QUICK, 'rows': ROWS, 'seeds': 2,
                  'decode': DECODE, 'eval_sentences': SENTENCES, **fields})


def _sweep_file(tmp_path, name='exp', **fields) -> str:
  args = {'config': TINY, 'overrides': QUICK, 'rows': ROWS, 'seeds': 2, 'decode': DECODE,
          'eval_sentences': SENTENCES, **fields}
  path = tmp_path / f'{name}.py'
  path.write_text(textwrap.dedent(f'''
      from configs.sweeps import Sweep
      def get_sweep():
        return Sweep(**{args!r})
  '''))
  return str(path)


def _fake_run(plan, run, *, bleu=30.0, config=None, results=None, hyps=None):
  """What a finished, evaluated run leaves in its workdir (no checkpoints: an archived run)."""
  workdir = os.path.join(run.workdir, evaluate.EVAL_DIR)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(run.workdir, 'config.json'), 'w') as f:
    json.dump(config or sweep_file.run_config(plan, run), f)
  split = {'sentences': SENTENCES, 'bleu': bleu, 'bleu_lowercased': bleu, 'chrf2': 50.0,
           'bleu_signature': 'nrefs:1|case:mixed', 'split': 'x'}
  found = {'step': run.num_steps, 'decode': launch.eval_settings(plan), 'search': 'greedy',
           'eval_sentences': SENTENCES, 'parameters': 1000, 'eval_wall_s': 1.0,
           'validation': split, 'test': split, **(results or {})}
  for name in evaluate.SPLITS:
    lines = hyps if hyps is not None else [f'ein satz {i} {bleu}' for i in range(SENTENCES)]
    for what, text in (('hyp', lines), ('ref', [f'ein satz {i}' for i in range(SENTENCES)])):
      with open(evaluate.split_file(run.workdir, name, what), 'w') as f:
        f.write(''.join(f'{line}\n' for line in text))
  with open(evaluate.results_path(run.workdir), 'w') as f:
    json.dump(found, f)


def _one_line(error) -> str:
  text = str(error.value)
  assert '\n' not in text, text
  return text


def _counted(plan) -> dict[str, int]:
  return {row.name: row.seeds for row in table.collect(plan)}


def _another_sweeps_root(tmp) -> dict:
  """A root of sweep `mine` (its sweep.json and 4 runs), and the file of another sweep."""
  mine = _sweep_file(tmp)
  theirs = _sweep_file(tmp, name='theirs', overrides={**QUICK, 'model.dropout_rate': 0.3})
  plan = sweep_file.plan(sweep_file.load(mine), str(tmp / 'another'), mine)
  launch.check_manifest(plan, write=True)
  for run in plan.runs:
    _fake_run(plan, run)
  return {'plan': plan, 'mine': mine, 'theirs': theirs}


def _damaged_root(tmp) -> dict:
  """4 runs: post/seed_1's and pre/seed_0's results.json of wrong types, pre/seed_1's status."""
  plan = sweep_file.plan(_sweep(), str(tmp / 'damaged'))
  for run in plan.runs:
    _fake_run(plan, run)
  _fake_run(plan, plan.runs[1], results={'test': {'bleu': 'high', 'sentences': SENTENCES}})
  _fake_run(plan, plan.runs[2], results={'eval_wall_s': 'slow'})
  status = launch.status_file(plan, plan.runs[3])
  os.makedirs(os.path.dirname(status))
  with open(status, 'w') as f:
    json.dump({'state': 'failed', 'error': 'x', 'job_pid': 'abc'}, f)
  return {'plan': plan, 'status': status}


def _planted_roots(tmp) -> dict:
  linked, folder = tmp / 'linked', tmp / 'folder'
  (linked / '.sweep').mkdir(parents=True)
  (linked / '.sweep' / 'lock').symlink_to(tmp / 'elsewhere')
  (folder / '.sweep' / 'lock').mkdir(parents=True)
  exits = tmp / 'exits.py'
  exits.write_text('import sys\nsys.exit(0)\n')
  return {'linked': linked, 'folder': folder, 'exits': exits}


def _full_disk_root(tmp) -> dict | str:
  """A root of finished runs and a table on a full 1 MB tmpfs at tmp/small (its sweep file
  beside it) -> {'sweep', 'plan', 'summary'}; where this user cannot mount, the reason."""
  import subprocess  # pylint: disable=import-outside-toplevel
  small = tmp / 'small'
  small.mkdir()
  proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(small)],
                        capture_output=True, check=False)
  if proc.returncode != 0:
    return f'cannot mount here: {proc.stderr.decode().strip()}'
  sweep = _sweep_file(tmp, name='full')
  plan = sweep_file.plan(sweep_file.load(sweep), os.path.join(small, 'root'), sweep)
  for run in plan.runs:
    _fake_run(plan, run)
  summary = os.path.join(plan.root, 'summary.md')
  with open(summary, 'w') as f:
    f.write('the table so far\n')
  with open(os.path.join(small, 'filler'), 'wb', buffering=0) as f, pytest.raises(OSError):
    while True:
      f.write(b'x' * 4096)
  return {'sweep': sweep, 'plan': plan, 'summary': summary}


@pytest.fixture(scope='module')
def cli(tmp_path_factory):
  """The roots of the tests below that run sweep.py, and its command lines over them, all in
  one interpreter (`run_mains`, from the directory `tmp`): name -> (status, stdout, stderr)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  tmp = tmp_path_factory.mktemp('cli')
  found = {'tmp': tmp, 'another': _another_sweeps_root(tmp), 'damaged': _damaged_root(tmp),
           'planted': _planted_roots(tmp), 'full_disk': _full_disk_root(tmp)}
  another, damaged, planted = found['another'], found['damaged'], found['planted']
  sweep = _sweep_file(tmp, name='plain')
  commands = {
      'theirs_report': [f'--sweep={another["theirs"]}', f'--root={another["plan"].root}',
                        '--report'],
      'theirs_dry_run': [f'--sweep={another["theirs"]}', f'--root={another["plan"].root}',
                         '--dry_run'],
      'mine_report': [f'--sweep={another["mine"]}', f'--root={another["plan"].root}',
                      '--report'],
      'relative': [f'--sweep={sweep}', '--root=runs/x', '--dry_run'],
      'missing_report': [f'--sweep={sweep}', f'--root={tmp / "missing"}', '--report'],
      'damaged_report': [f'--sweep={sweep}', f'--root={damaged["plan"].root}', '--report'],
      'damaged_dry_run': [f'--sweep={sweep}', f'--root={damaged["plan"].root}', '--dry_run'],
      'linked_lock': [f'--sweep={sweep}', f'--root={planted["linked"]}', '--executor=local'],
      'folder_lock': [f'--sweep={sweep}', f'--root={planted["folder"]}', '--executor=local'],
      'exits': [f'--sweep={planted["exits"]}', f'--root={tmp / "x"}']}
  full = found['full_disk']
  if isinstance(full, dict):
    commands['full_report'] = [f'--sweep={full["sweep"]}', f'--root={full["plan"].root}',
                               '--report']
    commands['full_run'] = [f'--sweep={full["sweep"]}', f'--root={full["plan"].root}',
                            '--executor=local']
  try:
    results = run_mains(list(commands.values()), script='sweep.py', cwd=str(tmp))
    found.update(zip(commands, results, strict=True))
    yield found
  finally:
    if isinstance(full, dict):
      subprocess.run(['umount', '-l', str(tmp / 'small')], check=False)


def test_a_report_of_a_root_that_does_not_exist_is_refused_and_makes_nothing(cli):
  """A typo'd --root with --report: one line, exit 2, no folder with an empty table in it."""
  code, out, err = cli['missing_report']
  missing = cli['tmp'] / 'missing'
  assert (code, out) == (2, '') and err == (f'sweep.py: error: --root={missing} does not exist: '
                                            'no run of this sweep to report\n'), err
  assert not missing.exists()


# ----------------------------------------------------------------------------- cause 5

def test_a_run_trained_with_another_config_is_refused_never_tabled(tmp_path):
  """Runs restored from another sweep's archive (same row names, other overrides), or trained
  before the config file changed, are compared with the row's resolved config field by field:
  one line naming the run and the fields, from the plan, the dry run, the report and a run."""
  plan = sweep_file.plan(_sweep(), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)
  assert _counted(plan) == {'post': 2, 'pre': 2}
  launch.check_runs(plan)  # the sweep's own runs pass
  other = sweep_file.plan(_sweep(rows={'post': {'model.norm_position': 'post',
                                                'model.dropout_rate': 0.3},
                                       'pre': ROWS['pre']}), str(tmp_path / 'other'))
  stranger = other.runs[1]  # post/seed_1 of a sweep with dropout 0.3
  _fake_run(other, stranger)
  os.replace(os.path.join(stranger.workdir, 'config.json'),
             os.path.join(plan.runs[1].workdir, 'config.json'))
  for check in (launch.check_runs, lambda p: launch.check_manifest(p, write=False),
                table.collect, table.write):
    with pytest.raises(SweepError) as e:
      check(plan)
    assert "post/seed_1 was not trained with the config of row 'post': " in _one_line(e)
    assert 'model.dropout_rate=0.3 (the row: 0.1)' in str(e.value)
  assert not os.path.exists(os.path.join(plan.root, 'summary.md'))
  # A run of another seed, or of a config file changed since (here its learning rate).
  config = sweep_file.run_config(plan, plan.runs[1])
  config['train']['seed'], config['optimizer']['learning_rate'] = 7, 0.25
  _fake_run(plan, plan.runs[1], config=config)
  with pytest.raises(SweepError, match=r'train\.seed=7 \(the row: 1\)') as e:
    launch.check_runs(plan)
  assert 'optimizer.learning_rate=0.25 (the row: 0.5)' in str(e.value)


def test_the_table_counts_only_runs_evaluated_with_the_sweeps_setting(tmp_path):
  plan = sweep_file.plan(_sweep(), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)
  _fake_run(plan, plan.runs[0], results={'decode': {**launch.eval_settings(plan),
                                                    'beam_size': 4}})
  _fake_run(plan, plan.runs[3], results={'eval_sentences': 1000})
  assert _counted(plan) == {'post': 1, 'pre': 1}
  assert [launch.run_state(plan, r)[0] for r in plan.runs] == ['new', 'done', 'done', 'new']
  os.remove(os.path.join(plan.runs[2].workdir, 'config.json'))  # nothing to check it against
  assert _counted(plan) == {'post': 1, 'pre': 0}


def test_report_and_dry_run_refuse_another_sweeps_root(cli):
  """--report with another sweep file over an existing root refused the same as --dry_run and a
  run: summary.md was rewritten with the other file's overrides as the runs' labels."""
  for code, _, err in (cli['theirs_report'], cli['theirs_dry_run']):
    assert code == 2 and err.count('\n') == 1 and 'holds a sweep with overrides=' in err, err
  code, out, err = cli['mine_report']
  assert code == 0 and '| post | 2/2 |' in out, out + err
  with open(os.path.join(cli['another']['plan'].root, 'summary.md')) as f:
    assert 'dropout_rate' not in f.read()


# ----------------------------------------------------------------------------- cause 6

def test_a_relative_root_is_resolved_once_for_train_py_and_the_job(tmp_path, monkeypatch,
                                                                 cli):
  """train.py runs in the repository: a relative --workdir there was another directory than
  the job's and sweep.py's (a run 'stopped at step 0' forever, inside the checkout)."""
  monkeypatch.chdir(tmp_path)
  plan = sweep_file.plan(_sweep(), os.path.join('runs', 'x'))
  spec = launch.job_spec(plan, plan.runs[0])
  assert spec['workdir'] == str(tmp_path / 'runs' / 'x' / 'post' / 'seed_0')
  assert f'--workdir={spec["workdir"]}' in spec['args']
  assert not any(a == '--workdir=runs/x/post/seed_0' for a in spec['args'])
  code, out, err = cli['relative']  # sweep.py run from another directory than the repository's
  assert code == 0 and f'-> {cli["tmp"] / "runs" / "x"}: 4 runs' in out, out + err


# ----------------------------------------------------------------------------- causes 10, 11

def _spec(tmp_path, log_file) -> dict:
  return {'row': 'a', 'seed': 0, 'workdir': str(tmp_path / 'a' / 'seed_0'),
          'args': ['--no_such_flag'], 'num_steps': 1, 'translates': True, 'decode': {},
          'status_file': str(tmp_path / 'status.json'), 'log_file': str(log_file),
          'repo': syn.REPO}


def test_the_jobs_log_never_follows_a_symlink_nor_waits_on_a_fifo(tmp_path):
  victim = tmp_path / 'victim.txt'
  victim.write_text('precious\n')
  link = tmp_path / 'logs' / 'a.seed_0.log'
  link.parent.mkdir()
  link.symlink_to(victim)
  status = job_lib.run_job(_spec(tmp_path, link))
  assert status['state'] == 'failed' and 'is a symbolic link' in status['error'], status
  assert victim.read_text() == 'precious\n'
  fifo = tmp_path / 'logs' / 'b.seed_0.log'
  os.mkfifo(fifo)
  with no_hang():
    status = job_lib.run_job(_spec(tmp_path, fifo))
  assert status['state'] == 'failed' and 'is a FIFO' in status['error'], status
  assert job_lib.last_error(str(fifo)).startswith('(no log')  # read without waiting either


def test_fifos_in_a_root_are_refused_not_waited_on(tmp_path):
  plan = sweep_file.plan(_sweep(), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)
  hyp = evaluate.split_file(plan.runs[0].workdir, 'test', 'hyp')
  os.remove(hyp)
  os.mkfifo(hyp)
  with no_hang():
    assert _counted(plan) == {'post': 1, 'pre': 2}
    assert launch.run_state(plan, plan.runs[0])[0] != 'done'
    table.write(plan)
  os.makedirs(launch.state_dir(plan.root))
  os.mkfifo(launch.state_dir(plan.root, 'sweep.json'))
  with no_hang(), pytest.raises(SweepError, match='sweep.json is a FIFO') as e:
    launch.check_manifest(plan, write=False)
  _one_line(e)


# ----------------------------------------------------------------------------- cause 12

def test_damaged_results_and_status_files_are_named_and_the_other_runs_tabled(cli):
  for code, out, err in (cli['damaged_report'], cli['damaged_dry_run']):
    assert code == 0 and 'Traceback' not in err, out + err
    assert err.count('sweep.py: warning: ignored ') == 3, err
  plan, status = cli['damaged']['plan'], cli['damaged']['status']
  assert job_lib.read_status(status) == {}
  assert launch.ignored(plan) == [
      f"ignored {evaluate.results_path(plan.runs[1].workdir)}: test.bleu is 'high', not a number",
      f"ignored {evaluate.results_path(plan.runs[2].workdir)}: 'eval_wall_s' is 'slow', not a "
      'number',
      f"ignored {status}: 'job_pid' is 'abc', not int"]
  assert _counted(plan) == {'post': 1, 'pre': 1}
  assert launch.run_state(plan, plan.runs[3])[0] == 'done'
  assert launch.describe(plan)[-1].startswith('2 of 4 runs done')
  assert '| post | 1/2 (unfinished) |' in table.write(plan)['table']


# ----------------------------------------------------------------------------- cause 13

def test_a_full_disk_is_one_line_with_exit_status_1(tmp_path, monkeypatch):
  from common import atomic_file, errors
  plan = sweep_file.plan(_sweep(), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)

  def full(path, data):  # noqa: ARG001
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(atomic_file, 'atomic_write', full)
  for write, name in ((lambda: launch.check_manifest(plan, write=True), 'sweep.json'),
                      (lambda: table.write(plan), 'summary.md')):
    with pytest.raises(SweepError) as e:
      write()
    assert f'cannot write {plan.root}' in _one_line(e) and name in str(e.value)
    assert 'no space left on device' in str(e.value) and errors.exit_code(e.value) == 1


def test_sweep_py_on_a_real_full_disk_is_one_line_exit_1_and_keeps_its_table(cli):
  """--report and a run on a root whose disk is full (the runs and table made before it filled;
  `cli`'s tmpfs): one line each, exit 1, the table as it was."""
  full = cli['full_disk']
  if not isinstance(full, dict):
    pytest.skip(full)
  for name, file in (('full_report', 'summary.md'), ('full_run', 'sweep.json')):
    code, _, err = cli[name]
    assert code == 1 and err.count('\n') == 1, err
    assert f'cannot write {full["plan"].root}' in err and file in err and 'no space left' in err, (
        err)
  with open(full['summary']) as f:
    assert f.read() == 'the table so far\n'


# ----------------------------------------------------------------------------- causes 14, 24

def _archive(tmp_path):
  """A root of 2 fake runs of row 'post' archived -> (plan, archive directory)."""
  plan = sweep_file.plan(_sweep(rows={'post': ROWS['post']}), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)
  store = tmp_path / 'archive'
  assert archive.save(plan.root, str(store)) == ['post/seed_0', 'post/seed_1']
  return plan, store


def test_restore_refuses_links_fifos_truncated_and_oversized_files(tmp_path, monkeypatch,
                                                                    capsys):
  secret = tmp_path / 'secret'
  secret.write_text('not for the root\n')
  plan, store = _archive(tmp_path)
  seed_0, seed_1 = store / 'post' / 'seed_0', store / 'post' / 'seed_1'
  (seed_0 / 'config.json').unlink()
  (seed_0 / 'config.json').symlink_to(secret)
  hyp = seed_1 / 'sweep_eval' / 'test.hyp.gz'
  hyp.write_bytes(hyp.read_bytes()[:-6])  # truncated
  root = tmp_path / 'new'
  with pytest.raises(archive.ArchiveError, match='config.json is a symbolic link'):
    archive.restore(str(store), str(root))
  assert archive.main(['restore', f'--from={store}', f'--root={root}']) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and 'config.json is a symbolic link' in err[0], err
  assert 'test.hyp.gz is truncated or not gzip (EOFError' in err[1], err
  assert not os.path.exists(root / 'post' / 'seed_0') and not os.path.exists(
      root / 'post' / 'seed_1')
  assert os.listdir(root / 'post') == []  # no .seed_S.restoring left behind
  # A FIFO, a gzip bomb, a linked folder, a damaged results.json: the same, and the rest goes in.
  (seed_0 / 'config.json').unlink()
  os.mkfifo(seed_0 / 'config.json')
  with gzip.open(hyp, 'wb') as f:
    f.write(b'a' * 50_000)
  monkeypatch.setattr(archive, 'MAX_BYTES', 20_000)
  with no_hang():
    assert archive.main(['restore', f'--from={store}', f'--root={root}']) == 2
  err = capsys.readouterr().err
  assert 'config.json is a FIFO' in err and 'holds more than 20,000 bytes once expanded' in err
  (seed_0 / 'config.json').unlink()
  (seed_0 / 'config.json').write_text('{}')
  monkeypatch.setattr(archive, 'MAX_BYTES', 1 << 30)
  monkeypatch.setattr(archive, 'MAX_RUN_BYTES', 30_000)  # all of a run's files together
  assert archive.main(['restore', f'--from={store}', f'--root={root}']) == 2
  assert "run's files hold more than 30,000 bytes in all" in capsys.readouterr().err
  os.rename(store / 'post', tmp_path / 'elsewhere')

  (store / 'post').symlink_to(tmp_path / 'elsewhere')
  with pytest.raises(archive.ArchiveError, match=r'archive/post is a symbolic link'):
    archive.restore(str(store), str(root))


def test_an_archive_or_root_that_is_a_file_is_one_line_and_the_file_is_kept(tmp_path, capsys):
  """save --to FILE and restore --root FILE: exit 2, one line (save's was a traceback-free
  'Not a directory' with exit 1, or 'archived 0 run(s) into FILE' with nothing to save)."""
  plan, store = _archive(tmp_path)
  a_file = tmp_path / 'a_file'
  a_file.write_text('kept\n')
  for argv in (['save', f'--root={plan.root}', f'--to={a_file}'],
               ['restore', f'--from={store}', f'--root={a_file}']):
    assert archive.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == '' and err == (f'python -m experiments.archive: error: {a_file} exists and is '
                                 'not a directory\n')
  assert a_file.read_text() == 'kept\n'


def test_a_failed_restore_leaves_nothing_and_names_the_file_it_wrote(tmp_path, monkeypatch,
                                                                     capsys):
  plan, store = _archive(tmp_path)
  root = tmp_path / 'new'
  copy, calls = archive._copy, []  # pylint: disable=protected-access

  def full(src, dst, **kw):
    calls.append(dst)
    if len(calls) == 3:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)
    return copy(src, dst, **kw)
  monkeypatch.setattr(archive, '_copy', full)
  assert archive.main(['restore', f'--from={store}', f'--root={root}']) == 1
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and f'No space left on device ({calls[2]})' in err
  assert calls[2].startswith(str(root))
  assert os.listdir(root / 'post') == []
  monkeypatch.setattr(archive, '_copy', copy)
  assert archive.restore(str(store), str(root)) == ['post/seed_0', 'post/seed_1']
  new = sweep_file.plan(plan.sweep, str(root))
  assert [launch.run_state(new, r)[0] for r in new.runs] == ['done', 'done']


def test_a_missing_preset_and_a_nan_override_are_refused_in_plain_words(tmp_path):
  with pytest.raises(SweepError) as e:
    sweep_file.plan(_sweep(config='configs/default.py:nope'), str(tmp_path))
  assert _one_line(e) == ("config 'configs/default.py:nope': configs/default.py: unknown preset "
                          "'nope'; known: tiny")
  with pytest.raises(SweepError) as e:
    sweep_file.plan(_sweep(rows={'a': {'model.dropout_rate': float('nan')}}), str(tmp_path))
  assert 'dropout_rate=nan must be a finite number' in _one_line(e)
  assert 'survive' not in str(e.value)


# ----------------------------------------------------------------------------- causes 15, 19, 20

@pytest.mark.parametrize('fields, message', [
    ({'seeds': 10**9}, 'seeds=1000000000 would plan 1,000,000,000 runs a row'),
    ({'grid': {'model.dropout_rate': [0.1] * 1000, 'optimizer.learning_rate': [0.5] * 1000}},
     'the sweep plans 2,000,000 row(s) x 2 seed(s) = 4,000,000 runs: at most 1,000 rows'),
    ({'rows': {f'r{i}': {} for i in range(600)}, 'seeds': 20}, '= 12,000 runs'),
    ({'rows': {5: {}}}, 'row name 5 is int, not a string'),
    ({'rows': {'a' * 300: {}}}, 'has 300 characters, more than 160'),
    ({'rows': {'a\n': {}}}, "row name 'a\\n' is not a directory name"),
])
def test_absurd_plans_and_row_names_are_refused_before_anything_is_built(tmp_path, fields,
                                                                        message):
  with pytest.raises(SweepError) as e:
    sweep_file.plan(_sweep(**fields), str(tmp_path / 'root'))
  assert message in _one_line(e)
  assert not (tmp_path / 'root').exists()


def test_a_planted_lock_and_a_sweep_file_that_exits_are_one_line(cli):
  for name, want in (('linked_lock', 'lock is a symbolic link'), ('folder_lock', 'Is a directory'),
                     ('exits', 'the sweep file called sys.exit(0)')):
    code, _, err = cli[name]
    assert code == 2 and err.count('\n') == 1 and want in err, err
  assert not (cli['tmp'] / 'elsewhere').exists() and not (cli['tmp'] / 'x').exists()


# ----------------------------------------------------------------------------- cause 21

def test_a_run_whose_outputs_lost_lines_is_evaluated_again_not_done(tmp_path, monkeypatch):
  plan = sweep_file.plan(_sweep(), str(tmp_path / 'root'))
  for run in plan.runs:
    _fake_run(plan, run)
  _fake_run(plan, plan.runs[0], hyps=['only one line'])
  assert _counted(plan) == {'post': 1, 'pre': 2}
  monkeypatch.setattr(job_lib, 'trained_step', lambda workdir: 40)  # its checkpoints are kept
  assert launch.run_state(plan, plan.runs[0]) == (
      'trained', 'to evaluate again: validation.hyp has 1 lines, results.json says 3')
  assert [launch.run_state(plan, r)[0] for r in plan.runs[1:]] == ['done'] * 3
