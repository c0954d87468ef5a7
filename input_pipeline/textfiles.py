"""Reading local text files (plain or .gz) with clear errors.

Used by the tfds builders to prepare the bundled corpora and user-supplied parallel text, and
by decode.py for its input and references (`read_utf8_lines`). Every problem raises
`DataError` (or `DataFileError`) with one line naming the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import logging
import os
import sys

from common.files import open_regular
from common.lock_file import open_lock_file
from input_pipeline.errors import DataError, DataFileError

log = logging.getLogger(__name__)

# The project's bundled corpora, located relative to this package (not cwd).
DATA_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data')


def bundled_path(*parts: str) -> str:
  """Path of a file in the project's `data/` folder."""
  return os.path.join(DATA_ROOT, *parts)


def read_bytes(path: str | None, what: str = 'data') -> bytes:
  """The bytes of `path` (stdin when None or '-'), gunzipped when it ends in `.gz`.

  Raises DataFileError naming the file (`what` says which: 'data', 'input', 'reference')."""
  if path in (None, '-'):
    return _read(sys.stdin.buffer.read, what, '<stdin>')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataFileError(f'{what} file not found: {path}')
  if not os.path.isfile(path):
    raise DataFileError(f'{what} path is not a file: {path}')
  return _read(lambda: _slurp(path), what, path)


def _slurp(path: str) -> bytes:
  with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
    return f.read()


def _read(read, what: str, name: str) -> bytes:
  try:
    return read()
  except (OSError, EOFError) as e:  # permissions, corrupt gzip, ...
    raise DataFileError(f'cannot read {what} file {name}: '
                        f'{getattr(e, "strerror", None) or e}') from None


def decode_line(raw: bytes, number: int, what: str = 'data', name: str = '') -> str:
  """One line's bytes (with or without its `\n` or `\r\n`) -> its text. Not UTF-8: a
  DataError naming the file, line, byte and column."""
  raw = raw[:-1] if raw.endswith(b'\n') else raw
  raw = raw[:-1] if raw.endswith(b'\r') else raw
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise DataError(_not_utf8(what, name, number, raw[e.start], e.start + 1)) from None


def _not_utf8(what: str, name: str, line: int, byte: int, column: int) -> str:
  return (f'{what} {name} line {line} is not valid UTF-8 (byte 0x{byte:02x} at column '
          f'{column})')


def read_utf8_lines(path: str | None, what: str = 'data') -> list[str]:
  """The UTF-8 lines of `path` (stdin when None or '-'; `.gz` gunzipped) without their
  newlines: the project's one reader of line files (decode.py's input and references too).
  Unreadable: DataFileError; not UTF-8: DataError naming the line."""
  name = '<stdin>' if path in (None, '-') else os.fspath(path)
  raw = read_bytes(path, what).split(b'\n')
  if raw and raw[-1] == b'':
    raw.pop()  # the final newline does not start another line
  return [decode_line(line, number, what, name) for number, line in enumerate(raw, start=1)]


def read_text(path: str) -> str:
  """The whole UTF-8 text of `path` (gunzipped when it ends in `.gz`), without a BOM.
  Raises DataError when it is empty or not UTF-8 (naming the line)."""
  raw = read_bytes(path)
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    line_start = raw.rfind(b'\n', 0, e.start) + 1
    raise DataError(_not_utf8('data file', path, raw.count(b'\n', 0, e.start) + 1,
                              raw[e.start], e.start - line_start + 1)) from None
  text = text.removeprefix('\ufeff')
  if not text.strip():
    raise DataError(f'data file is empty: {path}')
  return text


def read_lines(path: str) -> list[str]:
  """The lines of `path`, each stripped of surrounding whitespace (one file of a parallel
  corpus: empty files are an error)."""
  text = read_text(path)
  lines = text.split('\n')
  if lines and lines[-1] == '':
    lines.pop()  # the final newline does not start another line
  return [line.strip() for line in lines]


def read_parallel(source_path: str, target_path: str) -> list[tuple[str, str]]:
  """Aligned (source, target) line pairs; pairs with an empty side are skipped.

  Raises:
    DataError: if the files have different numbers of lines, or no pair is left.
    DataFileError: if a file is missing or unreadable.
  """
  src = read_lines(source_path)
  tgt = read_lines(target_path)
  if len(src) != len(tgt):
    raise DataError(
        f'parallel files have different line counts: {source_path} has {len(src)} lines, '
        f'{target_path} has {len(tgt)}')
  pairs = [(s, t) for s, t in zip(src, tgt, strict=True) if s and t]
  skipped = len(src) - len(pairs)
  if skipped:
    log.warning('Skipped %d of %d line pairs with an empty side in %s / %s',
                skipped, len(src), source_path, target_path)
  if not pairs:
    raise DataError(f'no non-empty line pairs in {source_path} / {target_path}')
  return pairs


def files_fingerprint(paths: list[str]) -> str:
  """A short hex digest of the contents of `paths` (keys prepared data dirs)."""
  digest = hashlib.sha256()
  for path in paths:
    if not os.path.isfile(path):
      raise DataFileError(f'data file not found: {path}')
    try:
      with open_regular(path) as f:  # a FIFO would block an open() forever
        for chunk in iter(lambda: f.read(1 << 20), b''):
          digest.update(chunk)
    except OSError as e:
      raise DataFileError(f'cannot read data file {path}: {e}') from None
    digest.update(b'\0')
  return digest.hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: str):
  """Exclusive inter-process lock on `path` (created with its folder if missing), waiting for
  its holder. A symlink there is refused, never followed (it would create a file at its
  target), and a FIFO is refused, never waited on (`common.lock_file`): one `DataFileError`."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    fd, _ = open_lock_file(path)
  except OSError as e:
    raise DataFileError(f'cannot open the lock file {path}: {e.strerror or e}') from None
  except ValueError as e:  # UnsafeLockFileError: its message names the path
    raise DataFileError(str(e)) from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # unlocks
