"""One writer per workdir: `acquire(workdir)` -> a held lock, or `WorkdirBusyError`.

The lock is `flock` on `DIR/train.lock`, an OS lock tied to the open file: it is released when
the process ends however it ends (SIGKILL included), so a killed run never blocks the next
one. The file also records the holder's pid and host, for the message a second run prints.
Readers (decode.py, `restore_params`) take no lock: Orbax renames each checkpoint into place
when it is complete, so they can read while a run writes.
"""

from __future__ import annotations

import fcntl
import os
import socket

from model.config import ConfigError

LOCK_FILE = 'train.lock'


class WorkdirBusyError(ConfigError):
  """Another live process holds the workdir; nothing was written."""


class WorkdirLock:
  """A held lock; `release()` (or the end of the process) frees it."""

  def __init__(self, fd: int, path: str):
    self._fd, self.path = fd, path

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor drops the flock
      self._fd = None


def _holder(fd: int) -> str:
  try:
    text = os.pread(fd, 200, 0).decode('utf-8', 'replace').split()
  except OSError:
    text = []
  pid, host = (text + ['?', '?'])[:2]
  return f'pid {pid}, host {host}'


def acquire(workdir: str) -> WorkdirLock:
  """Locks `workdir` (created if needed) for this process, or raises `WorkdirBusyError`."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _holder(fd)
    os.close(fd)
    raise WorkdirBusyError(f'{workdir} is in use by another train.py ({holder})') from None
  except OSError as e:  # e.g. a file system without flock: say so rather than run unguarded
    os.close(fd)
    raise WorkdirBusyError(f'cannot lock {path}: {e.strerror or e}') from None
  try:  # who holds it, for the message of a second run (the lock itself is the flock)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()} {socket.gethostname()}\n'.encode(), 0)
  except OSError:
    pass
  return WorkdirLock(fd, path)
