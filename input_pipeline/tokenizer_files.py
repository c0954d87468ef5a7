"""The tokenizer's files on disk: written whole with their checksums, verified when read, and
the lock that lets processes sharing a workdir train it once.

  save(directory, meta_name, meta, files)   the model file(s), checksums.json, then the meta
  check(directory, meta, files)             raises `TokenizerChecksumError` on any mismatch
  lock(path)                                context manager: an exclusive flock on `path`

`checksums.json` holds the sha256 of `tokenizer.json` and of the model file. tokenizer.json
names it (`"checksums": "checksums.json"`). A tokenizer that cannot be verified is refused like
a damaged one (`TokenizerChecksumError`): checksums.json deleted or unreadable, or
tokenizer.json without that key (a bit flipped in the key's name must not turn verification
off; 0.2.0 reads no tokenizer saved before checksums existed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os

from common import lock_file
from common.atomic_file import atomic_write
from common.files import read_regular
from input_pipeline.errors import DataFileError

CHECKSUMS = 'checksums.json'
META = 'tokenizer.json'
# tokenizer.json names the tokenizer under the key 'kind' (the file format every workdir has;
# kept, so that an older checkout still reads a new workdir). In Python it is `tokenizer.name`.
NAME_KEY = 'kind'


class TokenizerChecksumError(DataFileError):
  """A tokenizer file differs from the checksum saved with it (or its checksums are gone): the
  message names the file. A run that meets it stops with exit status 1 (`exit_code`)."""

  exit_code = 1


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _atomic_write(path: str, data: bytes) -> None:
  """Whole or not at all, with the umask's mode (readable from a shared workdir)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    atomic_write(path, data)
  except OSError as e:
    raise DataFileError(f'cannot write tokenizer file {path}: {e.strerror or e}') from None


def save(directory: str, meta_name: str, meta: dict, files: dict[str, bytes] | None = None
         ) -> None:
  """Writes `files` ({name: bytes}), then `checksums.json`, then `meta` as `meta_name` last: a
  tokenizer exists once its meta file does, and is complete and checksummed by then."""
  files = dict(files or {})
  for name, data in files.items():
    _atomic_write(os.path.join(directory, name), data)
  files[meta_name] = json.dumps({**meta, 'checksums': CHECKSUMS}).encode()
  _atomic_write(os.path.join(directory, CHECKSUMS), json.dumps(
      {'algorithm': 'sha256', 'files': {n: _sha256(d) for n, d in sorted(files.items())}},
      indent=0, sort_keys=True).encode())
  _atomic_write(os.path.join(directory, meta_name), files[meta_name])


def _unverifiable(directory: str, meta_name: str) -> TokenizerChecksumError:
  """tokenizer.json names no checksum file. With checksums.json beside it, the key itself was
  damaged (the file is not what was saved); without, an older version saved it."""
  meta_path = os.path.join(directory, meta_name)
  if os.path.lexists(os.path.join(directory, CHECKSUMS)):
    return TokenizerChecksumError(
        f'tokenizer file {meta_path} names no checksum file although {CHECKSUMS} is beside '
        'it: it was changed or damaged (restore it from a backup, or use a new workdir)')
  return TokenizerChecksumError(
      f'tokenizer file {meta_path} has no checksums (saved by a version before 0.2.0, which '
      'cannot be verified): re-create the workdir with this version\'s train.py (a new '
      '--workdir)')


def _digests(directory: str) -> dict:
  path = os.path.join(directory, CHECKSUMS)
  try:
    digests = json.loads(read_regular(path))['files']
    if not isinstance(digests, dict):
      raise TypeError('files is not a mapping')
    return digests
  except FileNotFoundError:
    raise TokenizerChecksumError(f'{path} is missing: the tokenizer files cannot be verified '
                                 '(restore the folder from a backup)') from None
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise TokenizerChecksumError(f'{path} is unreadable ({type(e).__name__}): the tokenizer '
                                 'files cannot be verified') from None


def check(directory: str, meta: dict, files: dict[str, bytes], meta_name: str) -> None:
  """Raises `TokenizerChecksumError` unless every file of `files` ({name: the bytes that were
  read and will be used}) matches `checksums.json`, named by `meta` (read from `meta_name`)."""
  if 'checksums' not in meta:
    raise _unverifiable(directory, meta_name)
  path = os.path.join(directory, CHECKSUMS)
  if meta['checksums'] != CHECKSUMS:
    raise TokenizerChecksumError(f'{directory}: its tokenizer names checksums='
                                 f'{meta["checksums"]!r}, not {CHECKSUMS!r}')
  digests = _digests(directory)
  for name, data in sorted(files.items()):
    if name not in digests:
      raise TokenizerChecksumError(f'{path} does not list {name}: the tokenizer cannot be '
                                   'verified')
    if _sha256(data) != digests[name]:
      raise TokenizerChecksumError(
          f'tokenizer file {os.path.join(directory, name)} does not match its checksum in '
          f'{path}: it was changed or damaged (restore it from a backup, or use a new workdir)')


@contextlib.contextmanager
def lock(path: str):
  """An exclusive flock on `path` (created with its folder if missing) for the block. A
  symlink there is refused (`UnsafeLockFileError`), never followed."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  while True:
    try:
      fd, _ = lock_file.open_lock_file(path)
    except OSError as e:
      raise DataFileError(f'cannot open {path}: {e.strerror or e}') from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    if lock_file.still_linked(fd, path):
      break
    os.close(fd)  # removed by a refused run while we waited: lock the file there now
  try:
    yield
  finally:
    os.close(fd)
