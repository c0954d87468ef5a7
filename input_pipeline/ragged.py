"""Ragged arrays on disk: the prepared form of a split, read by index with `np.memmap`.

A ragged array NAME of `n` rows is two files in its directory (fairseq's indexed datasets and
nanoGPT's `.bin` token files are the same idea):

  NAME.bin    every row's values back to back (uint8 for UTF-8 text, uint16 or uint32 for
              token ids: `ids_dtype(vocab_size)`)
  NAME.idx    int64 `[n + 1]` offsets: row i is `bin[idx[i]:idx[i + 1]]`

A prepared directory is written in a staging folder beside it and renamed into place when
whole (`staged`), `meta.json` last: a directory that exists is complete, and a preparation
killed half-way leaves only a staging folder, which no reader opens and the next preparation
removes. Rows are appended in bounded chunks (`RaggedWriter`), so preparing takes the same
memory whatever the corpus size; reading maps the files, so a reader's memory does not grow
with the corpus either (the pages it touches are the OS's page cache, shared and evictable).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from common.errors import EXIT_FAILED
from input_pipeline.errors import DataError

META = 'meta.json'
FORMAT = 1  # meta.json's 'format': a directory of another format is prepared again
_STAGING = '.staging-'  # prefix of a folder being written (beside the final one)


class DiskFullError(DataError):
  """The disk filled while preparing: one line, exit status 1 (a failure, not bad input)."""

  exit_code = EXIT_FAILED


def ids_dtype(vocab_size: int) -> np.dtype:
  """The smallest unsigned dtype that holds ids `[0, vocab_size)`."""
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class RaggedWriter:
  """Appends rows to `NAME.bin` / `NAME.idx` in `directory`; memory is one chunk's."""

  def __init__(self, directory: str, name: str, dtype):
    self.dtype = np.dtype(dtype)
    self._bin = open(os.path.join(directory, f'{name}.bin'), 'wb')  # noqa: SIM115
    self._idx = open(os.path.join(directory, f'{name}.idx'), 'wb')  # noqa: SIM115
    self._end = 0
    self.rows = 0
    self._idx.write(np.zeros(1, np.int64).tobytes())

  def extend(self, rows: Sequence[Any]) -> None:
    """Appends `rows` (sequences of values, or `bytes` for a uint8 array)."""
    if not rows:
      return
    if self.dtype == np.uint8:
      lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
      self._bin.write(b''.join(rows))
    else:
      arrays = [np.asarray(r, self.dtype) for r in rows]
      lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
      self._bin.write(np.concatenate(arrays).tobytes() if arrays else b'')
    ends = self._end + np.cumsum(lengths)
    self._idx.write(ends.tobytes())
    self._end = int(ends[-1])
    self.rows += len(rows)

  def close(self) -> dict[str, Any]:
    """Flushes both files; returns what meta.json records of this array."""
    for f in (self._bin, self._idx):
      f.flush()
      os.fsync(f.fileno())
      f.close()
    return {'dtype': self.dtype.name, 'rows': self.rows, 'values': self._end}


class Ragged:
  """A ragged array read from disk: `len`, `[i]` -> 1-D array, `lengths`, `flat`.

  Pickles as its paths (a Grain worker process maps the files itself; an `np.memmap`
  would pickle as a copy of the whole array)."""

  def __init__(self, directory: str, name: str, dtype):
    self.directory, self.name, self.dtype = directory, name, np.dtype(dtype)
    self._open()

  def _open(self) -> None:
    def load(suffix, dtype):
      path = os.path.join(self.directory, f'{self.name}.{suffix}')
      if os.path.getsize(path) == 0:
        return np.zeros(0, dtype)
      return np.memmap(path, dtype=dtype, mode='r')
    self.offsets = load('idx', np.int64)
    self.flat = load('bin', self.dtype)

  def __getstate__(self):
    return {'directory': self.directory, 'name': self.name, 'dtype': self.dtype.name}

  def __setstate__(self, state):
    self.__init__(state['directory'], state['name'], state['dtype'])

  def __len__(self) -> int:
    return len(self.offsets) - 1

  @property
  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)

  def __getitem__(self, i: int) -> np.ndarray:
    return np.asarray(self.flat[self.offsets[i]:self.offsets[i + 1]])

  def read_rows(self, first: int, last: int) -> list[bytes]:
    """Rows `first:last` as bytes, read from the file rather than through the map: a
    sequential pass (a preparation reading every row once) then leaves the pages to the OS's
    cache instead of this process's resident memory."""
    start, end = int(self.offsets[first]), int(self.offsets[last])
    with open(os.path.join(self.directory, f'{self.name}.bin'), 'rb') as f:
      f.seek(start * self.dtype.itemsize)
      data = f.read((end - start) * self.dtype.itemsize)
    bounds = (np.asarray(self.offsets[first:last + 1]) - start) * self.dtype.itemsize
    return [data[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]

  def gather(self, indices: np.ndarray, max_length: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Rows `indices`, each cut to its first `max_length` values, as (flat values, lengths):
    one vectorised read instead of a Python loop over rows."""
    indices = np.asarray(indices, np.int64)
    starts = self.offsets[indices]
    lengths = self.offsets[indices + 1] - starts
    if max_length is not None:
      lengths = np.minimum(lengths, max_length)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.asarray(self.flat[np.repeat(starts, lengths) + within]), lengths


def read_meta(directory: str) -> dict[str, Any] | None:
  """A prepared directory's meta.json, or None when it is not (yet, or of this format)."""
  try:
    with open(os.path.join(directory, META), 'rb') as f:
      meta = json.loads(f.read())
  except (OSError, ValueError):
    return None
  return meta if isinstance(meta, dict) and meta.get('format') == FORMAT else None


def free_bytes(path: str) -> int:
  """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def check_room(directory: str, estimate: int, what: str) -> None:
  """Refuses, before anything is written, a preparation that cannot fit on the disk."""
  free = free_bytes(directory)
  if estimate > free:
    raise DiskFullError(f'not enough disk to prepare {what}: about {estimate / 1e9:.2f} GB '
                        f'needed, {free / 1e9:.2f} GB free in {directory}')


def remove_staging(directory: str) -> None:
  """Removes the staging folders left beside `directory` by preparations that were killed
  (call under the lock that guards `directory`'s parent: no writer of them is alive)."""
  parent = os.path.dirname(directory)
  with contextlib.suppress(FileNotFoundError):
    for name in os.listdir(parent):
      if name.startswith(_STAGING):
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@contextlib.contextmanager
def staged(directory: str, meta: dict[str, Any], what: str) -> Iterator[str]:
  """Yields a staging folder to write `directory`'s files into (call under the lock that guards
  `directory`'s parent: earlier staging folders there are removed); on success writes `meta`
  (plus 'format') as meta.json and renames the folder to `directory`. On any error the
  staging folder is removed, and a full disk becomes one `DiskFullError` line."""
  parent, base = os.path.split(directory)
  os.makedirs(parent, exist_ok=True)
  remove_staging(directory)
  stage = os.path.join(parent, f'{_STAGING}{base}.{uuid.uuid4().hex[:8]}')
  os.mkdir(stage)
  try:
    yield stage
    with open(os.path.join(stage, META), 'w') as f:
      json.dump({'format': FORMAT, **meta}, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    if os.path.exists(directory):  # an older format's: replaced
      shutil.rmtree(directory)
    os.rename(stage, directory)
  except OSError as e:
    shutil.rmtree(stage, ignore_errors=True)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      raise DiskFullError(f'the disk filled while preparing {what} in {parent} ({e.strerror}); '
                          'nothing was kept: free some space and run again') from None
    raise DataError(f'cannot prepare {what} in {parent}: {e.strerror or e}') from None
  except BaseException:
    shutil.rmtree(stage, ignore_errors=True)
    raise


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
  """`items` in lists of at most `size` (the bounded unit of every preparation)."""
  chunk = []
  for item in items:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk
