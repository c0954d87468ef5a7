"""Writing files, one way for every command: whole or not at all, never through a planted link.

- `atomic_write(path, data)`: the project's own files (DIR/config.json, the tokenizer files,
  checksums, progress, the program cache). The writer owns them: no checks beyond the rename.
- `OutputFile(path, what=...)` (a stream of writes) and `write_output(path, data, what=...)`
  (whole bytes): a command's outputs (decode.py's --output_file and --attention_plot,
  experiments.report, export.py's marker). `make_output_dir` for a folder of outputs.

Every file goes to a temporary file made by `mkstemp` (O_EXCL, a random name) in the
destination's own directory, so it never follows a planted symlink and `os.replace` is an
atomic rename; it then gets the mode a plain `open` would give (0666 minus the umask), not
mkstemp's 0600, so another user can still read a shared workdir.

An output is first checked (`check_destination`, one `OutputError` line):
- the path is resolved (its directory through symlinks); the destination itself may not be a
  symlink, FIFO, socket, device or directory (a write would go elsewhere, or block forever);
- it may not be a workdir's own file: config.json, best_metrics.json, events, locks, or
  anything under tokenizer/, checkpoints/ or profile/ (the next train.py or decode.py would
  find it damaged). Judged by device and inode (`common.files.inside`), so a symlinked or
  bind-mounted spelling of the workdir is caught too. A workdir is one given in `workdirs`, or
  any ancestor of the destination holding config.json beside checkpoints/ or tokenizer/.
While an output is written, `.NAME.lock` beside it is held (`OutputLock`: flock, not
waiting): a second writer of the same file is refused at once instead of interleaving with the
first; the lock file goes when the writer is done. A writer killed outright (SIGKILL, a power
cut: no cleanup runs) leaves its `.NAME.tmp-*` temporary file, or export.py's staging
directory of that name, and `.NAME.lock`: the next writer of NAME removes them once it holds
the lock (`remove_leftovers`; no writer of NAME is alive then). A failed write (ENOSPC: a
full disk) is one `OutputError` line naming the file: the temporary file is removed and the
destination is as it was.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import weakref

from common.errors import carried
from common.files import file_in_the_way, inside
from common.lock_file import open_lock_file, still_linked

OWN_FILES = ('config.json', 'best_metrics.json', 'train.lock')
OWN_DIRS = ('tokenizer', 'checkpoints', 'profile')


class OutputError(ValueError):
  """An output refused or not written: one line naming the file; the destination is as it was."""


def _umask() -> int:
  """The process umask, read without changing it where Linux allows (threads may be running)."""
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _temp_beside(path: str):
  """-> (binary file object, name) of a new temporary file in `path`'s directory."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f'.{os.path.basename(path)}.tmp-')
  try:
    os.fchmod(fd, 0o666 & ~_umask())
    return os.fdopen(fd, 'wb'), tmp
  except BaseException:
    os.close(fd)
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def atomic_write(path: str, data: bytes) -> None:
  """Replaces `path` with `data` (fsynced) in one rename; on any error `path` is untouched and
  no temporary file is left behind."""
  f, tmp = _temp_beside(os.path.abspath(path))
  try:
    with f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


# ----------------------------------------------------------------------------- outputs

def _same(a: str, b: str) -> bool:
  try:
    x, y = os.stat(a), os.stat(b)
  except OSError:
    return False
  return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)


def _is_workdir(directory: str) -> bool:
  return (os.path.isfile(os.path.join(directory, 'config.json'))
          and any(os.path.isdir(os.path.join(directory, d)) for d in OWN_DIRS[:2]))


def workdir_entry(path: str, workdirs=()) -> str | None:
  """The workdir file or folder that the absolute `path` is or lies under, or None."""
  parent, name = os.path.split(path)
  found, current = [w for w in workdirs if w], parent
  while True:  # the destination's ancestors that are workdirs
    if _is_workdir(current):
      found.append(current)
    if os.path.dirname(current) == current:
      break
    current = os.path.dirname(current)
  own_name = (name in OWN_FILES + OWN_DIRS or name.startswith('events.out.tfevents.')
              or name.endswith('.lock'))  # OWN_DIRS: one not made yet
  for workdir in found:
    for folder in OWN_DIRS:
      if inside(path, os.path.join(workdir, folder)):
        return os.path.join(workdir, folder) + os.sep
    if own_name and _same(parent, workdir):
      return os.path.join(workdir, name) + (os.sep if name in OWN_DIRS else '')
  return None


def _kind(mode: int) -> str | None:
  """What a non-regular file is, in words (None for a regular file)."""
  for test, words in ((stat.S_ISLNK, 'a symbolic link'), (stat.S_ISFIFO, 'a FIFO'),
                      (stat.S_ISSOCK, 'a socket'), (stat.S_ISCHR, 'a device'),
                      (stat.S_ISBLK, 'a device'), (stat.S_ISDIR, 'a directory')):
    if test(mode):
      return words
  return None if stat.S_ISREG(mode) else 'not a regular file'


def check_destination(path: str, *, what: str = 'output', workdirs=()) -> str:
  """The resolved path to write `path` at (its directory's symlinks followed), or
  `OutputError` (one line) when the rules of this module refuse it."""
  absolute = os.path.abspath(os.path.expanduser(path))
  try:
    kind = _kind(os.lstat(absolute).st_mode)
  except FileNotFoundError:
    kind = None
  except OSError as e:
    raise OutputError(f'cannot write {what} {path}: {e.strerror or e}') from None
  if kind is not None:
    raise OutputError(f'{what} {path} is {kind}: refusing to write through it (give the path '
                      'of a regular file or a new one)')
  real = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
  owner = workdir_entry(real, workdirs)
  if owner is not None:
    raise OutputError(f'{what} {path} is (or is inside) {owner}, a workdir\'s own file: '
                      'refusing to overwrite it (give a path outside the workdir\'s files)')
  return real


def check_output_dir(path: str, *, what: str = 'output', workdirs=()) -> str:
  """The resolved directory `path` (not created), or `OutputError` (one line) when it is or
  lies inside a workdir's own folders, or is (or lies below) something not a directory: said
  before the work whose results it would hold (a decoding of an hour)."""
  real = os.path.realpath(os.path.expanduser(path))
  owner = workdir_entry(real, workdirs)
  if owner is not None:
    raise OutputError(f'{what} {path} is (or is inside) {owner}, a workdir\'s own folder: '
                      'refusing to write there (give a directory outside it)')
  blocker = file_in_the_way(real)
  if blocker is not None:
    where = 'is' if blocker == real else f'lies below {blocker},'
    raise OutputError(f'{what} {path} {where} a file, not a directory')
  return real


def make_output_dir(path: str, *, what: str = 'output', workdirs=()) -> str:
  """The resolved directory `path`, created if missing, or `OutputError` (one line): inside a
  workdir's own folders, or not a directory, or not creatable (a full disk)."""
  real = check_output_dir(path, what=what, workdirs=workdirs)
  try:
    os.makedirs(real, exist_ok=True)
  except OSError as e:
    raise carried(OutputError(f'cannot create {what} {path}: {e.strerror or e}'), e) from None
  return real


class OutputLock:
  """An exclusive flock on `.NAME.lock` beside `path`, refused at once (`OutputError`) when
  another process holds it; `release` (or the end of a `with` block) removes the file. What
  every `OutputFile` holds; export.py holds one for its output directory."""

  def __init__(self, path: str, what: str, shown: str):
    self.path = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.lock')
    while True:
      try:
        self.fd, _ = open_lock_file(self.path)
      except (OSError, ValueError) as e:  # ValueError: a symlink or FIFO planted there
        raise OutputError(f'cannot lock {what} {shown}: {getattr(e, "strerror", None) or e}'
                          ) from None
      try:
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        os.close(self.fd)
        raise OutputError(f'{what} {shown} is being written by another process (it holds '
                          f'{self.path}): refusing to mix two outputs in one file') from None
      if still_linked(self.fd, self.path):
        remove_leftovers(path)
        return
      os.close(self.fd)  # its holder removed it as we opened it: lock the new one

  def release(self) -> None:
    if self.fd is None:
      return
    with contextlib.suppress(OSError):  # before unlocking: no one locks a file about to go
      os.unlink(self.path)
    os.close(self.fd)
    self.fd = None

  def __enter__(self) -> OutputLock:
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def remove_leftovers(path: str) -> list[str]:
  """Removes what writers of `path` killed outright left beside it: `.NAME.tmp-XXXXXXXX`
  (mkstemp's and mkdtemp's names) temporary files, and export.py's staging directories of
  that name, which hold regular files only. For a caller holding `OutputLock(path)`: every
  such entry is then a dead writer's. Another user's entries, links, and directories holding
  anything else are left as they are. -> the paths removed."""
  parent, name = os.path.split(path)
  leftover = re.compile(re.escape(f'.{name}.tmp-') + '[a-z0-9_]{8}')
  try:
    names = [n for n in os.listdir(parent) if leftover.fullmatch(n)]
  except OSError:
    return []
  removed = []
  for entry in (os.path.join(parent, n) for n in names):
    with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: left as it is
      if _remove_leftover(entry):
        removed.append(entry)
  return removed


def _remove_leftover(path: str) -> bool:
  info = os.lstat(path)
  if info.st_uid != os.getuid():
    return False
  if stat.S_ISREG(info.st_mode):
    os.unlink(path)
    return True
  if not stat.S_ISDIR(info.st_mode):
    return False
  files = [os.path.join(path, n) for n in os.listdir(path)]
  if not all(stat.S_ISREG(os.lstat(f).st_mode) for f in files):
    return False
  for file in files:
    os.unlink(file)
  os.rmdir(path)
  return True


def _abandon(file, tmp: str, lock: OutputLock) -> None:
  """An output never committed (an error, Ctrl-C): its temporary file goes, the lock too."""
  with contextlib.suppress(OSError):
    file.close()
  with contextlib.suppress(OSError):
    os.unlink(tmp)
  lock.release()


class OutputFile:
  """A command's output, written as a stream: checked and locked when made, each `write`
  appended (and flushed) to a temporary file beside it, renamed onto the destination by
  `commit`. `discard`, an exception in a `with` block, or an object dropped without `commit`
  (an error, Ctrl-C) removes the temporary file and leaves the destination as it was.
  Failures are `OutputError` lines naming the destination. `sync=False` skips the fsync
  (throwaway files written by the hundred, such as attention plots)."""

  def __init__(self, path: str, *, what: str = 'output', workdirs=(), sync: bool = True):
    self.shown, self.what, self.sync = path, what, sync
    self.path = check_destination(path, what=what, workdirs=workdirs)
    try:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
    except OSError as e:
      raise self._error(e) from None
    self._lock = OutputLock(self.path, what, path)
    try:
      self._file, self._tmp = _temp_beside(self.path)
    except OSError as e:
      self._lock.release()
      raise self._error(e) from None
    self._abandon = weakref.finalize(self, _abandon, self._file, self._tmp, self._lock)

  def _error(self, e: OSError) -> OutputError:
    reason = e.strerror or str(e)
    if e.errno == errno.ENOSPC:
      reason = 'No space left on device'
    return carried(OutputError(f'cannot write {self.what} {self.shown}: {reason} (nothing '
                               f'written: {self.shown} is as it was)'), e)

  def write(self, data: bytes | str) -> None:
    try:
      self._file.write(data.encode('utf-8') if isinstance(data, str) else data)
      self._file.flush()
    except OSError as e:
      self.discard()
      raise self._error(e) from None

  def commit(self) -> str:
    """Renames the written file onto the destination (fsynced first) -> its path."""
    if not self._abandon.alive:
      raise OutputError(f'{self.what} {self.shown} was already closed')
    try:
      self._file.flush()
      if self.sync:
        os.fsync(self._file.fileno())
      self._file.close()
      os.replace(self._tmp, self.path)
    except OSError as e:
      self.discard()
      raise self._error(e) from None
    self._abandon.detach()
    self._lock.release()
    return self.path

  def discard(self) -> None:
    self._abandon()  # runs once: later calls do nothing

  def __enter__(self) -> OutputFile:
    return self

  def __exit__(self, kind, value, traceback) -> None:
    if kind is None:
      self.commit()
    else:
      self.discard()


def write_output(path: str, data: bytes | str, *, what: str = 'output', workdirs=(),
                 sync: bool = True) -> str:
  """`data` written whole to the output `path` (`OutputFile`'s checks, lock and rename) -> the
  resolved path written."""
  with OutputFile(path, what=what, workdirs=workdirs, sync=sync) as f:
    f.write(data)
  return f.path
