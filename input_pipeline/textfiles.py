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
import json
import logging
import os
import sys
import time
from collections.abc import Iterator

from common.atomic_file import atomic_write
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


def iter_lines(path: str, what: str = 'data') -> Iterator[tuple[int, str]]:
  """(line number, text) of each line of `path` (`.gz` gunzipped), read one line at a time:
  memory does not grow with the file. The newline (and a `\r` before it) and a leading BOM
  are removed. Unreadable: DataFileError; not UTF-8: DataError naming the line and byte."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataFileError(f'{what} file not found: {path}')
  if not os.path.isfile(path):
    raise DataFileError(f'{what} path is not a file: {path}')
  try:
    f = open_regular(path)  # a FIFO swapped in after the check would block an open() forever
  except OSError as e:
    raise DataFileError(f'cannot read {what} file {path}: {e.strerror or e}') from None
  number = 0
  with f, (gzip.GzipFile(fileobj=f, mode='rb') if path.endswith('.gz') else f) as lines:
    try:
      for number, raw in enumerate(lines, start=1):
        text = decode_line(raw, number, what, path)
        yield number, (text.removeprefix('\ufeff') if number == 1 else text)
    except (OSError, EOFError) as e:  # a corrupt or truncated gzip stream
      raise DataFileError(f'cannot read {what} file {path} after line {number}: '
                          f'{getattr(e, "strerror", None) or e}') from None


def iter_parallel(source_path: str, target_path: str) -> Iterator[tuple[str, str]]:
  """Aligned (source, target) line pairs, each side stripped, read one line at a time; pairs
  with an empty side are skipped (one warning with the count).

  Raises (after the last pair, once both files are read: nothing is held in memory):
    DataError: if the files have different numbers of lines (naming both and their counts),
      or no pair is left.
    DataFileError: if a file is missing or unreadable.
  """
  src, tgt = iter_lines(source_path), iter_lines(target_path)
  lines = kept = 0
  while True:
    s, t = next(src, None), next(tgt, None)
    if s is None or t is None:
      break
    lines += 1
    s, t = s[1].strip(), t[1].strip()
    if s and t:
      kept += 1
      yield s, t
  # One file has ended; the other's rest is counted, not kept.
  src_count = lines + (s is not None) + sum(1 for _ in src)
  tgt_count = lines + (t is not None) + sum(1 for _ in tgt)
  if src_count != tgt_count:
    raise DataError(
        f'parallel files have different line counts: {source_path} has {src_count} lines, '
        f'{target_path} has {tgt_count}')
  if kept < lines:
    log.warning('Skipped %d of %d line pairs with an empty side in %s / %s',
                lines - kept, lines, source_path, target_path)
  if not kept:
    raise DataError(f'no non-empty line pairs in {source_path} / {target_path}')


def read_parallel(source_path: str, target_path: str) -> list[tuple[str, str]]:
  """`iter_parallel`'s pairs as a list (a small corpus: the bundled Multi30k)."""
  return list(iter_parallel(source_path, target_path))


def iter_text(paths: list[str]) -> Iterator[str]:
  """The non-blank lines of `paths`, in order, read one line at a time (a language model's
  corpus: one document or sentence a line, kept as written; blank lines are skipped, with one
  warning counting them). Raises DataError when no line is left."""
  lines = kept = 0
  for path in paths:
    for _, text in iter_lines(path):
      lines += 1
      if text.strip():
        kept += 1
        yield text
  if kept < lines:
    log.warning('Skipped %d blank lines of %d in %s', lines - kept, lines, ', '.join(paths))
  if not kept:
    raise DataError(f'no non-blank lines in {", ".join(paths)}')


def uncompressed_size(path: str) -> int:
  """About how many bytes `path` holds once gunzipped (its size when not `.gz`): gzip's
  trailer gives the size modulo 2**32, so a large file's is taken as 4x its own."""
  size = os.path.getsize(path)
  if not path.endswith('.gz') or size < 18:
    return size
  with open_regular(path) as f:
    f.seek(-4, os.SEEK_END)
    tail = int.from_bytes(f.read(4), 'little')
  return tail if size < 1 << 30 and tail >= size else 4 * size


def stats_of(paths: list[str]) -> list[dict[str, int]]:
  """What `file_fingerprint` trusts of each file: size, mtime, ctime, inode, device."""
  out = []
  for path in paths:
    st = os.stat(path)
    out.append({'size': st.st_size, 'mtime_ns': st.st_mtime_ns, 'ctime_ns': st.st_ctime_ns,
                'ino': st.st_ino, 'dev': st.st_dev})
  return out


def file_fingerprint(path: str, cache_dir: str | None = None) -> str:
  """sha256 of the bytes of `path`, read whole only when the file changed since the last time:
  `cache_dir` remembers each file's digest with its stat (size, mtime, ctime, inode), and a
  start whose file has the same stat reads nothing (as git's index). A file modified within a
  second before it was hashed is hashed again next time (its clock may not have moved since),
  so a change is never missed."""
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise DataFileError(f'data file {path} is not a regular file' if os.path.exists(path)
                        else f'data file not found: {path}')
  record = None
  if cache_dir:
    record = os.path.join(cache_dir, hashlib.sha256(path.encode()).hexdigest()[:24] + '.json')
    try:
      with open_regular(record) as f:
        known = json.loads(f.read())
      if (known['path'] == path and known['stat'] == stats_of([path])[0]
          and known['stat']['mtime_ns'] < known['hashed_ns'] - 1_000_000_000):
        return known['sha256']
    except (OSError, ValueError, KeyError, TypeError):
      pass  # no record, or a damaged one: hash the file
  stat = stats_of([path])[0]
  digest = hashlib.sha256()
  try:
    with open_regular(path) as f:  # a FIFO would block an open() forever
      for chunk in iter(lambda: f.read(1 << 20), b''):
        digest.update(chunk)
  except OSError as e:
    raise DataFileError(f'cannot read data file {path}: {e.strerror or e}') from None
  if record and stat == stats_of([path])[0]:
    with contextlib.suppress(OSError):  # a cache: losing it costs one more read
      os.makedirs(cache_dir, exist_ok=True)
      atomic_write(record, json.dumps({'path': path, 'stat': stat, 'sha256': digest.hexdigest(),
                                       'hashed_ns': time.time_ns()}).encode())
  return digest.hexdigest()


def files_fingerprint(paths: list[str], cache_dir: str | None = None) -> str:
  """A short hex digest of the contents of `paths`, in order (`file_fingerprint` each)."""
  digest = hashlib.sha256()
  for path in paths:
    digest.update(file_fingerprint(path, cache_dir).encode() + b'\0')
  return digest.hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: str):
  """Exclusive inter-process lock on `path` (created with its folder if missing), waiting for
  its holder. A symlink there is refused, never followed (it would create a file at its
  target), and a FIFO is refused, never waited on (`common.lock_file`): one `DataFileError`."""
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
  except OSError as e:  # a parent that is a file, a read-only or missing mount
    raise DataFileError(f'cannot create {os.path.dirname(path)}: {e.strerror or e}') from None
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
