"""A sweep's evaluated runs without their checkpoints: what its table needs, small enough to
keep (a Multi30k run: ~60 KB against ~100 MB of checkpoints), and put back into a root where
`sweep.py` counts them as done and `--report` tables them.

    python -m experiments.archive save --root=runs/NAME --to=DIR      # every evaluated run
    python -m experiments.archive restore --from=DIR --root=runs/NAME # then sweep.py resumes

A run's archive is `DIR/ROW/seed_S/`: config.json, its TensorBoard events (the curves) and
`sweep_eval/` (results.json; the outputs gzipped). The references, the same for the runs of a
sweep, are kept once (`DIR/sweep_eval/SPLIT.ref.gz`; a run whose references differ keeps its
own). Saving skips runs already archived with the same results.json; restoring never overwrites
a run the root already has (trained or not).

An archive may come from someone else: restoring reads regular files inside it only (a symlink,
a FIFO or a device is refused, never followed or waited on), each at most MAX_BYTES once
expanded and a run's at most MAX_RUN_BYTES (a truncated or bomb `.gz` is refused), and refuses
a results.json the sweep could not read; each refused run is one line, the others are
restored, and a run is renamed into place only when whole (a failure leaves nothing of it
behind).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import shutil
import stat
import sys
import zlib

from experiments import evaluate

REFS = 'sweep_eval'  # the references, once per archive
MAX_BYTES = 1 << 30  # what one restored file may hold (a run's are a few MB at most)
MAX_RUN_BYTES = 4 << 30  # and all of a run's files together
_CHUNK = 1 << 20


class ArchiveError(ValueError):
  """An archive's run that is refused (a link, a special file, a damaged or oversized file):
  one line naming the file; nothing of that run is restored."""


def _runs(root: str) -> list[str]:
  """ROW/seed_S of every evaluated run under `root`."""
  found = glob.glob(os.path.join(root, '*', 'seed_*', evaluate.EVAL_DIR, evaluate.RESULTS_FILE))
  return sorted(os.path.relpath(os.path.dirname(os.path.dirname(p)), root) for p in found)


def _gzip(src: str, dst: str) -> None:
  from common.files import open_regular  # pylint: disable=import-outside-toplevel
  with open_regular(src) as f, gzip.GzipFile(dst, 'wb', mtime=0) as g:  # mtime 0: same bytes
    shutil.copyfileobj(f, g)


def _bytes(path: str) -> bytes | None:
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  try:
    return read_regular(path)
  except OSError:
    return None


def _gunzipped(path: str) -> bytes | None:
  from common.files import open_regular  # pylint: disable=import-outside-toplevel
  try:
    with open_regular(path) as raw, gzip.GzipFile(fileobj=raw, mode='rb') as f:
      return f.read()
  except (OSError, EOFError, zlib.error):
    return None


def save(root: str, to: str) -> list[str]:
  """Archives every evaluated run of `root` into `to` -> the runs written."""
  written = []
  for run in _runs(root):
    src, dst = os.path.join(root, run), os.path.join(to, run)
    results = os.path.join(src, evaluate.EVAL_DIR, evaluate.RESULTS_FILE)
    kept = os.path.join(dst, evaluate.EVAL_DIR, evaluate.RESULTS_FILE)
    if _bytes(kept) is not None and _bytes(kept) == _bytes(results):
      continue
    os.makedirs(os.path.join(dst, evaluate.EVAL_DIR), exist_ok=True)
    for name in ['config.json', *map(os.path.basename,
                                     glob.glob(os.path.join(src, 'events.out.tfevents.*')))]:
      shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    for split in evaluate.SPLITS:
      hyp = evaluate.split_file(src, split, 'hyp')
      if os.path.exists(hyp):
        _gzip(hyp, os.path.join(dst, evaluate.EVAL_DIR, f'{split}.hyp.gz'))
        ref = evaluate.split_file(src, split, 'ref')
        once = os.path.join(to, REFS, f'{split}.ref.gz')
        if not os.path.exists(once):
          os.makedirs(os.path.dirname(once), exist_ok=True)
          _gzip(ref, once)
        elif _gunzipped(once) != _bytes(ref):
          _gzip(ref, os.path.join(dst, evaluate.EVAL_DIR, f'{split}.ref.gz'))
    shutil.copyfile(results, kept + '.tmp')  # last: a run is archived when results.json is
    os.replace(kept + '.tmp', kept)
    written.append(run)
  return written


def _check_dirs(archive: str, run: str) -> None:
  """The run's folders in the archive are folders, not links out of it."""
  path = archive
  for part in [*run.split(os.sep), evaluate.EVAL_DIR]:
    path = os.path.join(path, part)
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
      raise ArchiveError(f'{path} is {"a symbolic link" if stat.S_ISLNK(mode) else "not a folder"}'
                         ': an archive holds folders and regular files only')


def _source(path: str):
  """`path` opened for reading if it is a regular file of the archive (never through a link,
  never a FIFO), else ArchiveError."""
  from common.files import open_regular  # pylint: disable=import-outside-toplevel
  try:
    return open_regular(path, follow=False)
  except FileNotFoundError:
    raise ArchiveError(f'{path} is missing from the archive') from None
  except OSError as e:
    if isinstance(e, IsADirectoryError) or 'not a regular file' in str(e):
      raise ArchiveError(f'{e}: an archive holds regular files only') from None
    raise


def _copy(src: str, dst: str, *, gunzip: bool = False, used: int = 0) -> int:
  """The archive's file `src` (gunzipped) written to `dst`, at most MAX_BYTES, and at most
  MAX_RUN_BYTES with the `used` bytes of its run -> the bytes written; ArchiveError for a file
  refused, OSError naming `dst` when writing fails (a full disk)."""
  with _source(src) as raw:
    reader = gzip.GzipFile(fileobj=raw, mode='rb') if gunzip else raw
    try:
      out = open(dst, 'xb')  # pylint: disable=consider-using-with  (a fresh folder of ours)
    except OSError as e:
      raise OSError(e.errno, e.strerror, dst) from None
    with out:
      written = 0
      while True:
        try:
          chunk = reader.read(_CHUNK)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
          raise ArchiveError(f'{src} is truncated or not gzip ({type(e).__name__}: '
                             f'{" ".join(str(e).split())})') from None
        if not chunk:
          break
        written += len(chunk)
        if written > MAX_BYTES:
          raise ArchiveError(f'{src} holds more than {MAX_BYTES:,} bytes'
                             f'{" once expanded" if gunzip else ""}: refused')
        if used + written > MAX_RUN_BYTES:
          raise ArchiveError(f'{src}: its run\'s files hold more than {MAX_RUN_BYTES:,} bytes '
                             'in all: refused')
        try:
          out.write(chunk)
        except OSError as e:
          raise OSError(e.errno, e.strerror, dst) from None
  return written


def restore(archive: str, root: str, refused: list[str] | None = None) -> list[str]:
  """Puts every archived run that `root` does not have into it -> the runs restored. A run
  the archive cannot give safely (`ArchiveError`) raises, or, with `refused` (a list), is
  added to it as one line and skipped. OSError (a full disk) names the file written."""
  restored = []
  for run in _runs(archive):
    src, final = os.path.join(archive, run), os.path.join(root, run)
    if os.path.lexists(final):
      continue
    # Written under a hidden name, renamed into place when whole: a failed restore leaves no run.
    dst = os.path.join(os.path.dirname(final), f'.{os.path.basename(final)}.restoring')
    shutil.rmtree(dst, ignore_errors=True)
    try:
      _restore_run(archive, run, src, dst)
      os.rename(dst, final)
    except ArchiveError as e:
      shutil.rmtree(dst, ignore_errors=True)
      if refused is None:
        raise
      refused.append(f'{run}: {e}')
      continue
    except BaseException:
      shutil.rmtree(dst, ignore_errors=True)
      raise
    restored.append(run)
  return restored


def _restore_run(archive: str, run: str, src: str, dst: str) -> None:
  _check_dirs(archive, run)
  results = os.path.join(src, evaluate.EVAL_DIR, evaluate.RESULTS_FILE)
  problem = evaluate.results_problem(results)
  if problem:
    raise ArchiveError(f'{results}: {problem}')
  try:
    os.makedirs(os.path.join(dst, evaluate.EVAL_DIR))
  except OSError as e:
    raise OSError(e.errno, e.strerror, dst) from None
  used = 0
  for name in sorted(os.listdir(src)):
    if not stat.S_ISDIR(os.lstat(os.path.join(src, name)).st_mode):  # all but regular files
      used += _copy(os.path.join(src, name), os.path.join(dst, name), used=used)  # refused
  for split in evaluate.SPLITS:
    hyp = os.path.join(src, evaluate.EVAL_DIR, f'{split}.hyp.gz')
    if os.path.lexists(hyp):
      used += _copy(hyp, evaluate.split_file(dst, split, 'hyp'), gunzip=True, used=used)
      own = os.path.join(src, evaluate.EVAL_DIR, f'{split}.ref.gz')
      ref = own if os.path.lexists(own) else os.path.join(archive, REFS, f'{split}.ref.gz')
      used += _copy(ref, evaluate.split_file(dst, split, 'ref'), gunzip=True, used=used)
  _copy(results, evaluate.results_path(dst), used=used)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog='python -m experiments.archive', description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest='command', required=True)
  s = sub.add_parser('save', help="a root's evaluated runs into an archive")
  s.add_argument('--root', required=True, help="the sweep's root (sweep.py's --root)")
  s.add_argument('--to', required=True, help='the archive: a directory, made if needed')
  r = sub.add_parser('restore', help="an archive's runs into a root")
  r.add_argument('--from', dest='archive', required=True, help='the archive (save\'s --to)')
  r.add_argument('--root', required=True, help='the sweep root to restore the runs into')
  if '--helpfull' in (sys.argv[1:] if argv is None else argv):  # as the absl commands have
    print('\n\n'.join(p.format_help() for p in (ap, s, r)), end='')
    return 0
  args = ap.parse_args(argv)
  source, destination = ((args.root, args.to) if args.command == 'save' else
                         (args.archive, args.root))
  if not os.path.isdir(source):
    print(f'{ap.prog}: error: {source} is not a directory', file=sys.stderr)
    return 2
  if os.path.lexists(destination) and not os.path.isdir(destination):
    print(f'{ap.prog}: error: {destination} exists and is not a directory', file=sys.stderr)
    return 2
  refused: list[str] = []
  try:
    if args.command == 'save':
      done, what = save(args.root, args.to), f'archived {{}} run(s) into {args.to}'
    else:
      done, what = (restore(args.archive, args.root, refused),
                    f'restored {{}} run(s) into {args.root}')
  except OSError as e:  # a full disk, a read-only destination: what was finished is kept
    where = f' ({e.filename})' if e.filename else ''
    print(f'{ap.prog}: error: {e.strerror or e}{where}', file=sys.stderr)
    return 1
  print(what.format(len(done)) + (f': {", ".join(done)}' if done else ''))
  for line in refused:
    print(f'{ap.prog}: error: {" ".join(line.split())}', file=sys.stderr)
  return 2 if refused else 0


if __name__ == '__main__':
  sys.exit(main())
