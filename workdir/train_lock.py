"""One writer per workdir: `acquire(workdir)` -> a held lock, or `WorkdirBusyError`.

The lock is `flock` on `DIR/train.lock`, an OS lock tied to the open file: it is released when
the process ends however it ends (SIGKILL included), so a killed run never blocks the next
one. The file also records the holder's pid and host, for the message a second run prints.
Readers (decode.py, `restore_params`) take no lock: Orbax renames each checkpoint into place
when it is complete, so they can read while a run writes.

Lock files are opened with `O_NOFOLLOW` (and created with `O_EXCL`): a symlink planted at
`DIR/train.lock` or `DIR/tokenizer/.lock` is refused in one line, never followed (following
it would truncate and overwrite the file it points to). A run refused after taking the lock
calls `WorkdirLock.undo()`, which removes what appeared in the workdir since (its lock file,
an unused tokenizer, empty folders), so the workdir is left as it was found.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket

from common.errors import ConfigError
from common.lock_file import open_lock_file, still_linked
from workdir.config_io import CONFIG_FILE  # a run has started once it is written

LOCK_FILE = 'train.lock'
# What a run writes before config.json, deepest first: `undo` removes those it created.
_SETUP_FILES = ('tokenizer/tokenizer.json', 'tokenizer/spm.model', 'tokenizer/checksums.json',
                'tokenizer/.lock', LOCK_FILE)
_SETUP_DIRS = ('tokenizer', 'checkpoints', '')


class WorkdirBusyError(ConfigError):
  """Another live process holds the workdir; nothing was written."""


class WorkdirLock:
  """A held lock; `release()` (or the end of the process) frees it."""

  def __init__(self, fd: int, path: str, workdir: str, found: set[str]):
    self._fd, self.path, self._workdir, self._found = fd, path, workdir, found

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor drops the flock
      self._fd = None

  def undo(self) -> None:
    """For a run refused before it wrote config.json: removes the setup files and empty
    folders this run created (symlinks are unlinked, never followed), then releases. Once
    the run has written config.json it has started, and this only releases."""
    started = os.path.lexists(os.path.join(self._workdir, CONFIG_FILE)) and (
        CONFIG_FILE not in self._found)
    if self._fd is not None and not started:
      for rel in _SETUP_FILES:
        path = os.path.join(self._workdir, rel)
        if rel not in self._found and os.path.lexists(path) and not os.path.isdir(path):
          with contextlib.suppress(OSError):
            os.unlink(path)  # the lock file last: the workdir stays locked until then
    self.release()
    tokenizer = os.path.join(self._workdir, 'tokenizer')
    if not started and 'tokenizer' not in self._found and os.path.isdir(tokenizer) and (
        not os.path.islink(tokenizer)):  # a tokenizer this run wrote or copied (any kind's files)
      shutil.rmtree(tokenizer, ignore_errors=True)
    for rel in _SETUP_DIRS if not started else ():
      path = os.path.join(self._workdir, rel) if rel else self._workdir
      if rel not in self._found and not os.path.islink(path):
        with contextlib.suppress(OSError):
          os.rmdir(path)  # only when empty


def _setup_paths(workdir: str) -> set[str]:
  names = [*_SETUP_FILES, *_SETUP_DIRS, CONFIG_FILE]
  return {rel for rel in names if os.path.lexists(os.path.join(workdir, rel) if rel else workdir)}


def _holder(fd: int) -> str:
  try:
    text = os.pread(fd, 200, 0).decode('utf-8', 'replace').split()
  except OSError:
    text = []
  pid, host = (text + ['?', '?'])[:2]
  return f'pid {pid}, host {host}'


def acquire(workdir: str) -> WorkdirLock:
  """Locks `workdir` (created if needed) for this process, or raises `WorkdirBusyError` (or
  `UnsafeLockFileError` for a planted symlink, `ConfigError` for a path that cannot be a
  directory), leaving the workdir as it found it."""
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f'workdir {workdir} exists and is not a directory')
  found = _setup_paths(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:  # a parent that is a file, a read-only or missing mount
    raise ConfigError(f'cannot create workdir {workdir}: {e.strerror or e}') from None
  path = os.path.join(workdir, LOCK_FILE)
  try:
    fd, created = _lock(path, workdir)
  except BaseException:
    WorkdirLock(None, path, workdir, found).undo()
    raise
  if created:
    found.discard(LOCK_FILE)
  try:  # who holds it, for the message of a second run (the lock itself is the flock)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()} {socket.gethostname()}\n'.encode(), 0)
  except OSError:
    pass
  return WorkdirLock(fd, path, workdir, found)


def _lock(path: str, workdir: str) -> tuple[int, bool]:
  """-> (descriptor, created) of the lock file, flock-ed by this process."""
  while True:
    try:
      fd, created = open_lock_file(path)
    except OSError as e:
      raise WorkdirBusyError(f'cannot open {path}: {e.strerror or e}') from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _holder(fd)
      os.close(fd)
      raise WorkdirBusyError(f'{workdir} is in use by another train.py ({holder})') from None
    except OSError as e:  # e.g. a file system without flock: say so rather than run unguarded
      os.close(fd)
      if created:
        os.unlink(path)
      raise WorkdirBusyError(f'cannot lock {path}: {e.strerror or e}') from None
    if still_linked(fd, path):
      return fd, created
    os.close(fd)  # a refused run removed it between our open and flock: lock the new one
