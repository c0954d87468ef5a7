"""Where an export may be written, and how it replaces a previous one without losing anything.

  path = check_output_dir(output_dir, workdir, overwrite)   # before anything is read or written
  staging = make_staging(path)                              # a private directory beside it
  ... write the files into staging, then write_marker(staging, info) ...
  publish(staging, path)                                    # rename into place

Rules (resolved paths: symbolic links and `..` followed):
- the output directory is never the workdir, inside it, or one of its ancestors, with or
  without `--overwrite` (an export must not replace or mix with the checkpoints it reads),
  judged by device and inode too (`common.files.inside`: a bind mount of the workdir);
- an existing non-empty output directory is replaced only with `--overwrite`, and only when
  it is a previous export: a directory holding the `MARKER` file every export writes and no
  other entry than the files that marker lists (so a workdir, a home directory, a typo, or an
  export someone has since put their own files into, is never deleted);
- the output path itself may not be a symbolic link (which of the two would be replaced is
  not obvious);
- the replaced export is moved aside first and removed only once the new one is in place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from common.atomic_file import write_output
from common.files import inside, read_regular

MARKER = 'export_info.json'


class ExportError(Exception):
  """A user-facing error: one line, no traceback."""


def _within(path: str, root: str) -> bool:
  """`path` is `root` or below it (both resolved)."""
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def is_previous_export(path: str) -> bool:
  """A directory an export wrote: a regular `MARKER` file (not a link) naming export.py, and
  nothing but the regular files that marker lists."""
  marker = os.path.join(path, MARKER)
  if os.path.islink(marker) or not os.path.isfile(marker):
    return False
  try:
    info = json.loads(read_regular(marker))
  except (OSError, ValueError):
    return False
  if not isinstance(info, dict) or info.get('written_by') != 'export.py':
    return False
  listed = set(info.get('files') or ())
  for name in os.listdir(path):
    entry = os.path.join(path, name)
    if name not in listed or os.path.islink(entry) or not os.path.isfile(entry):
      return False
  return True


def check_output_dir(output_dir: str | None, workdir: str | None, overwrite: bool) -> str:
  """The absolute output path, or ExportError (one line) if the rules above refuse it."""
  if not output_dir:
    raise ExportError('--output_dir is required (a new directory for the exported model)')
  path = os.path.abspath(output_dir)
  if workdir:
    real, work = os.path.realpath(path), os.path.realpath(workdir)
    if inside(real, work) or inside(work, real) or _within(real, work) or _within(work, real):
      where = ('is' if inside(real, work) and inside(work, real) else
               'is inside' if inside(real, work) or _within(real, work) else 'contains')
      raise ExportError(f'--output_dir {output_dir} {where} the workdir {workdir}: an export '
                        'never writes into (or replaces) the workdir it reads; give a '
                        'directory outside it')
  if os.path.islink(path):
    raise ExportError(f'--output_dir {output_dir} is a symbolic link: give the directory itself')
  if os.path.exists(path) and not os.path.isdir(path):
    raise ExportError(f'--output_dir {output_dir} exists and is not a directory')
  if os.path.isdir(path) and os.listdir(path):
    if not overwrite:
      raise ExportError(f'--output_dir {output_dir} exists and is not empty (give a new '
                        'directory, or --overwrite to replace a previous export)')
    if not is_previous_export(path):
      raise ExportError(f'--output_dir {output_dir} is not a previous export (no {MARKER} '
                        'written by export.py, or other files beside the export): '
                        '--overwrite only replaces an export; remove the directory yourself '
                        'or give another one')
  parent = os.path.dirname(path)
  if not os.path.isdir(parent):
    raise ExportError(f'the parent directory of --output_dir {output_dir} '
                      f'{"is a file" if os.path.exists(parent) else "does not exist"}')
  if not os.access(parent, os.W_OK):
    raise ExportError(f'cannot write in {parent} (the parent of --output_dir)')
  return path


def make_staging(path: str) -> str:
  """A new private directory beside `path` to write the export into."""
  return tempfile.mkdtemp(prefix=f'.{os.path.basename(path)}.tmp-', dir=os.path.dirname(path))


def write_marker(directory: str, info: dict) -> None:
  """Writes `MARKER` (what was exported, from where, how to run it, and the files written)
  into `directory`, once every other file is there."""
  files = sorted({*os.listdir(directory), MARKER})
  text = json.dumps({'written_by': 'export.py', **info, 'files': files}, indent=2, sort_keys=True)
  write_output(os.path.join(directory, MARKER), text + '\n', what='export marker')


def _publish_permissions(directory: str) -> None:
  """mkdtemp makes a private (0700) directory: give it and its files the usual umask modes."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(directory, 0o777 & ~umask)
  for name in os.listdir(directory):
    os.chmod(os.path.join(directory, name), 0o666 & ~umask)


def publish(staging: str, path: str) -> None:
  """Renames `staging` to `path`. A previous export at `path` (checked by `check_output_dir`,
  and again here in case it changed since) is moved aside first and removed only after."""
  _publish_permissions(staging)
  old = None
  if os.path.lexists(path):
    if os.path.islink(path) or (os.listdir(path) and not is_previous_export(path)):
      raise ExportError(f'{path} changed while exporting and is no longer a previous export: '
                        'left as it is')
    old = tempfile.mkdtemp(prefix='.old-', dir=os.path.dirname(path))
    os.rename(path, os.path.join(old, 'previous'))
  os.rename(staging, path)
  if old:
    shutil.rmtree(old, ignore_errors=True)
