"""sweep.py: a sweep file's plan and its refusals, the runs end to end with the local executor
(a kill and a resume, a run that fails), the table, and the SLURM job array (a fake sbatch)."""

import dataclasses
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from configs import resolve
from configs.sweeps import Sweep
from experiments import launch, sweep_file
from experiments.sweep_file import SweepError
from tests.mains import run_mains
from tests.training import test_train_synthetic as syn

TINY = 'configs/default.py:tiny'
# Few steps of the tiny model, a checkpoint every 10, no BLEU during training: the sweep's
# own evaluation decodes the first sentences of both splits (greedy, 4 tokens: cheap).
# 40 steps: the third run is interrupted after its first checkpoint, well before its end even
# on a loaded machine.
QUICK = {'train.num_steps': 40, 'train.checkpoint_every_steps': 10, 'train.max_checkpoints': 2,
         'train.eval_every_steps': 40, 'train.log_every_steps': 20,
         'train.num_eval_batches': 1, 'decode.num_eval_sentences': 0}
DECODE = {'beam_size': 1, 'max_new_tokens': 4}
EVAL_SENTENCES = 24


def _sweep_file(tmp_path, rows: dict, name: str = 'exp', **fields) -> str:
  path = tmp_path / f'{name}.py'
  args = {'config': TINY, 'overrides': QUICK, 'rows': rows, 'seeds': 2, 'decode': DECODE,
          'eval_sentences': EVAL_SENTENCES, **fields}
  path.write_text(textwrap.dedent(f'''
      from configs.sweeps import Sweep
      def get_sweep():
        return Sweep(**{args!r})
  '''))
  return str(path)


# ----------------------------------------------------------------------------- the plan

def test_plan_rows_grid_and_seeds(tmp_path):
  sweep = Sweep(config=TINY, rows={'post': {'model.norm_position': 'post'},
                                   'pre': {'model.norm_position': 'pre'}},
                grid={'optimizer.learning_rate': [0.5, 1.0]}, seeds=[3, 7])
  plan = sweep_file.plan(sweep, str(tmp_path))
  assert plan.rows == ('post+learning_rate=0.5', 'post+learning_rate=1.0',
                       'pre+learning_rate=0.5', 'pre+learning_rate=1.0')
  assert plan.baseline == 'post+learning_rate=0.5'
  assert [r.seed for r in plan.runs[:2]] == [3, 7]
  run = plan.runs[3]
  assert run.workdir == str(tmp_path / 'post+learning_rate=1.0' / 'seed_7')
  assert '--config.optimizer.learning_rate=1.0' in run.args
  assert '--config.train.seed=7' in run.args and run.args[-1] == '--config.train.seed=7'
  # The runs' command lines parse, as train.py parses them, to the values the file gave.
  spec = run.args[0].split('=', 1)[1]
  config, _ = resolve.resolve(spec, resolve.parse_command_line(spec, run.args[2:]))
  assert (config.model.norm_position, config.optimizer.learning_rate, config.train.seed) == (
      'post', 1.0, 7)
  only_grid = sweep_file.plan(Sweep(config=TINY, grid={'model.dropout_rate': [0.0, 0.3]}),
                              str(tmp_path))
  assert only_grid.rows == ('dropout_rate=0.0', 'dropout_rate=0.3')
  by_seed = sweep_file.plan(dataclasses.replace(sweep, order='seed'), str(tmp_path))
  assert [r.name for r in by_seed.runs[:5]] == [
      'post+learning_rate=0.5/seed_3', 'post+learning_rate=1.0/seed_3',
      'pre+learning_rate=0.5/seed_3', 'pre+learning_rate=1.0/seed_3',
      'post+learning_rate=0.5/seed_7']
  assert sorted(by_seed.runs, key=lambda r: r.name) == sorted(plan.runs, key=lambda r: r.name)


def test_the_tables_rows_read_as_what_each_changes_in_the_row_it_is_compared_with(tmp_path):
  """A screen's rows repeat the preset's fields: the table lists each as the baseline plus its
  own option (the previous row, in a ladder), and in full where that is not shorter."""
  from experiments import table  # pylint: disable=import-outside-toplevel
  preset = {'model.dropout_rate': 0.2, 'train.num_steps': 30, 'train.batch_size': 8}
  short = {'model.dropout_rate': 0.2, 'train.batch_size': 8}
  sweep = Sweep(config=TINY, rows={'base': preset, 'pre': {**preset, 'model.norm_position': 'pre'},
                                   'short': short, 'none': {}})

  def rows_line(plan):
    return next(line for line in table.markdown(plan, table.collect(plan)).splitlines()
                if line.startswith('- rows: '))
  assert rows_line(sweep_file.plan(sweep, str(tmp_path))) == (
      f"- rows: `base` {preset}; `pre` = `base` + {{'model.norm_position': 'pre'}}; "
      "`short` = `base` less ['train.num_steps']; `none` (the config as is)")
  ladder = sweep_file.plan(dataclasses.replace(sweep, compare='previous'), str(tmp_path))
  assert rows_line(ladder).endswith(
      f"`pre` = `base` + {{'model.norm_position': 'pre'}}; `short` {short}; "
      "`none` (the config as is)")


@pytest.mark.parametrize('fields, message', [
    ({'rows': {'a': {}, 'b': {'model.nrm_position': 'pre'}}},
     "row 'b': unknown config field 'model.nrm_position'; did you mean "
     'config.model.norm_position?'),
    ({'rows': {'a': {}, 'b': {'train.num_steps': 'many'}}}, "row 'b':"),
    ({'rows': {'a': {}, 'b': {'model.num_heads': 3}}}, "row 'b': config.model"),
    ({'rows': {'a': {}, 'b': {'model.norm_position': 'middle'}}},
     "row 'b': config.model.norm_position='middle' is not one of"),
    ({'rows': {'a': {'train.seed': 1}}}, 'train.seed comes from seeds='),
    ({'rows': {'a/b': {}}}, "row name 'a/b' is not a directory name"),
    ({'seeds': 0}, 'seeds=0 must be at least 1'),
    ({'seeds': [1, 1]}, 'lists a seed twice'),
    ({'baseline': 'c'}, "baseline='c' is not a row"),
    ({'order': 'random'}, "order='random' is not one of ['row', 'seed']"),
    ({'compare': 'next'}, "compare='next' is not one of ['baseline', 'previous']"),
    ({'compare': 'previous', 'baseline': 'b'}, "its baseline is the first row ('a'), not 'b'"),
    ({'decode': {'beam_szie': 2}}, "decode has unknown setting(s) ['beam_szie']"),
    ({'decode': {'alpha': [0.6, 0.6]}}, "decode['alpha']=[0.6, 0.6]: a choice lists distinct"),
    ({'decode': {'alpha': [0.6, -1.0]}}, "decode['alpha']=-1.0"),
    ({'decode': {'strategy': 'greedy', 'alpha': 0.6}}, "decode['alpha'] applies to beam"),
    ({'metric': 'ter'}, "metric='ter' is not one of"),
    ({'config': 'configs/nope.py'}, "config 'configs/nope.py' not found"),
])
def test_bad_sweep_refused_before_anything_runs(tmp_path, fields, message):
  args = {'config': TINY, 'rows': {'a': {}, 'b': {}}, **fields}
  with pytest.raises(SweepError) as e:
    sweep_file.plan(Sweep(**args), str(tmp_path / 'root'))
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'root').exists()


def test_every_shipped_sweep_file_plans(tmp_path):
  """configs/sweeps/*.py: each file's rows parse to valid configs (a typo in a row is refused
  here, not hours into a sweep), and planning writes nothing."""
  import glob  # pylint: disable=import-outside-toplevel
  paths = sorted(p for p in glob.glob(os.path.join(syn.REPO, 'configs', 'sweeps', '*.py'))
                 if not p.endswith('__init__.py'))
  assert len(paths) >= 4
  for path in paths:
    root = tmp_path / os.path.basename(path)
    plan = sweep_file.plan(sweep_file.load(path), str(root), path)
    assert plan.runs and plan.baseline in plan.rows, path
    assert not root.exists()


def test_only_selects_runs_by_name_or_row_and_refuses_a_pattern_that_matches_none(tmp_path):
  sweep = Sweep(config=TINY, rows={'post': {'model.norm_position': 'post'},
                                   'pre': {'model.norm_position': 'pre'}}, seeds=3)
  plan = sweep_file.plan(sweep, str(tmp_path))
  names = lambda only: [r.name for r in sweep_file.selected(plan, only)]  # noqa: E731
  assert names([]) == [r.name for r in plan.runs]
  assert names(['pre']) == ['pre/seed_0', 'pre/seed_1', 'pre/seed_2']
  assert names(['post/seed_2', '*/seed_0']) == ['post/seed_0', 'post/seed_2', 'pre/seed_0']
  with pytest.raises(SweepError, match=r'--only=pre/seed_7 matches no run') as e:
    sweep_file.selected(plan, ['pre', 'pre/seed_7'])
  assert 'post/seed_0' in str(e.value) and '\n' not in str(e.value)
  # --dry_run describes the selection: the runs left out say so, the estimate counts the rest.
  lines = launch.describe(plan, only=['pre/seed_1'])
  assert lines[0].split() == ['post/seed_0', 'new,', 'not', 'selected', '(--only)']
  assert lines[4].split()[:2] == ['pre/seed_1', 'new,']
  assert 'selected' not in lines[4]
  assert lines[-1].endswith('for the 1 selected run(s) not done (--only)'), lines[-1]
  with pytest.raises(SweepError, match=r'--only=nope matches no run'):
    launch.describe(plan, only=['nope'])


def test_cli_refusals_are_one_line_and_write_nothing(tmp_path):
  bad_row_7 = {f'r{i}': {'model.dropout_rate': 0.1} for i in range(6)}
  bad_row_7['r6'] = {'model.dropout_rat': 0.1}
  runs = [[f'--sweep={_sweep_file(tmp_path, bad_row_7)}', f'--root={tmp_path / "a"}'],
          [f'--sweep={tmp_path / "missing.py"}', f'--root={tmp_path / "b"}'],
          [f'--sweep={_sweep_file(tmp_path, {"x": {}}, name="ok")}', f'--root={tmp_path / "c"}',
           '--parallel=0'],
          [f'--sweep={_sweep_file(tmp_path, {"x": {}}, name="ok2")}', f'--root={tmp_path / "e"}',
           '--only=y']]
  (tmp_path / 'not_a_sweep.py').write_text('def get_sweep():\n  return {}\n')
  runs.append([f'--sweep={tmp_path / "not_a_sweep.py"}', f'--root={tmp_path / "d"}'])
  runs.append([*runs[3][:1], f'--root={tmp_path / "f"}', '--only=y', '--dry_run'])
  # A root that is a file or lies below one (dry run or not), a sweep file that is a folder.
  a_file = tmp_path / 'a_file'
  a_file.write_text('kept\n')
  ok = runs[2][0]
  runs += [[ok, f'--root={a_file}'], [ok, f'--root={a_file}/r'],
           [ok, f'--root={a_file}/r', '--dry_run'], [f'--sweep={tmp_path}', f'--root={a_file}/s']]
  results = run_mains(runs, script='sweep.py')
  expected = ["row 'r6': unknown config field 'model.dropout_rat'", 'not found',
              '--parallel=0 must be at least 1', '--only=y matches no run',
              'returned dict, not a Sweep', '--only=y matches no run',
              f'--root={a_file} is not a directory', *[f'--root={a_file}/r lies below {a_file}, '
                                                     'a file'] * 2, f"'{tmp_path}' is not a file"]
  for (code, out, err), want, name in zip(results, expected, 'abcedfghij', strict=True):
    assert code == 2 and out == '', err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('sweep.py: error: ') and want in lines[0], err
    assert not (tmp_path / name).exists()
  assert a_file.read_text() == 'kept\n'


# ----------------------------------------------------------------------------- end to end

def _sweep(*args, wait=True):
  cmd = [sys.executable, 'sweep.py', '--executor=local', *args]
  proc = subprocess.Popen(cmd, cwd=syn.REPO, env=syn.subprocess_env(None), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL)
  if not wait:
    return proc
  out, _ = proc.communicate()
  return proc.returncode, out


def _digest(directory) -> dict:
  """Every file under `directory` -> its SHA-256 (the lock file's holder line aside)."""
  out = {}
  for base, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(base, name)
      if name != 'train.lock':
        with open(path, 'rb') as f:
          out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return out


def _checkpoints(workdir) -> list[int]:
  directory = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(
      directory) else []


def _proc_status(pid: int, field: str) -> str:
  """A field of /proc/PID/status ('' when the process is gone)."""
  try:
    with open(f'/proc/{pid}/status', encoding='ascii') as f:
      return next((line.split()[1] for line in f if line.startswith(f'{field}:')), '')
  except OSError:
    return ''


def _pending(pid: int) -> int:
  """The signals sent to process `pid` and not yet delivered (bit N-1: signal N)."""
  return int(_proc_status(pid, 'ShdPnd') or '0', 16)


def _gone(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  try:
    with open(f'/proc/{pid}/stat', encoding='ascii') as f:  # a zombie is gone
      return f.read().rsplit(') ', 1)[-1][:1] in 'ZX'
  except FileNotFoundError:
    return True


def _stop_third_run(proc, root) -> list[int]:
  """SIGTERM to the sweep (a time limit, a batch system; Ctrl-C is the same stop) once the
  third run has its first checkpoint -> the pids of its job and train.py. No clock: the test
  waits for the checkpoint however long a loaded machine takes, then holds train.py
  (SIGSTOP) so that it cannot reach its last step before the stop comes, and lets it go on
  once the sweep's stop, through the job, is pending for it (one SIGINT)."""
  third = root / 'pre' / 'seed_0'
  while not _checkpoints(third) and proc.poll() is None:
    time.sleep(0.02)
  if proc.poll() is not None:
    return []
  status = json.loads((root / '.sweep' / 'status' / 'pre.seed_0.json').read_text())
  train_pid = status['train_pid']
  os.kill(train_pid, signal.SIGSTOP)
  # Stopped, not only sent SIGSTOP: a SIGINT that came before it stopped would be taken (the
  # lower number first) and wait, unseen, for a Python handler that cannot run.
  while _proc_status(train_pid, 'State') not in ('T', ''):
    time.sleep(0.02)
  proc.send_signal(signal.SIGTERM)
  while proc.poll() is None and not _pending(train_pid) & (1 << (signal.SIGINT - 1)):
    time.sleep(0.02)
  os.kill(train_pid, signal.SIGCONT)
  return [status['job_pid'], train_pid]


@pytest.fixture(scope='module')
def swept(tmp_path_factory):
  """A 2-row x 2-seed sweep stopped (SIGTERM) during its third run, run again with a third
  row that fails at run time (a dataset name the schema cannot check), then once more. The
  runs after the stop are `--only=pre,typo/seed_0` (a selection, end to end): the failing row
  fails once, its second seed is never started (a second failure would be the same train.py
  refusal, one more job and train.py start)."""
  tmp = tmp_path_factory.mktemp('sweep')
  rows = {'post': {'model.norm_position': 'post'}, 'pre': {'model.norm_position': 'pre'}}
  first = _sweep_file(tmp, rows)
  root = tmp / 'root'
  proc = _sweep(f'--sweep={first}', f'--root={root}', wait=False)
  pids = _stop_third_run(proc, root)
  interrupted_out, _ = proc.communicate()
  third = root / 'pre' / 'seed_0'
  interrupted = {'code': proc.returncode, 'out': interrupted_out,
                 'checkpoints': _checkpoints(third), 'pids': pids,
                 'orphans': [pid for pid in pids if not _gone(pid)],
                 'digests': {name: _digest(root / name) for name in ('post/seed_0',
                                                                     'post/seed_1')}}
  with_typo = _sweep_file(tmp, {**rows, 'typo': {'data.dataset': 'multi31k'}}, name='exp2')
  # The rerun, then two more that start no job: in one interpreter (the interrupted sweep
  # above is the process a signal stops).
  only = '--only=pre,typo/seed_0'
  rerun, again, dry = ((code, out + err) for code, out, err in run_mains(
      [[f'--sweep={with_typo}', f'--root={root}', '--executor=local', only],
       [f'--sweep={with_typo}', f'--root={root}', '--executor=local', only],
       [f'--sweep={with_typo}', f'--root={root}', '--executor=local', '--dry_run']],
      script='sweep.py'))
  return {'root': root, 'first': first, 'interrupted': interrupted, 'rerun': rerun,
          'again': again, 'dry': dry,
          'plan': sweep_file.plan(sweep_file.load(with_typo), str(root), with_typo)}


def test_interrupted_sweep_keeps_finished_runs_and_resumes(swept):
  """SIGTERM (as Ctrl-C): the running run saves and stops, its job and train.py end with
  the sweep (SIGTERM used to kill sweep.py alone, at once, exit 143: both trained on as
  orphans), and the last line is the command that resumes."""
  first = swept['interrupted']
  assert first['code'] == 130 and first['pids'], first['out']
  assert not first['orphans'], first
  lines = first['out'].strip().splitlines()
  assert 'stopping pre/seed_0: saving checkpoint(s)' in lines[-2], lines
  assert lines[-1].startswith('interrupted: ') and lines[-1].endswith(
      f"--sweep={swept['first']} --root={swept['root']}"), lines
  # The third run saved a checkpoint when stopped, short of its steps.
  assert first['checkpoints'] and first['checkpoints'][-1] < QUICK['train.num_steps']
  root = swept['root']
  for name, digests in first['digests'].items():  # never retrained nor re-evaluated
    assert digests and _digest(root / name) == digests, name
  code, out = swept['rerun']
  log = (root / '.sweep' / 'logs' / 'pre.seed_0.log').read_text()
  assert f'resumed from the checkpoint at step {first["checkpoints"][-1]}' in log
  assert 'start post/' not in out, out
  assert 'done pre/seed_0' in out and 'done pre/seed_1' in out, out


def test_failed_run_reported_and_the_others_finish(swept):
  code, out = swept['rerun']
  assert code == 1, out
  failures = [line for line in out.splitlines() if 'FAILED typo/' in line]
  assert len(failures) == 1 and "unknown dataset 'multi31k'" in failures[0], out
  assert 'typo/seed_1' not in out, out  # not selected
  # A rerun without --retry_failed trains nothing and says why.
  code, out = swept['again']
  assert code == 1 and 'start ' not in out, out
  assert 'failed before (--retry_failed reruns them)' in out, out
  assert out.count('failed before: typo/seed_0') == 1 and 'typo/seed_1' not in out, out


def test_each_run_is_an_evaluated_workdir(swept):
  root = swept['root']
  # The runs share one persistent compilation cache (here the suite's own, which
  # JAX_COMPILATION_CACHE_DIR names: a user's is kept, else the sweep's ROOT/.sweep/xla_cache).
  from experiments import job  # pylint: disable=import-outside-toplevel
  spec = launch.job_spec(swept['plan'], swept['plan'].runs[0])
  assert spec['compilation_cache'] == str(root / '.sweep' / 'xla_cache')
  assert job.compilation_cache(spec, {}) == spec['compilation_cache']
  assert job.compilation_cache(spec, {'JAX_COMPILATION_CACHE_DIR': '/c'}) == '/c'
  for row in ('post', 'pre'):
    for seed in (0, 1):
      workdir = root / row / f'seed_{seed}'
      assert _checkpoints(workdir)[-1] == QUICK['train.num_steps']
      config = json.loads((workdir / 'config.json').read_text())
      assert (config['model']['norm_position'], config['train']['seed']) == (row, seed)
      results = json.loads((workdir / 'sweep_eval' / 'results.json').read_text())
      assert results['decode'] == {**DECODE, 'average_last': 1}
      assert results['eval_sentences'] == EVAL_SENTENCES
      for split, count in (('validation', EVAL_SENTENCES), ('test', EVAL_SENTENCES)):
        assert results[split]['sentences'] == count
        # 4 new tokens after 40 steps: nearly every line stops at the limit, not at EOS.
        assert 0 < results[split]['cut'] <= count
        hyps = (workdir / 'sweep_eval' / f'{split}.hyp').read_text().split('\n')[:-1]
        refs = (workdir / 'sweep_eval' / f'{split}.ref').read_text().split('\n')[:-1]
        assert len(hyps) == len(refs) == count
        from experiments import evaluate  # pylint: disable=import-outside-toplevel
        assert evaluate.scores(hyps, refs)['chrf2'] == results[split]['chrf2']
        assert results[split]['bleu_signature'].startswith('nrefs:1|case:mixed')
        assert 'case:lc' in results[split]['bleu_lowercased_signature']


def test_a_decoding_grid_is_chosen_on_validation_and_test_decoded_once(swept, tmp_path,
                                                                      monkeypatch):
  """`decode` with lists: every combination decodes the validation split, the best validation
  BLEU (ties: the first listed) chooses, and test is decoded once, with the choice; the
  sweep counts the run as evaluated for that grid only."""
  import shutil  # pylint: disable=import-outside-toplevel

  from experiments import evaluate  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / 'run'
  shutil.copytree(swept['root'] / 'pre' / 'seed_0', workdir)
  grid = {'average_last': [1, 2], 'beam_size': 2, 'max_new_tokens': 4, 'alpha': [0.0, 0.6]}
  decoded = []  # the first source line of each decoding pass
  plain = evaluate._decode_split  # pylint: disable=protected-access

  def counted(session, point, examples):
    decoded.append(examples[0]['source'])
    return plain(session, point, examples)
  monkeypatch.setattr(evaluate, '_decode_split', counted)
  results = evaluate.evaluate(str(workdir), {'average_last': 1, **grid}, translates=True,
                              sentences=3)
  from input_pipeline import sources  # pylint: disable=import-outside-toplevel
  from workdir.config_io import load_config  # pylint: disable=import-outside-toplevel
  data = load_config(str(workdir)).data
  valid, test = (sources.split_texts(data, name)[0]['source']
                 for name in (data.eval_split, data.test_split))
  assert decoded == [valid] * 4 + [test]  # test once, with the choice
  points = results['decode_grid']['points']
  assert [(p['decode']['average_last'], p['decode']['alpha']) for p in points] == [
      (1, 0.0), (1, 0.6), (2, 0.0), (2, 0.6)]
  best = max(p['bleu'] for p in points)
  first_best = next(p for p in points if p['bleu'] == best)
  assert results['decode'] == first_best['decode'] and results['validation']['bleu'] == best
  hyps = (workdir / 'sweep_eval' / 'validation.hyp').read_text().split('\n')[:-1]
  refs = (workdir / 'sweep_eval' / 'validation.ref').read_text().split('\n')[:-1]
  assert evaluate.scores(hyps, refs)['bleu'] == best  # the chosen setting's own outputs
  # sweep.py counts it evaluated for this grid (and metric), not for another.
  for decode, done in ((grid, True), ({**grid, 'alpha': [0.0, 1.0]}, False)):
    plan = sweep_file.plan(dataclasses.replace(swept['plan'].sweep, decode=decode,
                                               eval_sentences=3), str(tmp_path / 'r'))
    run = dataclasses.replace(plan.runs[0], workdir=str(workdir), num_steps=results['step'])
    assert launch._evaluated(plan, run) is done  # pylint: disable=protected-access
  # The table says what each run chose (a run it counts: evaluated with its grid and cap).
  from experiments import table  # pylint: disable=import-outside-toplevel
  plan = sweep_file.plan(dataclasses.replace(swept['plan'].sweep, decode=grid,
                                             eval_sentences=3), str(tmp_path / 'r'))
  shutil.copytree(workdir, tmp_path / 'r' / 'pre' / 'seed_0')
  chosen = results['decode']
  assert (f'- chosen: pre {chosen["average_last"]}/{chosen["alpha"]} (average_last/alpha, per '
          'seed)') in table.markdown(plan, table.collect(plan))


def test_table(swept):
  root = swept['root']
  text = (root / 'summary.md').read_text()
  assert (root / 'curves.png').stat().st_size > 10_000
  rows = [line for line in text.splitlines() if line.startswith('| ') and '---' not in line]
  header, post, pre, typo = rows
  assert 'test BLEU' in header and 'Δ vs post' in header and 'valid loss' in header
  assert post.startswith('| post | 2/2 |') and '| baseline |' in post
  assert pre.startswith('| pre | 2/2 |') and 'significant' in pre
  assert typo.startswith('| typo | 0/2 (unfinished) |')
  # The table's mean is the runs' own figures.
  plan = swept['plan']
  values = [json.loads((root / 'pre' / f'seed_{s}' / 'sweep_eval' / 'results.json')
                       .read_text())['test']['bleu'] for s in (0, 1)]
  import statistics  # pylint: disable=import-outside-toplevel
  assert f'{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}' in pre
  assert plan.baseline == 'post'
  ms = header.split(' | ').index('ms/step')
  assert float(pre.split(' | ')[ms]) > 0  # the median step of train.py's log
  # Training minutes average the finished runs only: a row whose runs all have events but
  # none finished shows none (a stopped run's few minutes pulled a row's mean down).
  from experiments import table  # pylint: disable=import-outside-toplevel
  minutes = header.split(' | ').index('train min/run')
  rows = table.collect(plan)
  # The runs' own event-file minutes, not "> 0": a warm machine trains these tiny runs in
  # seconds, which the table rounds to 0.0.
  runs_minutes = [table._minutes(r) for r in next(r for r in rows if r.name == 'pre').finished]  # pylint: disable=protected-access
  assert len(runs_minutes) == 2 and all(m > 0 for m in runs_minutes), runs_minutes
  assert pre.split(' | ')[minutes] == f'{statistics.mean(runs_minutes):.1f}', pre
  rows = [dataclasses.replace(r, finished=[], results=[], test_outputs=[]) if r.name == 'pre'
          else r for r in rows]
  unfinished = next(line for line in table.markdown(plan, rows).splitlines()
                    if line.startswith('| pre |'))
  assert unfinished.split(' | ')[minutes] == '-', unfinished
  # A ladder (compare='previous'): each row against the one before it, here pre then post.
  ladder = dataclasses.replace(plan.sweep, rows={'pre': plan.row_overrides['pre'],
                                                 'post': plan.row_overrides['post']},
                               compare='previous')
  ladder = sweep_file.plan(ladder, str(root), plan.path)
  header2, first, second = [line for line in table.markdown(ladder, table.collect(ladder))
                            .splitlines() if line.startswith('| ') and '---' not in line]
  assert 'Δ vs previous row' in header2 and first.startswith('| pre |') and '| baseline |' in first
  delta = float(pre.split(' | ')[4].split()[0])
  assert second.startswith('| post |') and float(second.split(' | ')[4].split()[0]) == -delta


def test_dry_run_shows_states_and_measured_time(swept):
  code, out = swept['dry']
  assert code == 0, out
  assert out.count(' done') >= 4 and 'typo/seed_0 failed (train.py: error: unknown' in out, out
  assert '4 of 6 runs done' in out, out


def test_archived_runs_restore_as_done_with_the_same_table(swept, tmp_path):
  """`experiments.archive`: the evaluated runs without checkpoints, put back into another root,
  are done for sweep.py and give the table the same rows; a second restore writes nothing."""
  from experiments import archive, table  # pylint: disable=import-outside-toplevel
  saved = archive.save(str(swept['root']), str(tmp_path / 'archive'))
  assert saved == ['post/seed_0', 'post/seed_1', 'pre/seed_0', 'pre/seed_1']  # not the typos
  assert archive.save(str(swept['root']), str(tmp_path / 'archive')) == []
  old = swept['plan']
  new = sweep_file.plan(old.sweep, str(tmp_path / 'root'), old.path)
  assert archive.restore(str(tmp_path / 'archive'), new.root) == saved
  assert archive.restore(str(tmp_path / 'archive'), new.root) == []
  states = {f'{r.row}/seed_{r.seed}': launch.run_state(new, r)[0] for r in new.runs}
  assert [name for name, state in states.items() if state == 'done'] == saved, states
  for before, after in zip(table.collect(old), table.collect(new), strict=True):
    assert (before.results, before.test_outputs, before.references) == (
        after.results, after.test_outputs, after.references), before.name


# ----------------------------------------------------------------------------- SLURM

FAKE_SBATCH = """#!/bin/sh
# Records the submission (its arguments and the batch file) and answers as sbatch does.
echo "$@" >> "{log}"
for last; do :; done
cp "$last" "{script}"
echo "Submitted batch job 4242"
"""


def test_slurm_job_array_gets_the_commands_and_parameters(tmp_path, monkeypatch):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  log, script = tmp_path / 'sbatch.args', tmp_path / 'sbatch.sh'
  for name, text in (('sbatch', FAKE_SBATCH.format(log=log, script=script)),
                     ('srun', '#!/bin/sh\nexit 0\n')):
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  monkeypatch.setenv('PATH', f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  assert launch.executor_kind('auto') == 'slurm'  # submitit's choice where srun exists
  sweep = Sweep(config=TINY, rows={'post': {'model.norm_position': 'post'},
                                   'pre': {'model.norm_position': 'pre'}}, seeds=2,
                slurm={'partition': 'gpu', 'time_min': 90, 'gpus_per_node': 1})
  plan = sweep_file.plan(sweep, str(tmp_path / 'root'))
  executor = launch.make_executor(plan, 'slurm', parallel=2, slurm={'cpus_per_task': 8})
  specs = [launch.job_spec(plan, run) for run in plan.runs]
  jobs = launch.submit(executor, 'slurm', specs)
  assert [job.job_id for job in jobs] == ['4242_0', '4242_1', '4242_2', '4242_3']
  batch = script.read_text()
  for line in ('#SBATCH --array=0-3%2', '#SBATCH --partition=gpu', '#SBATCH --time=90',
               '#SBATCH --gpus-per-node=1', '#SBATCH --cpus-per-task=8'):
    assert line in batch, batch
  assert 'srun' in batch and 'submitit.core._submit' in batch
  # Each array task's pickled job: run_job on its run's train.py command line.
  import cloudpickle  # pylint: disable=import-outside-toplevel
  for job, run in zip(jobs, plan.runs, strict=True):
    with open(job.paths.submitted_pickle, 'rb') as f:
      delayed = cloudpickle.load(f)
    assert delayed.function.__name__ == 'run_job'
    (spec,) = delayed.args
    assert spec['args'] == list(run.args) and spec['workdir'] == os.path.abspath(run.workdir)
