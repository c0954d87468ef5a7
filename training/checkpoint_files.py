"""What `training.checkpoint` adds around Orbax's files: checksums, short reasons, quiet failures.

  write_checksums(step_dir)        sha256 of every file of a finished-but-uncommitted step
  verify_checksums(step_dir)       -> None when intact, else a short reason
  short_reason(error, root)        one short line for an Orbax/TensorStore error
  is_disk_full(error)              ENOSPC anywhere in an error (or its text)
  quiet_orbax_logs()               context manager: Orbax's own warning/error logs are not
                                   printed (our callers report the failure in one line), and
                                   what abandoned Orbax reads report later is dropped

The checksum file is written into the step's temporary directory just before Orbax renames
it into place, so a checkpoint and its checksums appear together; a flipped byte in any
listed file makes the checkpoint "damaged", and the caller falls back to the previous one.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import logging
import os
import re
import sys

from training.atomic_file import atomic_write

CHECKSUM_FILE = 'checksums.json'
_ORBAX_DIR = f'{os.sep}orbax{os.sep}'  # in the file names of Orbax's code


def _file_sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def _files(step_dir: str) -> list[str]:
  """Paths (relative, '/'-separated) of the files of the saved items (`state/`, `data/`),
  sorted. The step folder's own files are Orbax's bookkeeping, which it updates after the
  commit (`_CHECKPOINT_METADATA`), so they are not checksummed."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), step_dir).replace(os.sep, '/')
      if '/' in rel:
        out.append(rel)
  return sorted(out)


def write_checksums(step_dir: str) -> None:
  """Writes `step_dir/checksums.json`: {relative path: sha256 hex} of the items' files."""
  digests = {rel: _file_sha256(os.path.join(step_dir, rel)) for rel in _files(step_dir)}
  # A new file renamed into place: a symlink planted at this predictable name (Orbax's
  # temporary folder is predictable) is replaced, never followed.
  atomic_write(os.path.join(step_dir, CHECKSUM_FILE), json.dumps(
      {'algorithm': 'sha256', 'files': digests}, indent=0, sort_keys=True).encode())


def has_checksums(step_dir: str) -> bool:
  return os.path.isfile(os.path.join(step_dir, CHECKSUM_FILE))


def verify_checksums(step_dir: str, skip: tuple[str, ...] = ()) -> str | None:
  """None when every listed file (except those under the folders in `skip`) is present and
  unchanged, else a short reason naming the first bad file. A step without a checksum file
  is not checked (None): it was written before checksums existed, or by several processes."""
  path = os.path.join(step_dir, CHECKSUM_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      digests = json.load(f)['files']
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f'{CHECKSUM_FILE} is unreadable ({type(e).__name__})'
  for rel, expected in sorted(digests.items()):
    if rel.split('/', 1)[0] in skip:
      continue
    full = os.path.join(step_dir, *rel.split('/'))
    try:
      actual = _file_sha256(full)
    except FileNotFoundError:
      return f'{rel} is missing'
    except OSError as e:
      return f'{rel} is unreadable ({e.strerror or e})'
    if actual != expected:
      return f'checksum mismatch in {rel}'
  return None


def committed_steps(checkpoint_dir: str) -> list[int]:
  """Step folders on disk (renamed into place, so complete), without asking Orbax."""
  names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
  return sorted(int(n) for n in names
                if n.isdigit() and os.path.isdir(os.path.join(checkpoint_dir, n)))


def tree_size(directory: str) -> int:
  """Bytes of every file under `directory`."""
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(directory) for name in names)


def missing_items(step_dir: str, items: tuple[str, ...]) -> list[str]:
  """Which of the item folders (e.g. 'data') a step has not got at all."""
  return [item for item in items if not os.path.isdir(os.path.join(step_dir, item))]


# -- errors -----------------------------------------------------------------------------------

def _chain(error: BaseException):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException) -> bool:
  for e in _chain(error):
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return True
    text = str(e)
    if 'No space left on device' in text or "os_error_code='28'" in text:
      return True
  return False


def short_reason(error: BaseException, root: str | None = None) -> str:
  """The gist of an Orbax/TensorStore error, from the innermost cause (Orbax's wrappers say
  only "see full TensorStore details"): no tensorstore spec, no source locations, paths
  relative to `root`, at most ~200 characters."""
  error = list(_chain(error))[-1]
  text = ' '.join(str(error).split())
  text = re.sub(r" \[(tensorstore_spec|source locations)='.*?'\]", '', text)
  text = text.split(" [tensorstore_spec=")[0]
  text = re.sub(r' in OCDBT database at local file "[^"]*"', '', text)
  if root:
    text = text.replace(os.path.join(root, ''), '')
  if len(text) > 200:
    text = text[:197] + '...'
  return f'{type(error).__name__}: {text}' if text else type(error).__name__


# -- logging ----------------------------------------------------------------------------------

class _Hide(logging.Filter):
  """Keeps Orbax's, TensorStore's and asyncio's ("exception was never retrieved") warnings and
  errors off stderr: each failure reaches our code as an exception, reported in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    path = record.pathname or ''
    theirs = '/orbax/' in path or '/tensorstore/' in path or path.endswith('asyncio/base_events.py')
    return not (theirs and record.levelno >= logging.WARNING)


def _is_closed_loop_wakeup(unraisable) -> bool:
  """A late wake-up of a closed event loop, or an abandoned Orbax read/write coroutine
  finalised by the garbage collector (its error is the damage already reported)."""
  if (isinstance(unraisable.exc_value, RuntimeError)
      and str(unraisable.exc_value) == 'Event loop is closed'):
    return True
  code = getattr(unraisable.object, 'cr_code', None)  # a coroutine's code object
  return code is not None and _ORBAX_DIR in code.co_filename


def _drop_closed_loop_wakeups() -> None:
  """TensorStore reads/writes still in flight when Orbax gives up on a damaged checkpoint (or
  a failed save) finish later and try to wake the event loop Orbax has already closed; Python
  reports each as an unraisable `RuntimeError: Event loop is closed`. That is noise about work
  nobody waits for: dropped. Every other unraisable goes to the previous hook."""
  previous = sys.unraisablehook
  if getattr(previous, 'drops_closed_loop_wakeups', False):
    return

  def hook(unraisable):
    if not _is_closed_loop_wakeup(unraisable):
      previous(unraisable)

  hook.drops_closed_loop_wakeups = True
  sys.unraisablehook = hook


def _reporting_loop():
  """The event loop whose `default_exception_handler` is logging the current record, or None
  (asyncio logs a future's or task's lost error through its own loop's handler)."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    if (frame.f_code.co_name == 'default_exception_handler'
        and frame.f_code.co_filename.endswith(os.path.join('asyncio', 'base_events.py'))):
      return frame.f_locals.get('self')
    frame = frame.f_back
  return None


def _not_from_a_closed_loop(record: logging.LogRecord) -> bool:
  """False for asyncio's report of a future or task whose event loop is already closed."""
  del record  # the loop is on the stack, not in the record
  loop = _reporting_loop()
  return loop is None or not loop.is_closed()


def _drop_abandoned_orbax_tasks() -> None:
  """Orbax runs each read on a fresh event loop and closes it at the first error (a damaged
  checkpoint), abandoning the other reads' tasks and TensorStore futures. They may fail or be
  destroyed much later, after `quiet_orbax_logs` has ended, even at interpreter exit; asyncio
  then logs each one ("Task/Future exception was never retrieved", with the whole TensorStore
  spec), hundreds of lines about a failure already reported in one. Nobody can wait on work
  of a closed loop, so its reports are dropped for good; those of running loops stay."""
  asyncio_logger = logging.getLogger('asyncio')
  if _not_from_a_closed_loop not in asyncio_logger.filters:
    asyncio_logger.addFilter(_not_from_a_closed_loop)


@contextlib.contextmanager
def quiet_orbax_logs():
  """Within: Orbax/TensorStore/asyncio warnings and errors are not printed. For good:
  TensorStore's late wake-ups of closed event loops and abandoned Orbax tasks' reports are
  dropped (they come after the failure was reported)."""
  _drop_closed_loop_wakeups()
  _drop_abandoned_orbax_tasks()
  hide = _Hide()
  handlers = [h for name in ('', 'absl') for h in logging.getLogger(name).handlers]
  for handler in handlers:
    handler.addFilter(hide)
  try:
    yield
  finally:
    gc.collect()  # finish abandoned coroutines now, not at interpreter exit
    for handler in handlers:
      handler.removeFilter(hide)
