"""What `workdir.checkpoint` adds around Orbax's files: checksums, symlinks, short reasons.

  write_checksums(step_dir)        sha256 of every file of a finished-but-uncommitted step
  verify_checksums(step_dir)       -> None when intact, else a short reason
  unverified(step_dir)             a step from before checksums (restored with a warning)
  linked_entries / unlink_planted  symlinks at steps or Orbax's temporary folders
  short_reason(error, root)        one short line for an Orbax/TensorStore error
  is_disk_full(error)              ENOSPC anywhere in an error (or its text)

The checksum file is written into the step's temporary directory just before Orbax renames
it into place, so a checkpoint and its checksums appear together; a flipped byte in any
listed file makes the checkpoint "damaged", and the caller falls back to the previous one.
The step's data item records that it was checksummed (`data_marker`), so a deleted
`checksums.json` is damage too; only steps of versions from before checksums (no marker)
are restored unverified. A symlink at a step is never followed for deletion.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import shutil
from typing import Any

from common.atomic_file import atomic_write
from common.files import open_regular, read_regular
from workdir import orbax_noise

CHECKSUM_FILE = 'checksums.json'


def _file_sha256(path: str) -> str:
  with open_regular(path) as f:  # streamed: a checkpoint file may be large
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


def data_marker(checksummed: bool) -> dict[str, Any]:
  """What the data item of a step records about its checksums (`checksums.json`, or None for a
  step written without them on purpose: by several processes)."""
  return {'checksums': CHECKSUM_FILE if checksummed else None}


def _written_with_checksums(step_dir: str) -> bool | None:
  """True/False from the marker in the step's data item; None when there is none (a step of a
  version from before checksums) or the item cannot be read."""
  try:
    data = json.loads(read_regular(os.path.join(step_dir, 'data', 'metadata')))
  except (OSError, ValueError):
    return None
  if not isinstance(data, dict) or 'checksums' not in data:
    return None
  return data['checksums'] == CHECKSUM_FILE


def unverified(step_dir: str) -> bool:
  """A step with no checksums that cannot be told to have been written without them on purpose
  (a version from before checksums): restored unverified, with a warning."""
  return not has_checksums(step_dir) and _written_with_checksums(step_dir) is None


def verify_checksums(step_dir: str, skip: tuple[str, ...] = ()) -> str | None:
  """None when every listed file (except those under the folders in `skip`) is present and
  unchanged, else a short reason naming the first bad file. A step whose data item says it
  was checksummed must have its checksum file; one without (several processes wrote it, or a
  version from before checksums: see `unverified`) is not checked (None)."""
  path = os.path.join(step_dir, CHECKSUM_FILE)
  if not os.path.lexists(path):
    return f'{CHECKSUM_FILE} is missing' if _written_with_checksums(step_dir) else None
  try:
    digests = json.loads(read_regular(path))['files']
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


# Orbax writes step N into `N.orbax-checkpoint-tmp-<time>` and renames it to `N` when complete.
TEMPORARY = '.orbax-checkpoint-tmp'


def temporary_folders(checkpoint_dir: str, step: int | None = None) -> list[str]:
  """Paths of Orbax's temporary step folders in `checkpoint_dir` (of `step` only, if given):
  a save still writing, or one killed mid-write."""
  name = f'*{TEMPORARY}*' if step is None else f'{step}{TEMPORARY}*'
  return sorted(glob.glob(os.path.join(checkpoint_dir, name)))


def linked_entries(checkpoint_dir: str, step: int | None = None) -> list[str]:
  """Names of the steps and Orbax temporary folders in `checkpoint_dir` (of `step` only, if
  given) that are symlinks: Orbax would write or delete (rmtree) through them."""
  names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
  ours = [n for n in names if n.isdigit() or TEMPORARY in n]
  if step is not None:
    ours = [n for n in ours if n == str(step) or n.startswith(f'{step}{TEMPORARY}')]
  return sorted(n for n in ours if os.path.islink(os.path.join(checkpoint_dir, n)))


def unlink_planted(checkpoint_dir: str, warn, step: int | None = None
                   ) -> tuple[list[str], list[str]]:
  """Removes (with a `warn` line each) the symlinks at Orbax's temporary folder names, and at
  `step` when given, which Orbax would rmtree or write through. -> (the names removed, the
  other linked steps: a user's, maybe, which the caller refuses)."""
  removed, kept = [], []
  for name in linked_entries(checkpoint_dir, step):
    path = os.path.join(checkpoint_dir, name)
    if name.isdigit() and step is None:
      kept.append(name)
      continue
    warn(f'{path} is a symbolic link: removing the link (not following it)')
    remove(path)
    removed.append(name)
  return removed, kept


def remove(path: str) -> None:
  """Removes a step folder; a symlink is unlinked, never followed."""
  if os.path.islink(path) or not os.path.isdir(path):
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)
  else:
    shutil.rmtree(path, ignore_errors=True)


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


# -- trees ----------------------------------------------------------------------------------

def shape_mismatches(expected: Any, stored: Any, prefix: str = '') -> list[str]:
  """Differences (one line each) between two trees of arrays or ShapeDtypeStructs: the model's
  and a checkpoint's (stored arrays or their metadata). Used by restore and by decode.py."""
  if isinstance(expected, dict) or isinstance(stored, dict):
    if not (isinstance(expected, dict) and isinstance(stored, dict)):
      return [f'{prefix or "<root>"}: structure differs']
    expected, stored = int_keys(expected), int_keys(stored)
    out = []
    for key in sorted(set(expected) | set(stored), key=str):
      if key not in expected or key not in stored:
        out.append(f'{prefix}{key}: only in the {"checkpoint" if key in stored else "model"}')
      else:
        out += shape_mismatches(expected[key], stored[key], f'{prefix}{key}/')
    return out
  shape = getattr(stored, 'shape', None)
  if shape is not None and tuple(shape) != tuple(expected.shape):
    return [f'{prefix.rstrip("/")}: checkpoint {tuple(shape)} vs model {tuple(expected.shape)}']
  return []


# Parameter names only version 0.1's Linen model had (`encoder/layer_0/...`,
# `.../norm/LayerNorm_0/scale`); 0.2's NNX model has `layers/0`, `<sub-layer>_norm`.
_V01_NAMES = re.compile(r'^(layer_\d+|LayerNorm_0)$')


def older_layout(params: Any, step: int, workdir: str) -> str | None:
  """Why checkpoint `step`'s stored params tree cannot be restored, when it has version 0.1's
  (Linen) parameter names; else None."""
  def old(tree):
    return isinstance(tree, dict) and any(_V01_NAMES.match(str(k)) or old(v)
                                          for k, v in tree.items())
  if not old(params):
    return None
  return (f'checkpoint {step} in {os.path.join(workdir, "checkpoints")} was written by version '
          "0.1 (the Linen model's parameter layout); version 0.2 cannot restore it: train it "
          'again with this version (CHANGELOG.md, 0.2.0)')


def int_keys(tree: Any) -> Any:
  """`tree` with its digit-string dict keys as ints: Orbax stores a layer list's indices
  (`layers/0`) as names, the model's pure dict has them as ints."""
  if not isinstance(tree, dict):
    return tree
  return {int(k) if isinstance(k, str) and k.isdigit() else k: int_keys(v)
          for k, v in tree.items()}


def params_tree(state_tree: Any) -> Any:
  """The `params` subtree of a TrainState-like pytree as nested dicts (for shape comparison)."""
  import jax  # pylint: disable=import-outside-toplevel
  params = state_tree['params'] if isinstance(state_tree, dict) else state_tree.params
  return jax.tree_util.tree_map(lambda x: x, params)



def gather_json(value: Any) -> list[Any]:
  """Every process's JSON-serialisable `value`, in process order (a collective)."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return [value]
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
  length = int(np.max(multihost_utils.process_allgather(np.array([encoded.size]))))
  padded = np.zeros(length, np.uint8)
  padded[:encoded.size] = encoded
  gathered = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row).rstrip(b'\0').decode()) for row in gathered]


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
  relative to `root`, at most ~200 characters. Our callers report Orbax failures through
  it, so it also notes that Orbax may have abandoned work (`orbax_noise.note_failure`)."""
  orbax_noise.note_failure()
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
