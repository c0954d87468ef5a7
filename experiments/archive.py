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
"""

from __future__ import annotations

import argparse
import glob
import gzip
import os
import shutil
import sys

from experiments import evaluate

REFS = 'sweep_eval'  # the references, once per archive


def _runs(root: str) -> list[str]:
  """ROW/seed_S of every evaluated run under `root`."""
  found = glob.glob(os.path.join(root, '*', 'seed_*', evaluate.EVAL_DIR, evaluate.RESULTS_FILE))
  return sorted(os.path.relpath(os.path.dirname(os.path.dirname(p)), root) for p in found)


def _gzip(src: str, dst: str) -> None:
  with open(src, 'rb') as f, gzip.GzipFile(dst, 'wb', mtime=0) as g:  # mtime 0: same bytes
    shutil.copyfileobj(f, g)


def _gunzip(src: str, dst: str) -> None:
  with gzip.open(src, 'rb') as f, open(dst, 'wb') as g:
    shutil.copyfileobj(f, g)


def _bytes(path: str) -> bytes | None:
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError:
    return None


def _gunzipped(path: str) -> bytes | None:
  try:
    with gzip.open(path, 'rb') as f:
      return f.read()
  except OSError:
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


def restore(archive: str, root: str) -> list[str]:
  """Puts every archived run that `root` does not have into it -> the runs restored."""
  restored = []
  for run in _runs(archive):
    src, final = os.path.join(archive, run), os.path.join(root, run)
    if os.path.exists(final):
      continue
    # Written under a hidden name, renamed into place when whole: a failed restore leaves no run.
    dst = os.path.join(os.path.dirname(final), f'.{os.path.basename(final)}.restoring')
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.join(dst, evaluate.EVAL_DIR))
    for name in os.listdir(src):
      if os.path.isfile(os.path.join(src, name)):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    for split in evaluate.SPLITS:
      hyp = os.path.join(src, evaluate.EVAL_DIR, f'{split}.hyp.gz')
      if os.path.exists(hyp):
        _gunzip(hyp, evaluate.split_file(dst, split, 'hyp'))
        own = os.path.join(src, evaluate.EVAL_DIR, f'{split}.ref.gz')
        ref = own if os.path.exists(own) else os.path.join(archive, REFS, f'{split}.ref.gz')
        _gunzip(ref, evaluate.split_file(dst, split, 'ref'))
    shutil.copyfile(os.path.join(src, evaluate.EVAL_DIR, evaluate.RESULTS_FILE),
                    evaluate.results_path(dst))
    os.rename(dst, final)
    restored.append(run)
  return restored


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
  source = args.root if args.command == 'save' else args.archive
  if not os.path.isdir(source):
    print(f'{ap.prog}: error: {source} is not a directory', file=sys.stderr)
    return 2
  try:
    if args.command == 'save':
      done, what = save(args.root, args.to), f'archived {{}} run(s) into {args.to}'
    else:
      done, what = restore(args.archive, args.root), f'restored {{}} run(s) into {args.root}'
  except OSError as e:  # a full disk, a read-only destination: what was finished is kept
    where = f' ({e.filename})' if e.filename else ''
    print(f'{ap.prog}: error: {e.strerror or e}{where}', file=sys.stderr)
    return 1
  print(what.format(len(done)) + (f': {", ".join(done)}' if done else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main())
