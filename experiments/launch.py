"""Running a planned sweep: which runs are done, what they will cost, and the jobs, through
submitit (SLURM job arrays, or local subprocesses), with progress, failures and Ctrl-C
(or SIGTERM: the same stop, `_stop`).

Everything a sweep keeps besides its runs' workdirs is under `ROOT/.sweep/`: `sweep.json`
(the rows as first planned: a later invocation may add rows and seeds, not change one),
`status/ROW.seed_S.json` (each job's state and last error), `logs/ROW.seed_S.log` (train.py's
output), `jobs/` (submitit's files) and a lock (one sweep.py per root).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from common import interrupts
from common.errors import carried
from experiments import evaluate, job as job_lib
from experiments.runs import check_runs, eval_settings, evaluated, write_file
from experiments.sweep_file import Plan, Run, SweepError, selected

STATE_DIR = '.sweep'
NEW, PARTIAL, TRAINED = 'new', 'partial', 'trained'  # besides job_lib's DONE and FAILED
EXECUTORS = ('auto', 'local', 'slurm')
LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # submitit's local default (2 min) would kill every run
POLL_S = 1.0
STOP_POLL_S = 0.2


def state_dir(root: str, *parts: str) -> str:
  return os.path.join(root, STATE_DIR, *parts)


def status_file(plan: Plan, run: Run) -> str:
  return state_dir(plan.root, 'status', f'{run.row}.seed_{run.seed}.json')


def log_file(plan: Plan, run: Run) -> str:
  return state_dir(plan.root, 'logs', f'{run.row}.seed_{run.seed}.log')


def job_spec(plan: Plan, run: Run) -> dict[str, Any]:
  """What `job.run_job` needs: plain data, so that it pickles for any executor."""
  from experiments.sweep_file import REPO  # pylint: disable=import-outside-toplevel
  workdir = os.path.abspath(run.workdir)
  # train.py runs in the repository: a relative --workdir would be another directory there.
  args = [f'--workdir={workdir}' if a.startswith('--workdir=') else a for a in run.args]
  return {'row': run.row, 'seed': run.seed, 'workdir': workdir,
          'args': args, 'num_steps': run.num_steps, 'translates': run.translates,
          'decode': eval_settings(plan), 'eval_sentences': plan.sweep.eval_sentences,
          'metric': plan.sweep.metric,
          'status_file': os.path.abspath(status_file(plan, run)),
          'log_file': os.path.abspath(log_file(plan, run)), 'repo': REPO,
          # One persistent compilation cache for the sweep's runs: a row's other seeds, and the
          # rows that change no shape (an optimizer, a loss term), reuse the training and
          # decoding programs instead of compiling them again (~2 min a Multi30k run on CPU).
          'compilation_cache': os.path.abspath(state_dir(plan.root, 'xla_cache'))}


# ------------------------------------------------------------------------------ states

def _evaluated(plan: Plan, run: Run) -> bool:
  return evaluated(plan, run) is not None


def run_state(plan: Plan, run: Run) -> tuple[str, str]:
  """(state, detail): DONE (evaluated with this sweep's setting), FAILED (its last attempt
  failed: the error), TRAINED (to evaluate), PARTIAL (resumes from a checkpoint), NEW."""
  if _evaluated(plan, run):
    return job_lib.DONE, ''
  status = job_lib.read_status(status_file(plan, run))
  step = job_lib.trained_step(run.workdir)
  if status.get('state') == job_lib.FAILED:
    return job_lib.FAILED, status.get('error', '')
  if step >= run.num_steps:
    results = evaluate.read_results(run.workdir)
    damaged = results and run.translates and evaluate.outputs_problem(run.workdir, results)
    return TRAINED, f'to evaluate again: {damaged}' if damaged else 'trained, to evaluate'
  if step > 0:
    return PARTIAL, f'resumes at step {step}'
  return NEW, ''


# ------------------------------------------------------------------------------ time

def estimates(plan: Plan) -> dict[str, float | None]:
  """Seconds left per run: its steps left x its row's measured median step time (any seed's
  events), plus its row's measured evaluation time; None when the row has no measurement."""
  from experiments import report  # pylint: disable=import-outside-toplevel
  per_row: dict[str, tuple[float | None, float]] = {}
  for row in plan.rows:
    runs = [r for r in plan.runs if r.row == row]
    ms = [m for m in (report.median_step_ms(r.workdir) for r in runs) if m is not None]
    evals = [res['eval_wall_s'] for res in (evaluate.read_results(r.workdir) for r in runs)
             if res and 'eval_wall_s' in res]
    per_row[row] = (statistics.median(ms) if ms else None,
                    statistics.median(evals) if evals else 0.0)
  out = {}
  for run in plan.runs:
    state, _ = run_state(plan, run)
    ms, evaluation = per_row[run.row]
    if state == job_lib.DONE:
      out[run.name] = 0.0
    elif ms is None:
      out[run.name] = None
    else:
      left = max(run.num_steps - job_lib.trained_step(run.workdir), 0)
      out[run.name] = left * ms / 1000 + evaluation
  return out


def fmt_minutes(seconds: float | None) -> str:
  if seconds is None:
    return 'unknown'
  return f'{seconds / 60:.1f} min' if seconds < 5400 else f'{seconds / 3600:.1f} h'


def describe(plan: Plan, parallel: int = 1, only: Sequence[str] = ()) -> list[str]:
  """The plan as lines: every run, its state and estimated time, then the total of the runs
  that `only` selects (`selected`: a pattern that matches no run is refused)."""
  chosen = {r.name for r in selected(plan, only)}
  times = estimates(plan)
  lines, width = [], max((len(run.name) for run in plan.runs), default=0)
  states = {run.name: run_state(plan, run) for run in plan.runs}
  for run in plan.runs:
    state, detail = states[run.name]
    extra = f' ({detail})' if detail else ''
    if state == job_lib.DONE:
      cost = ''
    elif run.name in chosen:
      cost = f', ~{fmt_minutes(times[run.name])}'
    else:
      cost = ', not selected (--only)'
    lines.append(f'  {run.name:<{width}} {state}{extra}{cost}')
  pending = {name: t for name, t in times.items() if name in chosen}
  left = [t for t in pending.values() if t]
  unknown = sum(t is None for t in pending.values())
  total = sum(left) / max(parallel, 1)
  done = sum(state == job_lib.DONE for state, _ in states.values())
  tail = f' (+{unknown} run(s) of unknown time)' if unknown else ''
  chosen_left = sum(states[name][0] != job_lib.DONE for name in chosen)
  lines.append(f'{done} of {len(plan.runs)} runs done; estimated time left: '
               f'{fmt_minutes(total) if left or not unknown else "unknown"}{tail}'
               f'{f" for the {chosen_left} selected run(s) not done (--only)" if only else ""}'
               f'{f", {parallel} at a time" if parallel > 1 else ""}')
  return lines


# ------------------------------------------------------------------------------ bookkeeping

def _manifest(plan: Plan) -> dict[str, Any]:
  sweep = plan.sweep
  return {'sweep_file': plan.path, 'config': sweep.config, 'overrides': dict(sweep.overrides),
          'rows': {k: dict(v) for k, v in plan.row_overrides.items()}}


def check_manifest(plan: Plan, write: bool) -> None:
  """The sweep under `root` was planned with the same config and rows (rows may be added), and
  every run there trained with its row's resolved config (`check_runs`); `write` records the
  union. Refused: `SweepError`, one line, nothing changed."""
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  path = state_dir(plan.root, 'sweep.json')
  mine = json.loads(json.dumps(_manifest(plan), default=str))
  try:  # a regular file only: a FIFO planted there would block forever
    old = json.loads(read_regular(path))
  except FileNotFoundError:
    old = None
  except (OSError, ValueError) as e:
    raise SweepError(f'{path} is not readable ({e}); is {plan.root} a sweep root?') from None
  if old is not None and not (isinstance(old, dict) and isinstance(old.get('rows', {}), dict)):
    raise SweepError(f'{path} is not a sweep\'s record (a JSON object with its rows); is '
                     f'{plan.root} a sweep root?')
  if old is not None:
    for key in ('config', 'overrides'):
      if old.get(key) != mine[key]:
        raise SweepError(f'{plan.root} holds a sweep with {key}={old.get(key)!r}, not '
                         f'{mine[key]!r}: use another --root (nothing was changed)')
    for row, overrides in mine['rows'].items():
      if row in old.get('rows', {}) and old['rows'][row] != overrides:
        raise SweepError(f'row {row!r} in {plan.root} was run with {old["rows"][row]}, not '
                         f'{overrides}: rename the row or use another --root')
    mine['rows'] = {**old.get('rows', {}), **mine['rows']}
  check_runs(plan)
  if write:
    write_file(path, (json.dumps(mine, indent=2) + '\n').encode())


def ignored(plan: Plan) -> list[str]:
  """One line for each file of the root that the sweep ignores as damaged (its type, its
  content): a results.json (the run is not counted) or a status file (read as none)."""
  out = []
  for run in plan.runs:
    for path, problem in ((evaluate.results_path(run.workdir), evaluate.results_problem),
                          (status_file(plan, run), job_lib.status_problem)):
      why = problem(path) if os.path.lexists(path) else None
      if why:
        out.append(f'ignored {path}: {why}')
  return out


@contextlib.contextmanager
def root_lock(root: str):
  """One sweep.py per root at a time."""
  from common.lock_file import UnsafeLockFileError, open_lock_file  # pylint: disable=import-outside-toplevel
  path = state_dir(root, 'lock')
  try:
    os.makedirs(state_dir(root), exist_ok=True)
    fd, _ = open_lock_file(path)
  except UnsafeLockFileError as e:  # a symlink or a FIFO there
    raise SweepError(str(e)) from None
  except OSError as e:  # a directory there, a full disk
    raise carried(SweepError(f'cannot lock {root} with {path}: {e.strerror or e}'), e) from None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise SweepError(f'{root} is in use by another sweep.py') from None
    yield
  finally:
    os.close(fd)


# ------------------------------------------------------------------------------ executors

def executor_kind(name: str) -> str:
  """'local' or 'slurm' (auto: submitit's choice, SLURM where `srun` is on the PATH)."""
  if name not in EXECUTORS:
    raise SweepError(f'--executor={name} is not one of {list(EXECUTORS)}')
  if name != 'auto':
    return name
  import submitit  # pylint: disable=import-outside-toplevel
  return 'slurm' if submitit.AutoExecutor.which() == 'slurm' else 'local'


def make_executor(plan: Plan, kind: str, parallel: int, slurm: dict[str, Any]):
  """A submitit executor for `kind`, its parameters set (SLURM: `slurm_fields`, the sweep
  file's `slurm` with `slurm` from the flags on top; the array runs at most `parallel` tasks
  at once)."""
  import submitit  # pylint: disable=import-outside-toplevel
  executor = submitit.AutoExecutor(folder=state_dir(plan.root, 'jobs'), cluster=kind)
  name = f'sweep-{os.path.basename(os.path.normpath(plan.root))}'
  if kind == 'local':
    executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, name=name)
    return executor
  parameters = {'name': name, 'slurm_array_parallelism': parallel}
  for field, value in slurm_fields(plan, slurm).items():
    parameters[_SLURM_PARAMETERS[field]] = value
  executor.update_parameters(**parameters)
  return executor


# The sweep file's / flags' SLURM fields -> submitit's parameter names.
_SLURM_PARAMETERS = {'partition': 'slurm_partition', 'time_min': 'timeout_min',
                     'gpus_per_node': 'gpus_per_node', 'cpus_per_task': 'cpus_per_task',
                     'mem_gb': 'mem_gb', 'account': 'slurm_account', 'qos': 'slurm_qos',
                     'constraint': 'slurm_constraint', 'array_parallelism':
                     'slurm_array_parallelism'}
# The integer fields' ranges; the others are names (a partition, an account, a QOS, features).
_SLURM_INTEGERS = {'time_min': (1, 366 * 24 * 60), 'gpus_per_node': (0, 1024),
                   'cpus_per_task': (1, 1 << 16), 'mem_gb': (1, 1 << 20),
                   'array_parallelism': (1, 1 << 20)}
SLURM_TIME_MARGIN_MIN = 15  # start-up and compilation, beyond the estimate


def _sbatch_safe(value: str) -> bool:
  """`value` can stand in an #SBATCH line: printable, no spaces."""
  return value.isprintable() and not any(c.isspace() for c in value)


def _check_slurm(fields, where: Callable[[str], str]) -> dict[str, Any]:
  """The fields, each checked: a known name, an integer in range, or a name without spaces
  or control characters (a newline would end submitit's #SBATCH block and run the rest as
  shell when the job starts); raises SweepError (one line)."""
  if not isinstance(fields, dict):
    raise SweepError(f'{where("")} must be a dict of SLURM fields, not {type(fields).__name__}')
  unknown = sorted(map(repr, set(fields) - set(_SLURM_PARAMETERS)))
  if unknown:
    raise SweepError(f'slurm has unknown field(s) [{", ".join(unknown)}]; known: '
                     f'{sorted(_SLURM_PARAMETERS)}')
  for field, value in fields.items():
    if field in _SLURM_INTEGERS:
      lo, hi = _SLURM_INTEGERS[field]
      if not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
        raise SweepError(f'{where(field)}={value!r} must be an integer in [{lo}, {hi}]')
    elif not (isinstance(value, str) and 0 < len(value) <= 256 and _sbatch_safe(value)):
      raise SweepError(f'{where(field)}={value!r} must be a SLURM name: 1 to 256 printable '
                       'characters, no spaces or control characters')
  return dict(fields)


def slurm_fields(plan: Plan, flags: dict[str, Any]) -> dict[str, Any]:
  """The SLURM fields of a sweep: the sweep file's `slurm`, the flags' (`--slurm_NAME`, None:
  not given) on top, each checked (`_check_slurm`); raises SweepError."""
  given = _check_slurm(plan.sweep.slurm, lambda f: f'slurm[{f!r}]' if f else 'slurm')
  flags = _check_slurm({k: v for k, v in flags.items() if v is not None},
                       lambda f: f'--slurm_{f}')
  return {**given, **flags}


def slurm_time_min(plan: Plan, runs: Sequence[Run]) -> tuple[int, str]:
  """A SLURM time limit per run when none is given (submitit's default, 5 minutes, would kill
  every run): twice the longest estimate of `runs` plus SLURM_TIME_MARGIN_MIN -> (minutes, a
  line saying so); raises SweepError when a run's row has no measured step time."""
  times = estimates(plan)
  unknown = sorted({r.row for r in runs if times[r.name] is None})
  if unknown:
    raise SweepError(f'slurm time_min is required: row(s) {unknown} have no measured step time '
                     "to estimate it from, and submitit's default (5 min) would kill every "
                     "run; set slurm={'time_min': MINUTES} in the sweep file or --slurm_time_min")
  longest = max((times[r.name] or 0.0 for r in runs), default=0.0)
  minutes = math.ceil(2 * longest / 60) + SLURM_TIME_MARGIN_MIN
  return minutes, (f'SLURM time limit: {minutes} min per run (twice the longest estimate, '
                   f'{fmt_minutes(longest)}, plus {SLURM_TIME_MARGIN_MIN} min; '
                   '--slurm_time_min sets it)')


def submit(executor, kind: str, specs: list[dict[str, Any]]) -> list:
  """Submits `specs` (SLURM: one job array) -> submitit jobs, in order.

  Local jobs start with SIGINT ignored (the disposition survives exec): submitit's controller
  then never sees a terminal's Ctrl-C (it would print a traceback and kill the job a second
  later, while its train.py saves), and the job takes SIGINT only through its own handler."""
  from experiments.job import run_job  # pylint: disable=import-outside-toplevel
  if kind == 'slurm':
    return executor.map_array(run_job, specs)
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    return [executor.submit(run_job, spec) for spec in specs]
  finally:
    signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------------------ the loop

@dataclasses.dataclass
class _Progress:
  total: int
  finished: int = 0
  failed: int = 0
  seconds: list[float] = dataclasses.field(default_factory=list)

  def eta(self, left: int, parallel: int, estimate: float | None) -> str:
    if estimate is not None:
      return fmt_minutes(estimate / parallel)
    if not self.seconds:
      return 'unknown'
    return fmt_minutes(statistics.mean(self.seconds) * left / parallel)


def headline(results: dict[str, Any] | None, translates: bool) -> str:
  if not results:
    return ''
  if translates:
    test, valid = results.get('test', {}), results.get('validation', {})
    return (f'test BLEU {test.get("bleu", float("nan")):.2f} (valid '
            f'{valid.get("bleu", float("nan")):.2f}), chrF2 {test.get("chrf2", float("nan")):.2f}')
  return f'validation loss {results.get("validation", {}).get("loss", float("nan")):.4f}'


def run(plan: Plan, *, executor: str = 'auto', parallel: int = 1, retry_failed: bool = False,
        slurm: dict[str, Any] | None = None, out: Callable[[str], None] = print,
        resume_command: str = '', only: Sequence[str] = ()) -> int:
  """Runs every run of `plan` not yet done (of those `only` selects: `sweep_file.selected`)
  -> the exit status: 0 when every run is done, 1 when one failed, 130 when interrupted. The
  table is written from every run done so far. A Ctrl-C or SIGTERM (`interrupts`, whose
  KeyboardInterrupt a gc callback may drop) stops the running jobs (`_stop`); then one line
  with `resume_command`, and 130."""
  try:
    return _run(plan, executor, parallel, retry_failed, dict(slurm or {}), out, only)
  except KeyboardInterrupt:
    out(f'interrupted: the finished runs are intact; stopped runs resume from their last '
        f'checkpoint: {resume_command}')
    return 130


def _run(plan: Plan, executor: str, parallel: int, retry_failed: bool, slurm: dict[str, Any],
         out: Callable[[str], None], only: Sequence[str]) -> int:
  kind = executor_kind(executor)
  chosen = {r.name for r in selected(plan, only)}
  if kind == 'slurm' and not _sbatch_safe(os.path.abspath(plan.root)):  # in #SBATCH lines
    raise SweepError(f'--root={os.path.abspath(plan.root)!r} has spaces or control characters, '
                     "which SLURM's batch file cannot hold: use another --root")
  if kind == 'slurm' and 'time_min' not in slurm_fields(plan, slurm):
    pending = [r for r in plan.runs if r.name in chosen and run_state(plan, r)[0] not in (
        job_lib.DONE, *(() if retry_failed else (job_lib.FAILED,)))]
    if pending:
      slurm['time_min'], line = slurm_time_min(plan, pending)
      out(line)
  interrupts.check()
  with root_lock(plan.root):
    check_manifest(plan, write=True)
    states = {run.name: run_state(plan, run) for run in plan.runs}
    todo = [r for r in plan.runs if states[r.name][0] != job_lib.DONE and r.name in chosen
            and (states[r.name][0] != job_lib.FAILED or retry_failed)]
    skipped = [r for r in plan.runs if states[r.name][0] == job_lib.FAILED and not retry_failed
               and r.name in chosen]
    done = sum(states[r.name][0] == job_lib.DONE for r in plan.runs)
    left = sum(states[r.name][0] != job_lib.DONE and r.name not in chosen for r in plan.runs)
    out(f'sweep {plan.root}: {len(plan.runs)} runs ({len(plan.rows)} row(s) x '
        f'{len(plan.runs) // max(len(plan.rows), 1)} seed(s)); {done} done, {len(todo)} to run'
        f'{f", {len(skipped)} failed before (--retry_failed reruns them)" if skipped else ""}'
        f'{f", {left} not selected (--only)" if left else ""}; '
        f'{kind}, at most {parallel} at a time')
    for line in ignored(plan):
      out(f'  {line}')
    for r in skipped:
      out(f'  failed before: {r.name}: {states[r.name][1]}')
    failed = len(skipped)
    if todo:
      for r in todo:  # a rerun starts clean: a stale status would read as this attempt's
        with contextlib.suppress(FileNotFoundError):
          os.unlink(status_file(plan, r))
      jobs = make_executor(plan, kind, parallel, slurm)
      interrupts.check()
      failed += _loop(plan, kind, jobs, todo, parallel, states, out, done)
  interrupts.check()
  from experiments import table  # pylint: disable=import-outside-toplevel
  written = table.write(plan)
  out(f'table: {written["summary"]} and {written["curves"]}' if written.get('curves')
      else f'table: {written["summary"]}')
  if failed:
    out(f'{failed} run(s) failed: see {state_dir(plan.root, "logs")}')
  return 1 if failed else 0


def _loop(plan: Plan, kind: str, executor, todo: list[Run], parallel: int, states, out,
          done: int) -> int:
  """Submits and follows the jobs until each has ended -> the number that failed."""
  progress = _Progress(len(plan.runs), finished=done)
  queue = list(todo)
  running: dict[str, tuple[Run, Any, float]] = {}
  if kind == 'slurm':  # one array; SLURM bounds how many run at once
    for run_, job in zip(queue, submit(executor, kind, [job_spec(plan, r) for r in queue]),
                         strict=True):
      running[run_.name] = (run_, job, time.time())
      out(f'submitted {run_.name}: SLURM job {job.job_id}')
    queue = []
  try:
    return _follow(plan, kind, executor, queue, running, parallel, states, out, progress)
  except KeyboardInterrupt:
    _stop(plan, kind, [(r, job) for r, job, _ in running.values()], out)
    raise


def _follow(plan: Plan, kind: str, executor, queue: list[Run], running, parallel: int, states,
            out, progress: _Progress) -> int:
  failed = 0
  while queue or running:
    while queue and len(running) < parallel:
      run_ = queue.pop(0)
      (job,) = submit(executor, kind, [job_spec(plan, run_)])
      running[run_.name] = (run_, job, time.time())
      state, detail = states[run_.name]
      out(f'[{progress.finished + len(running)}/{progress.total}] start {run_.name}'
          f'{f" ({detail})" if detail else ""}')
    time.sleep(POLL_S)
    interrupts.check()  # a Ctrl-C that a gc callback dropped
    for name, (run_, job, started) in list(running.items()):
      if not job.done():
        continue
      del running[name]
      status = _final_status(plan, run_, job, kind)
      minutes = (time.time() - started) / 60
      progress.finished += 1
      left = len(queue) + len(running)
      estimate = _left_estimate(plan, queue, running)
      if status.get('state') == job_lib.DONE:
        progress.seconds.append(time.time() - started)
        out(f'[{progress.finished}/{progress.total}] done {run_.name}: '
            f'{headline(status.get("results"), run_.translates)}; {minutes:.1f} min | '
            f'{left} left, ETA {progress.eta(left, parallel, estimate)}')
      else:
        failed += 1
        what = 'INTERRUPTED' if status.get('state') == job_lib.INTERRUPTED else 'FAILED'
        out(f'[{progress.finished}/{progress.total}] {what} {run_.name} after {minutes:.1f} '
            f'min: {status.get("error", "?")} | {left} left')
  return failed


def _left_estimate(plan: Plan, queue: list[Run], running) -> float | None:
  times = estimates(plan)
  names = [r.name for r in queue] + list(running)
  values = [times.get(n) for n in names]
  return None if any(v is None for v in values) else sum(values)


def _final_status(plan: Plan, run_: Run, job, kind: str = 'local') -> dict[str, Any]:
  """The job's status file; a job that ended without writing one was killed (a local one's
  train.py, which then got SIGTERM, is waited for as it saves and stops)."""
  status = job_lib.read_status(status_file(plan, run_))
  if status.get('state') in (job_lib.DONE, job_lib.FAILED, job_lib.INTERRUPTED):
    return status
  train_pid = status.get('train_pid')
  while kind == 'local' and isinstance(train_pid, int) and _alive(train_pid):
    time.sleep(STOP_POLL_S)
  error = f'the job ended without a result (killed?); see {log_file(plan, run_)}'
  with contextlib.suppress(Exception):
    tail = [line for line in (job.stderr() or '').splitlines() if line.strip()]
    if tail:
      error = f'the job ended without a result: {tail[-1][:300]}'
  status = {'state': job_lib.FAILED, 'error': error}
  job_lib.write_status(status_file(plan, run_), **status)
  return status


def _stop(plan: Plan, kind: str, running: list[tuple[Run, Any]], out) -> None:
  """Ctrl-C or SIGTERM: each running job stops what it does, its train.py saving a checkpoint
  and exiting, or its evaluation ending. Local jobs get one SIGINT each (from their status
  file's job_pid: also a job that starts its train.py meanwhile), SLURM's a scancel (SIGTERM,
  which the job takes the same way). Waits until every job has ended: no job or train.py
  outlives the sweep; a second Ctrl-C or SIGTERM kills them at once."""
  if kind == 'slurm':
    for _, job in running:
      with contextlib.suppress(Exception):
        job.cancel(check=False)
  names = sorted(run_.name for run_, _ in running)
  if names:
    out(f'stopping {", ".join(names)}: saving checkpoint(s) (Ctrl-C again to kill at once)')
  signalled: set[int] = set()
  try:
    while True:
      for pid in _pids(plan, kind, running, 'job_pid'):
        if pid not in signalled:  # the job forwards one SIGINT to its train.py
          signalled.add(pid)
          with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGINT)
      if all(_ended(job) for _, job in running):
        break
      time.sleep(STOP_POLL_S)
  except KeyboardInterrupt:
    for pid in _pids(plan, kind, running, 'job_pid', 'train_pid'):
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    out('killed at once: the runs resume from their last saved checkpoint' if kind == 'local'
        else 'not waiting: SLURM ends the cancelled jobs; the runs resume from their last '
        'saved checkpoint')
  sys.stdout.flush()


def _pids(plan: Plan, kind: str, running: list[tuple[Run, Any]], *keys: str) -> list[int]:
  """The pids (`keys` of their status files) of the local jobs that run; none on SLURM (its
  pids are other hosts')."""
  if kind != 'local':
    return []
  found = []
  for run_, _ in running:
    status = job_lib.read_status(status_file(plan, run_))
    if status.get('state') == job_lib.RUNNING:
      found += [status[key] for key in keys if isinstance(status.get(key), int)]
  return found


def _ended(job) -> bool:
  try:
    return job.done()
  except Exception:  # noqa: BLE001  (SLURM's accounting unreachable: not ours to wait for)
    return True


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:  # a zombie child of ours (the job) counts as gone
    with open(f'/proc/{pid}/stat', encoding='ascii') as f:
      return f.read().split(') ')[-1][:1] != 'Z'
  except OSError:
    return True
