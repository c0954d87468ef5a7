"""Reading the project's own files without blocking: `open_regular(path)` opens without waiting
(O_NONBLOCK) and refuses anything but a regular file before reading it. A FIFO planted where a
file is expected (a workdir's config.json, best_metrics.json, tokenizer or checkpoint files)
would otherwise hang the reader forever with no message (an open() for reading waits for a
writer). `open_regular(path, follow=False)` refuses a symlink too (a file of someone else's
archive); `open_append(path)` is a log's writer, on the same terms and never through a link.

`inside(path, directory)` judges by device and inode, not by spelling, so a symlink or a bind
mount does not hide that an output or a cache would land in a workdir."""

from __future__ import annotations

import errno
import os
import stat


class NotARegularFileError(OSError):
  """The path is a FIFO, socket, device or directory, not a regular file."""


_KINDS = ((stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket'), (stat.S_ISCHR, 'a device'),
          (stat.S_ISBLK, 'a device'), (stat.S_ISDIR, 'a directory'))


def open_regular(path: str, *, follow: bool = True):
  """`path` opened for reading in binary (symlinks followed, unless `follow=False`: then a
  symlink is refused too) if it is a regular file; raises `NotARegularFileError` (an OSError
  naming the path and what it is) for anything else, `FileNotFoundError` etc. as `open`
  would. Never waits on a FIFO."""
  return _open(path, os.O_RDONLY, follow, 'rb')


def open_append(path: str):
  """`path` opened to append in binary, created if missing (0666 minus the umask), if it is a
  regular file: never through a symlink, never a FIFO or device (`NotARegularFileError`). For a
  log that grows while it is read (a sweep run's): the other writers go through `atomic_file`."""
  return _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, False, 'ab')


def _open(path: str, flags: int, follow: bool, mode: str):
  flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
  try:
    fd = os.open(path, flags, 0o666)
  except OSError as e:
    if follow or e.errno not in (errno.ELOOP, errno.ENXIO) or not os.path.lexists(path):
      raise
    what = _kind(os.lstat(path).st_mode)  # O_NOFOLLOW's ELOOP; a FIFO without a reader's ENXIO
    raise NotARegularFileError(f'{path} is {what}, not a regular file') from None
  try:
    kind = _kind(os.fstat(fd).st_mode)
    if kind is not None:
      raise NotARegularFileError(f'{path} is {kind}, not a regular file')
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)
  except BaseException:
    os.close(fd)
    raise


def _kind(mode: int) -> str | None:
  """What a file that is not a regular file is, in words (None for a regular file)."""
  if stat.S_ISREG(mode):
    return None
  if stat.S_ISLNK(mode):
    return 'a symbolic link'
  return next((name for test, name in _KINDS if test(mode)), 'not a regular file')


def read_regular(path: str) -> bytes:
  """The bytes of the regular file `path` (`open_regular`)."""
  with open_regular(path) as f:
    return f.read()


def nearest_existing(path: str) -> str:
  """`path` made absolute, or its nearest ancestor that exists (a link counts, followed or
  not): the folder a `makedirs(path)` would start from, for a check before any work."""
  current = os.path.abspath(path)
  while not os.path.lexists(current):
    current = os.path.dirname(current)
  return current


def file_in_the_way(path: str) -> str | None:
  """The file (anything not a directory) at `path` or at its nearest existing ancestor, which
  a `makedirs(path)` would fail on; None where the folders can be made."""
  existing = nearest_existing(path)
  return None if os.path.isdir(existing) else existing


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
