"""common.waiting: a main thread waiting for a helper still runs its signal handlers when the
kernel hands the signal to another thread (as it did to a second Ctrl-C in CI)."""

import subprocess
import sys
import threading

import pytest
import test_train_synthetic as syn

from common.waiting import wait_interruptibly

_SCRIPT = '''
import os, signal, sys, threading, time
from common.waiting import wait_interruptibly

def stop(signum, frame):
  print('handled in the main thread', flush=True)
  os._exit(130)

signal.signal(signal.SIGINT, stop)
busy = threading.Thread(target=time.sleep, args=(600,), daemon=True)  # stands for XLA's threads
busy.start()

def interrupt_the_other_thread():
  time.sleep(0.5)
  signal.pthread_kill(busy.ident, signal.SIGINT)

threading.Thread(target=interrupt_the_other_thread, daemon=True).start()
if sys.argv[1] == 'interruptibly':
  wait_interruptibly(lambda: time.sleep(600))
else:
  time.sleep(600)  # the plain wait: the handler only runs once this returns
'''


def _run(mode):
  return subprocess.Popen([sys.executable, '-c', _SCRIPT, mode], cwd=syn.REPO,
                          stdout=subprocess.PIPE, text=True)


def test_a_signal_in_another_thread_runs_the_handler_while_waiting():
  proc = _run('interruptibly')
  try:
    out = proc.communicate(timeout=120)[0]
  finally:
    proc.kill()
  assert proc.returncode == 130 and out == 'handled in the main thread\n'


def test_the_plain_wait_would_not_run_it():
  """The control: the scenario above does hang a plain blocking wait (2 s: four times the
  signal's delay)."""
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
