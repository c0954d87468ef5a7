"""`atomic_write(path, data)`: a file written whole or not at all, safely.

Used for DIR/config.json, the tokenizer files, checksums, progress and the program cache.
The temporary file is created by `mkstemp` (O_EXCL, a random name) in the target's own
directory, so it never follows a planted symlink and `os.replace` is an atomic rename; it then
gets the mode a plain `open` would give (0666 minus the umask), not mkstemp's 0600, so another
user can still read a shared workdir.
"""

from __future__ import annotations

import contextlib
import os
import tempfile


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


def atomic_write(path: str, data: bytes) -> None:
  """Replaces `path` with `data` (fsynced) in one rename; on any error `path` is untouched and
  no temporary file is left behind."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{os.path.basename(path)}.tmp-')
  try:
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
