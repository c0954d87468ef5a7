"""Reading the project's own files without blocking: `open_regular(path)` opens without waiting
(O_NONBLOCK) and refuses anything but a regular file before reading it. A FIFO planted where a
file is expected (a workdir's config.json, best_metrics.json, tokenizer or checkpoint files)
would otherwise hang the reader forever with no message (an open() for reading waits for a
writer).

`inside(path, directory)` judges by device and inode, not by spelling, so a symlink or a bind
mount does not hide that an output or a cache would land in a workdir."""

from __future__ import annotations

import os
import stat


class NotARegularFileError(OSError):
  """The path is a FIFO, socket, device or directory, not a regular file."""


_KINDS = ((stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket'), (stat.S_ISCHR, 'a device'),
          (stat.S_ISBLK, 'a device'), (stat.S_ISDIR, 'a directory'))


def open_regular(path: str):
  """`path` opened for reading in binary (symlinks followed) if it is a regular file; raises
  `NotARegularFileError` (an OSError naming the path and what it is) for anything else,
  `FileNotFoundError` etc. as `open` would. Never waits on a FIFO."""
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  try:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
      what = next((name for test, name in _KINDS if test(mode)), 'not a regular file')
      raise NotARegularFileError(f'{path} is {what}, not a regular file')
    os.set_blocking(fd, True)
    return os.fdopen(fd, 'rb')
  except BaseException:
    os.close(fd)
    raise


def read_regular(path: str) -> bytes:
  """The bytes of the regular file `path` (`open_regular`)."""
  with open_regular(path) as f:
    return f.read()


def inside(path: str, directory: str) -> bool:
  """Whether `path` (existing or not) is `directory` or under it, by device and inode (so
  through symlinks and bind mounts too) for every existing ancestor of `path`."""
  try:
    target = os.stat(directory)
  except OSError:
    return False
  current = os.path.abspath(path)
  while True:
    try:
      st = os.stat(current)
      if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
        return True
    except OSError:
      pass  # not created yet: its parent decides
    parent = os.path.dirname(current)
    if parent == current:
      return False
    current = parent
