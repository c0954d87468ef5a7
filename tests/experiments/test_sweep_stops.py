"""How a sweep's job stops (issue 81): a stop during the evaluation ends the evaluation, a
killed job's train.py stops instead of training on as an orphan, a killed train.py is said to
be killed. The job runs for real (`experiments.job.run_job`, in its own process) with a stand-in
train.py; no clock: each test waits on what the processes say or do."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.training import test_train_synthetic as syn

# `run_job(SPEC)` in a fresh process, its status printed as JSON. The evaluation's work (a
# language model's, `_language_model`) is a stand-in that sends the process SIGNAL (MODE
# 'raised:SIGNAL') or sends it and drops the KeyboardInterrupt (MODE 'dropped:SIGNAL'), as
# Python does when it lands in a gc callback; MODE 'none': no evaluation stand-in. Where
# run_job returns before train.py opened FIFO (argv[3]), this process writes its status there.
_JOB = '''
import json, os, signal, sys
from experiments import evaluate, job
spec, mode = json.loads(sys.argv[1]), sys.argv[2]

def evaluation(workdir):
  kind, _, name = mode.partition(':')
  try:
    os.kill(os.getpid(), getattr(signal, name))  # the handler runs before os.kill returns
  except KeyboardInterrupt:
    if kind == 'raised':
      raise
  return {'step': 0, 'parameters': 1, 'validation': {'loss': 1.0}}

if mode != 'none':
  evaluate._language_model = evaluation
status = job.run_job(spec)
if len(sys.argv) > 3:
  with open(sys.argv[3], 'w') as fifo:
    fifo.write(json.dumps(status) + '\\n')
print(json.dumps(status))
'''


def _spec(tmp_path, train_py: str, num_steps: int, *args: str) -> dict:
  """A job's spec (launch.job_spec's keys) whose train.py is `train_py`'s source."""
  repo = tmp_path / 'repo'
  repo.mkdir()
  (repo / 'train.py').write_text(train_py)
  return {'row': 'r', 'seed': 0, 'workdir': str(tmp_path / 'run'), 'args': list(args),
          'num_steps': num_steps, 'translates': False, 'decode': {}, 'eval_sentences': None,
          'metric': 'bleu', 'status_file': str(tmp_path / 'status' / 'r.seed_0.json'),
          'log_file': str(tmp_path / 'logs' / 'r.seed_0.log'), 'repo': str(repo),
          'compilation_cache': None}


def _env() -> dict:
  env = syn.subprocess_env(1)
  env.pop('JAX_COMPILATION_CACHE_DIR')  # the job would enable it: a JAX import for nothing
  return env


def _job(spec: dict, mode: str, *fifo: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-c', _JOB, json.dumps(spec), mode, *fifo],
                          cwd=syn.REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)


def _status(proc: subprocess.Popen) -> dict:
  out, err = proc.communicate()
  assert proc.returncode == 0, err
  return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize('mode', ['raised:SIGINT', 'dropped:SIGTERM'])
def test_a_stop_during_the_evaluation_ends_it(tmp_path, mode):
  """Cause 7: train.py has ended; the sweep's SIGINT (or SLURM's SIGTERM) comes while the run
  is evaluated. It used to go to train.py, already gone: the evaluation went on and wrote
  'done' as an orphan. Now it ends the evaluation: 'interrupted', no results.json (evaluated
  again on the next sweep.py), also when Python dropped the KeyboardInterrupt."""
  spec = _spec(tmp_path, 'pass\n', 0)
  status = _status(_job(spec, mode))
  assert status['state'] == 'interrupted', status
  assert status['error'].startswith('stopped while evaluating'), status
  assert not os.path.exists(os.path.join(spec['workdir'], 'sweep_eval', 'results.json'))
  with open(spec['status_file']) as f:
    assert json.load(f)['state'] == 'interrupted'


# train.py's stand-in: writes its pid to the FIFO (argv[1]), then waits for a signal and writes
# its name there: SIGTERM (what the job's death sends), or SIGWINCH (the test's own, after it).
# Both are blocked and taken by sigwait, which takes the lowest-numbered pending signal: were both
# pending, SIGTERM. (With Python handlers a loaded full-suite run read SIGWINCH once,
# 2026-12-03: the order was Python's; sigwait's is the kernel's.) Unbuffered writes.
_WAITING_TRAIN_PY = '''
import os, signal, sys
said = os.open(sys.argv[1], os.O_WRONLY)
signals = {signal.SIGTERM, signal.SIGWINCH}
signal.pthread_sigmask(signal.SIG_BLOCK, signals)
os.write(said, f'{os.getpid()}\\n'.encode())
os.write(said, (signal.Signals(signal.sigwait(signals)).name + '\\n').encode())
'''


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG: Linux')
def test_a_killed_jobs_train_py_stops_instead_of_training_on(tmp_path):
  """Cause 22: train.py runs in a session of its own (a terminal's Ctrl-C reaches it once,
  through the job); a SIGKILLed job left it training to the end as an orphan. Now it gets
  SIGTERM (save and stop) when the job dies. The order of the two signals says which came
  first: the kernel sends SIGTERM as the job dies, before its parent sees it end; the test's
  SIGWINCH comes after (and, were both pending, SIGTERM is delivered first: the lower number)."""
  fifo = str(tmp_path / 'said')
  os.mkfifo(fifo)
  proc = _job(_spec(tmp_path, _WAITING_TRAIN_PY, 10, fifo), 'none', fifo)
  try:
    with open(fifo) as said:  # blocks until train.py (or the job, ending early) opens it
      first = said.readline().strip()
      assert first.isdigit(), first  # train.py's pid, not the job's status
      proc.kill()
      proc.wait()
      with contextlib.suppress(ProcessLookupError):
        os.kill(int(first), signal.SIGWINCH)
      assert said.readline() == 'SIGTERM\n'
  finally:
    proc.kill()
    proc.communicate()


def test_a_killed_train_py_is_said_killed_not_its_last_progress_line(tmp_path):
  """Cause 22: train.py killed (the out-of-memory killer's SIGKILL) was reported with its
  log's last line, a progress line, as "the error". (The job runs in this process: what is
  checked is how it reads train.py's end, not how the job's own process ends.)"""
  from experiments import job  # pylint: disable=import-outside-toplevel
  train_py = ('import os, signal\n'
              "print('step 20/40: loss 3.21, 1.5 steps/s', flush=True)\n"
              'os.kill(os.getpid(), signal.SIGKILL)\n')
  spec = _spec(tmp_path, train_py, 40)
  status = job.run_job(spec)
  assert status['state'] == 'failed', status
  assert status['error'] == (f'train.py was killed by SIGKILL (the out-of-memory killer?); '
                             f'its output: {spec["log_file"]}'), status
  assert status['exit_code'] == -signal.SIGKILL


# ----------------------------------------------------------------------------- sweep.py

TINY = 'configs/default.py:tiny'


def _sweep_file(tmp_path, **fields) -> str:
  path = tmp_path / 'exp.py'
  args = {'config': TINY, 'rows': {'post': {'model.norm_position': 'post'},
                                   'pre': {'model.norm_position': 'pre'}}, **fields}
  path.write_text(f'from configs.sweeps import Sweep\n\ndef get_sweep():\n'
                  f'  return Sweep(**{args!r})\n')
  return str(path)


def test_a_ctrl_c_that_python_drops_while_planning_stops_the_sweep(tmp_path):
  """Cause 9: sweep.py had SIGINT raise a plain KeyboardInterrupt; one that landed in a gc
  callback (JAX registers one) while the plan was checked was printed as "Exception ignored"
  and lost: --dry_run printed the whole plan and exited 0, a run trained. Now the project's
  handler remembers it: one line, exit 130, nothing printed or written."""
  from tests.mains import dropped_ctrl_c  # pylint: disable=import-outside-toplevel
  root = tmp_path / 'root'
  planning = ("any(f.f_code.co_name == 'plan' and f.f_code.co_filename.endswith("
              "'sweep_file.py') for f in frames)")
  proc = subprocess.run([sys.executable, '-c', dropped_ctrl_c('sweep.py', planning),
                         f'--sweep={_sweep_file(tmp_path)}', f'--root={root}', '--dry_run'],
                        cwd=syn.REPO, env=syn.subprocess_env(1), capture_output=True, text=True,
                        stdin=subprocess.DEVNULL, check=False)
  assert proc.returncode == 130, (proc.stdout, proc.stderr)
  assert proc.stderr.splitlines() == ['sweep.py: error: interrupted; no run was started'], (
      proc.stderr)
  assert proc.stdout == '' and not root.exists()


@pytest.mark.parametrize('slurm, flags, message', [
    ({'partition': 'gpu\n#SBATCH --wrap=rm'}, {},
     r"slurm['partition']='gpu\n#SBATCH --wrap=rm' must be a SLURM name"),
    ({'account': 'a b'}, {}, "slurm['account']='a b' must be a SLURM name"),
    ({'qos': ''}, {}, "slurm['qos']='' must be a SLURM name"),
    ({'time_min': '90'}, {}, "slurm['time_min']='90' must be an integer in [1, "),
    ({'gpus_per_node': True}, {}, "slurm['gpus_per_node']=True must be an integer in [0, "),
    ({'mem_gb': 7.5}, {}, "slurm['mem_gb']=7.5 must be an integer in [1, "),
    ({'time_min': 90}, {'mem_gb': -5}, '--slurm_mem_gb=-5 must be an integer in [1, '),
    ({}, {'time_min': -1}, '--slurm_time_min=-1 must be an integer in [1, '),
    ({}, {'cpus_per_task': 0}, '--slurm_cpus_per_task=0 must be an integer in [1, '),
    ({'gpus': 1}, {}, "slurm has unknown field(s) ['gpus']"),
])
def test_slurm_fields_are_checked(tmp_path, slurm, flags, message):
  """Cause 16: the sweep file's `slurm` and the --slurm_* flags went to submitit unchecked:
  -1 or -5 GB, and a newline that ended the #SBATCH block and ran the rest as shell."""
  from configs.sweeps import Sweep  # pylint: disable=import-outside-toplevel
  from experiments import launch, sweep_file  # pylint: disable=import-outside-toplevel
  with pytest.raises(sweep_file.SweepError) as e:
    plan = sweep_file.plan(Sweep(config=TINY, slurm=slurm), str(tmp_path / 'root'))
    launch.slurm_fields(plan, flags)
  assert message in str(e.value) and '\n' not in str(e.value), str(e.value)


def test_bad_slurm_flags_are_one_line_before_anything(tmp_path):
  from tests.mains import run_mains  # pylint: disable=import-outside-toplevel
  sweep = _sweep_file(tmp_path)
  results = run_mains([[f'--sweep={sweep}', f'--root={tmp_path / "a"}', '--dry_run',
                        '--slurm_time_min=-1'],
                       [f'--sweep={sweep}', f'--root={tmp_path / "b"}', '--executor=slurm',
                        '--slurm_mem_gb=-5']], script='sweep.py')
  for (code, _, err), flag in zip(results, ('--slurm_time_min=-1', '--slurm_mem_gb=-5'),
                                  strict=True):
    assert code == 2 and err.startswith(f'sweep.py: error: {flag} must be an integer'), err
    assert len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()


def test_slurm_time_limit_comes_from_the_estimate_or_is_required(tmp_path, monkeypatch):
  """Cause 16: without `time_min` every run got submitit's default, `#SBATCH --time=5` (5
  minutes): every real run was killed. Now it is twice the longest run's estimate plus a
  margin, or, before any run of a row has a measured step time, required in one line."""
  from configs.sweeps import Sweep  # pylint: disable=import-outside-toplevel
  from experiments import launch, report, sweep_file  # pylint: disable=import-outside-toplevel
  root = tmp_path / 'root'
  plan = sweep_file.plan(Sweep(config=TINY, rows={'a': {}}, seeds=2,
                               overrides={'train.num_steps': 600}), str(root))
  with pytest.raises(sweep_file.SweepError, match=r"slurm time_min is required: row\(s\) "
                     r"\['a'\] have no measured step time") as e:
    launch.run(plan, executor='slurm', slurm={'partition': 'gpu'}, out=lambda line: None)
  assert '\n' not in str(e.value) and not root.exists()  # nothing written, nothing submitted
  monkeypatch.setattr(report, 'median_step_ms', lambda workdir: 500.0)  # a row's measurement
  minutes, line = launch.slurm_time_min(plan, plan.runs)
  assert minutes == 2 * 5 + launch.SLURM_TIME_MARGIN_MIN  # 600 steps x 0.5 s = 5 min, x 2
  assert line.startswith(f'SLURM time limit: {minutes} min per run (twice the longest '
                         'estimate, 5.0 min'), line


def test_a_root_that_sbatch_cannot_hold_is_refused(tmp_path):
  """Cause 16: the root's path goes into #SBATCH lines (the job's output files): a newline in
  it would end the block and run the rest as shell."""
  from configs.sweeps import Sweep  # pylint: disable=import-outside-toplevel
  from experiments import launch, sweep_file  # pylint: disable=import-outside-toplevel
  root = tmp_path / 'r\n#SBATCH --wrap=x'
  plan = sweep_file.plan(Sweep(config=TINY, slurm={'time_min': 60}), str(root))
  with pytest.raises(sweep_file.SweepError, match="has spaces or control characters") as e:
    launch.run(plan, executor='slurm', out=lambda line: None)
  assert '\n' not in str(e.value) and not root.exists()
