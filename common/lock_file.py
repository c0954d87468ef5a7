"""Lock files that cannot be turned against us: `open_lock_file(path)` never follows a symlink.

Used by `workdir.train_lock` (DIR/train.lock) and `input_pipeline.tokenizer_files`
(DIR/tokenizer/.lock).
"""

from __future__ import annotations

import errno
import os
import stat

from common.errors import ConfigError


class UnsafeLockFileError(ConfigError):
  """A lock file is a symlink (or not a regular file): refused, never followed."""


def open_lock_file(path: str) -> tuple[int, bool]:
  """-> (descriptor, created) of the regular file `path`, created if missing (`O_EXCL`), never
  through a symlink (`O_NOFOLLOW`). Raises `UnsafeLockFileError` for a symlink or a special
  file, `OSError` for other failures."""
  flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a planted FIFO
  for _ in range(10):  # a file removed or created between the two opens: look again
    try:
      fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
      try:
        fd, created = os.open(path, flags), False
      except FileNotFoundError:
        continue
      except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a symlink
          raise UnsafeLockFileError(_symlink_message(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      os.close(fd)
      raise UnsafeLockFileError(f'{path} is not a regular file: refusing to use it as a lock '
                                '(remove it)')
    os.set_blocking(fd, True)
    return fd, created
  raise OSError(errno.EAGAIN, f'{path} keeps appearing and disappearing')


def _symlink_message(path: str) -> str:
  try:
    target = f' (to {os.readlink(path)})'
  except OSError:
    target = ''
  return (f'{path} is a symbolic link{target}: refusing to follow it for a lock file; remove it '
          '(nothing was written)')


def still_linked(fd: int, path: str) -> bool:
  """True when `path` still names the open file `fd`: a lock taken on a file that another
  process unlinked meanwhile (its `undo`) locks nothing, so the caller opens it again."""
  try:
    here, there = os.fstat(fd), os.lstat(path)
  except OSError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
