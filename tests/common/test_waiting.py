"""common.waiting: a main thread waiting for a helper still runs its signal handlers when the
kernel hands the signal to another thread (as it did to a second Ctrl-C in CI)."""

import subprocess
import sys
import threading

import pytest

from common.waiting import wait_interruptibly
from tests.training import test_train_synthetic as syn

_SCRIPT = '''
import os, signal, sys, threading, time
from common.waiting import wait_interruptibly

def stop(signum, frame):
  print('handled in the main thread', flush=True)
  os._exit(130)

signal.signal(signal.SIGINT, stop)
busy = threading.Thread(target=time.sleep, args=(600,), daemon=True)  # stands for XLA's threads
busy.start()

def plain_wait():
  time.sleep(600)  # the handler only runs once this returns

def interruptible_wait():
  wait_interruptibly(lambda: time.sleep(600))

def at_its_wait(innermost):
  """The main thread is in its wait: inside wait_interruptibly, or at the plain wait's line
  (from which Python checks for signals only once time.sleep returns)."""
  frame = innermost
  while frame is not None:
    if frame.f_code is plain_wait.__code__:
      return frame.f_lineno > frame.f_code.co_firstlineno
    if frame.f_code is interruptible_wait.__code__:
      return frame is not innermost
    frame = frame.f_back
  return False

def interrupt_the_other_thread():
  # No clock: once the main thread waits, however long a loaded machine takes to get there.
  while not at_its_wait(sys._current_frames().get(threading.main_thread().ident)):
    time.sleep(0.01)
  signal.pthread_kill(busy.ident, signal.SIGINT)

threading.Thread(target=interrupt_the_other_thread, daemon=True).start()
interruptible_wait() if sys.argv[1] == 'interruptibly' else plain_wait()
'''


def _run(mode):
  return subprocess.Popen([sys.executable, '-c', _SCRIPT, mode], cwd=syn.REPO,
                          stdout=subprocess.PIPE, text=True)


def test_a_signal_in_another_thread_runs_the_handler_while_waiting():
  proc = _run('interruptibly')
  try:
    out = proc.communicate()[0]
  finally:
    proc.kill()
  assert proc.returncode == 130 and out == 'handled in the main thread\n'


def test_the_plain_wait_would_not_run_it():
  """The control: the scenario above does hang a plain blocking wait (2 s after the start: the
  signal comes once the main thread is in its wait, which a loaded machine can only delay,
  and delay is all this test waits for)."""
  proc = _run('plainly')
  try:
    with pytest.raises(subprocess.TimeoutExpired):
      proc.communicate(timeout=2)
  finally:
    proc.kill()
    proc.communicate()


def test_the_value_and_the_error_come_back():
  assert wait_interruptibly(lambda: 41 + 1) == 42
  with pytest.raises(ZeroDivisionError):
    wait_interruptibly(lambda: 1 / 0)
  names = []
  wait_interruptibly(lambda: names.append(threading.current_thread().name))
  assert names != [threading.main_thread().name]  # waited for in a helper thread
