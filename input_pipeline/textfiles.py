"""Reading local text files (plain or .gz) with clear errors.

Used by the tfds builders to prepare the bundled corpora and user-supplied
parallel text. Every problem raises `DataError` (or `DataFileError`) with one
line naming the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import logging
import os

from input_pipeline.errors import DataError, DataFileError

log = logging.getLogger(__name__)

# The project's bundled corpora, located relative to this package (not cwd).
DATA_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data')


def bundled_path(*parts: str) -> str:
  """Path of a file in the project's `data/` folder."""
  return os.path.join(DATA_ROOT, *parts)


def read_text(path: str) -> str:
  """The whole UTF-8 text of `path` (gunzipped when it ends in `.gz`)."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataFileError(f'data file not found: {path}')
  if not os.path.isfile(path):
    raise DataFileError(f'data path is not a file: {path}')
  try:
    if path.endswith('.gz'):
      with gzip.open(path, 'rb') as f:
        raw = f.read()
    else:
      with open(path, 'rb') as f:
        raw = f.read()
  except (OSError, EOFError) as e:  # permissions, corrupt gzip, ...
    raise DataFileError(f'cannot read data file {path}: {e}') from None
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    line = raw[: e.start].count(b'\n') + 1
    raise DataError(f'data file {path} is not UTF-8 text (line {line}: {e.reason})') from None
  text = text.removeprefix('\ufeff')
  if not text.strip():
    raise DataError(f'data file is empty: {path}')
  return text


def read_lines(path: str) -> list[str]:
  """The lines of `path`, each stripped of surrounding whitespace."""
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
  pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
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
      with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
          digest.update(chunk)
    except OSError as e:
      raise DataFileError(f'cannot read data file {path}: {e}') from None
    digest.update(b'\0')
  return digest.hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: str):
  """Exclusive inter-process lock on `path` (created with its folder if missing)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
