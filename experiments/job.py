"""What one job of a sweep does, wherever it runs (a local subprocess or a SLURM array task):
train with train.py, then evaluate (`experiments.evaluate`).

train.py runs as its own process, exactly the command a user would type, in a session of its
own, so a Ctrl-C at the terminal reaches it once, through this job: the job forwards the first
SIGINT or SIGTERM it gets (the terminal's, sweep.py's, submitit's, or SLURM's scancel) as one
SIGINT, and train.py saves a checkpoint and stops; a run that stopped short of its steps is
'interrupted' and resumes on the next `sweep.py`. Once train.py has ended, the stop is the
job's own: a SIGINT or SIGTERM during the evaluation ends it ('interrupted', evaluated again
on the next `sweep.py`), also when Python drops the KeyboardInterrupt (`common.interrupts`).
On Linux train.py gets SIGTERM (save and stop) when the job dies, even by SIGKILL: it never
trains on as an orphan. The job's state, train.py's pid and the last error line go in a status
file that `sweep.py` reads; train.py's output in a log beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from common import interrupts
from experiments import evaluate

DONE, FAILED, INTERRUPTED, RUNNING = 'done', 'failed', 'interrupted', 'running'


def write_status(path: str, **status) -> None:
  from common.atomic_file import atomic_write  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.dirname(path), exist_ok=True)
  status['time'] = time.time()
  atomic_write(path, (json.dumps(status, sort_keys=True) + '\n').encode())


def read_status(path: str) -> dict[str, Any]:
  """A job's status file, or {} when it is missing or damaged (`check_status`)."""
  found = evaluate.read_json_object(path) or {}
  return {} if check_status(found) else found


_STATUS_FIELDS = {'state': str, 'phase': str, 'error': str, 'job_pid': int, 'train_pid': int,
                  'step': int, 'exit_code': int, 'started': (int, float), 'time': (int, float),
                  'wall_s': (int, float), 'results': dict}


def check_status(found: Any) -> str | None:
  """What is wrong with a status file's content (a value of another type than `write_status`
  writes, an unknown state, a pid <= 0), in words; None when nothing is."""
  if not isinstance(found, dict):
    return f'not a JSON object but {type(found).__name__}'
  for key, kind in _STATUS_FIELDS.items():
    value = found.get(key)
    if key in found and (not isinstance(value, kind) or isinstance(value, bool)):
      return f'{key!r} is {value!r}, not {getattr(kind, "__name__", "a number")}'
  if found.get('state', DONE) not in (DONE, FAILED, INTERRUPTED, RUNNING):
    return f'state {found["state"]!r} is not one of {[DONE, FAILED, INTERRUPTED, RUNNING]}'
  if any(found.get(key, 1) <= 0 for key in ('job_pid', 'train_pid')):
    return 'a pid <= 0'
  if 'results' in found and evaluate.check_results(found['results']):
    return f'its results: {evaluate.check_results(found["results"])}'
  return None


def status_problem(path: str) -> str | None:
  """Why the status file at `path` is not read (a FIFO, not JSON, `check_status`), or None."""
  return evaluate.json_file_problem(path, check_status)


def open_log(path: str):
  """The run's log, opened to append (binary), created if missing; never through a symlink
  and never a FIFO or device (`common.files.open_append`): `OSError` naming it."""
  from common.files import open_append  # pylint: disable=import-outside-toplevel
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return open_append(path)


def last_error(log_path: str) -> str:
  """The line that says why a run failed: train.py's `error:` line, else a Python exception's
  last line, else the last line of the log."""
  from common.files import open_regular  # pylint: disable=import-outside-toplevel
  try:
    with open_regular(log_path, follow=False) as f:
      f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
      lines = [line.strip() for line in f.read().decode('utf-8', 'replace').splitlines()]
  except OSError:
    return f'(no log at {log_path})'
  lines = [line for line in lines if line]
  for marker in ('train.py: error:', 'Error:', 'Error'):
    for line in reversed(lines):
      if marker in line:
        return line[:300]
  return lines[-1][:300] if lines else '(empty log)'


class _ForwardOnce:
  """SIGINT/SIGTERM while train.py runs -> one SIGINT to it (a second would stop it without
  saving); before it starts and once it has ended (the evaluation), a KeyboardInterrupt in the
  job (`interrupts.request`: remembered for `interrupts.check()`), until `ending`."""

  def __init__(self):
    self.child: subprocess.Popen | None = None
    self.received = False
    self.ending = False  # the final status is being written: only remember the signal

  def __call__(self, signum, frame):
    first, self.received = not self.received, True
    # poll() is None while the main thread waits for the child (it holds the wait's lock)
    if self.child is not None and self.child.poll() is None:
      if first:
        self.child.send_signal(signal.SIGINT)
    elif not self.ending:
      interrupts.request(signum, frame)


def _stop_with_parent(parent: int, libc):
  """Popen's preexec_fn (Linux): the child gets SIGTERM when its parent (this job) dies, a
  SIGKILL included; train.py then saves a checkpoint and stops instead of training on, in its
  own session, as an orphan."""
  def preexec() -> None:
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the job died before prctl: no signal will come
      os._exit(1)  # pylint: disable=protected-access
  return preexec


def _libc():
  if not sys.platform.startswith('linux'):
    return None
  import ctypes  # pylint: disable=import-outside-toplevel
  try:
    return ctypes.CDLL(None, use_errno=True)
  except OSError:
    return None


def train_error(code: int, log_path: str) -> str:
  """Why train.py failed: killed by a signal (its log's last line is only its progress), else
  its log's error line (`last_error`)."""
  if code < 0:
    try:
      name = signal.Signals(-code).name
    except ValueError:
      name = f'signal {-code}'
    why = ' (the out-of-memory killer?)' if -code == signal.SIGKILL else ''
    return f'train.py was killed by {name}{why}; its output: {log_path}'
  return last_error(log_path)


def trained_step(workdir: str) -> int:
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  steps = checkpoint.list_steps(workdir) if os.path.isdir(workdir) else []
  return steps[-1] if steps else 0


def compilation_cache(spec: dict[str, Any], environ=os.environ) -> str | None:
  """The persistent compilation cache of a run: the one `JAX_COMPILATION_CACHE_DIR` names
  already (the user's, shared beyond this sweep), else the sweep's own."""
  return environ.get('JAX_COMPILATION_CACHE_DIR') or spec.get('compilation_cache')


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
  """Trains and evaluates one run. `spec`: `launch.job_spec`'s dict. Never raises for the
  run's own failures: they are in the returned status (also in the status file)."""
  forward = _ForwardOnce()
  previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
  hook = sys.unraisablehook
  interrupts.quiet_lost_interrupts()
  started, phase = time.time(), ['train']
  try:
    return _train_and_evaluate(spec, forward, started, phase)
  except KeyboardInterrupt:  # the job's own stop: before train.py, after it, or evaluating
    forward.ending = True
    if forward.child is not None and forward.child.poll() is None:  # (started as it came)
      forward.child.send_signal(signal.SIGINT)
      forward.child.wait()
    step = trained_step(spec['workdir'])
    error = ('stopped while evaluating; it is evaluated again on the next sweep.py'
             if phase[0] == 'evaluate' else
             f'stopped at step {step} of {spec["num_steps"]}; it resumes from there')
    return _end(spec['status_file'], INTERRUPTED, started, step=step, error=error)
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    sys.unraisablehook = hook


def _train_and_evaluate(spec: dict[str, Any], forward: _ForwardOnce, started: float,
                        phase: list[str]) -> dict[str, Any]:
  status_file, log_file, workdir = spec['status_file'], spec['log_file'], spec['workdir']
  cache = compilation_cache(spec)
  os.makedirs(os.path.dirname(log_file), exist_ok=True)
  libc = _libc()
  try:  # never through a planted symlink, never blocking on a FIFO
    log = open_log(log_file)
  except OSError as e:
    return _end(status_file, FAILED, started, error=f'cannot write its log: {e}')
  with log:
    log.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} train.py {" ".join(spec["args"])}\n'
              .encode())
    log.flush()
    env = dict(os.environ)
    if cache:  # JAX's own variable: train.py's programs, cached
      env['JAX_COMPILATION_CACHE_DIR'] = cache
    interrupts.check()
    forward.child = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, 'train.py', *spec['args']], cwd=spec['repo'], stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
        preexec_fn=None if libc is None else _stop_with_parent(os.getpid(), libc))
    write_status(status_file, state=RUNNING, phase='train', job_pid=os.getpid(),
                 train_pid=forward.child.pid, started=started)
    code = forward.child.wait()
  step = trained_step(workdir)
  if forward.received or code == 130 or (code == 0 and step < spec['num_steps']):
    forward.ending = True
    return _end(status_file, INTERRUPTED, started, step=step,
                error=f'stopped at step {step} of {spec["num_steps"]}; it resumes from there')
  if code != 0:
    forward.ending = True
    return _end(status_file, FAILED, started, step=step, exit_code=code,
                error=train_error(code, log_file))
  phase[0] = 'evaluate'
  write_status(status_file, state=RUNNING, phase='evaluate', job_pid=os.getpid(),
               started=started)
  if cache:  # decode.py's: the programs and their compiled code (a failure: uncached)
    from autoregressive import program_cache  # pylint: disable=import-outside-toplevel
    program_cache.enable_compilation_cache(cache)
  try:
    results = evaluate.evaluate(workdir, spec['decode'], translates=spec['translates'],
                                sentences=spec.get('eval_sentences'),
                                metric=spec.get('metric', 'bleu'))
  except Exception as e:  # noqa: BLE001  (reported as the run's failure, the sweep goes on)
    interrupts.check()  # a stop that Python dropped, then an error on the way out
    forward.ending = True
    with contextlib.suppress(OSError), open_log(log_file) as log:
      log.write(f'evaluation failed: {type(e).__name__}: {e}\n'.encode())
    return _end(status_file, FAILED, started, step=step,
                error=f'evaluation: {type(e).__name__}: {" ".join(str(e).split())[:300]}')
  forward.ending = True  # (a stop that Python dropped while evaluating: `evaluate` checks)
  return _end(status_file, DONE, started, step=step, results=results)


def _end(status_file: str, state: str, started: float, **fields) -> dict[str, Any]:
  status = {'state': state, 'started': started, 'wall_s': round(time.time() - started, 1),
            **fields}
  write_status(status_file, **status)
  return status
