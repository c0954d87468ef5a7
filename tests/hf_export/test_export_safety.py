"""export.py never loses data and fails in one line: the output
directory is never the workdir, inside it or above it (symlinks resolved), --overwrite
replaces only a previous export, bad flags exit 2, a missing optional package names its extra.
"""

import json
import os
import subprocess
import sys
import threading
import types

import pytest

from common import atomic_file, interrupts
from hf_export import ExportError, output_dir, writer
from tests import REPO, export_workdirs
from tests.shared_dirs import tree_digest


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  return export_workdirs.trained(tmp_path_factory, 'mt')


def _export(*args, prelude=''):
  """export.py in a subprocess; `prelude` runs first (e.g. hides a package)."""
  code = (f'import sys, runpy\n{prelude}\nsys.argv = ["export.py", *{list(args)!r}]\n'
          'runpy.run_path("export.py", run_name="__main__")\n')
  return subprocess.run([sys.executable, '-c', code], cwd=REPO, env=export_workdirs.env(),
                        capture_output=True, text=True, check=False)


def _one_error_line(proc, *words):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stderr
  assert len(lines) == 1 and lines[0].startswith('export.py: error: '), proc.stderr
  for word in words:
    assert word in lines[0], lines[0]
  return lines[0]


def test_inside_above_and_through_symlinks_are_refused(workdir, tmp_path):
  """The workdir itself too (`..` and a link), changing nothing and making no staging directory
  beside it. (export.py turned it into one line, exit 2, in a process of its own: the same
  `except` as --step=99999999999999999999's in test_bad_flags_are_one_line_exit_2.)"""
  before = tree_digest(workdir)
  (tmp_path / 'to_workdir').symlink_to(workdir)
  (tmp_path / 'to_checkpoints').symlink_to(os.path.join(workdir, 'checkpoints'))
  cases = [(os.path.join(workdir, 'checkpoints'), 'is inside'),
           (os.path.join(workdir, 'new_export'), 'is inside'),
           (os.path.dirname(workdir), 'contains'),
           (os.path.join(workdir, '..', os.path.basename(workdir)), 'is the workdir'),
           (str(tmp_path / 'to_workdir'), 'is the workdir'),  # a link to it
           (str(tmp_path / 'to_checkpoints' / 'x'), 'is inside')]  # a path through a link
  for out, words in cases:
    for overwrite in (False, True):
      with pytest.raises(ExportError, match=words):
        writer.export_workdir(workdir, out, overwrite=overwrite, format='ctranslate2')
  # The workdir given through a link is the same workdir.
  with pytest.raises(ExportError, match='contains'):
    writer.export_workdir(str(tmp_path / 'to_workdir'), os.path.dirname(workdir),
                          overwrite=True)
  assert tree_digest(workdir) == before
  assert not os.path.exists(os.path.join(workdir, 'new_export'))
  staging = [n for n in os.listdir(os.path.dirname(workdir)) if n.startswith('.')]
  assert not staging  # no temporary directory was made beside it


def test_overwrite_replaces_only_a_previous_export(workdir, tmp_path):
  out = tmp_path / 'out'
  writer.export_workdir(workdir, str(out), format='ctranslate2')
  assert output_dir.is_previous_export(str(out))
  first = tree_digest(out)
  with pytest.raises(ExportError, match='not empty'):  # no --overwrite: refused
    writer.export_workdir(workdir, str(out), format='ctranslate2')
  writer.export_workdir(workdir, str(out), step=125, overwrite=True)  # an export: replaced
  assert output_dir.is_previous_export(str(out)) and tree_digest(out) != first
  assert sorted(os.listdir(tmp_path)) == ['out']  # the old copy is gone, no staging left

  # A directory that is not an export, or an export someone added files to, is never replaced.
  victims = {'mine': {'notes.txt': b'keep me'},
             'export_plus': {**{n: (out / n).read_bytes() for n in os.listdir(out)},
                             'my_results.txt': b'keep me too'}}
  for name, files in victims.items():
    victim = tmp_path / name
    victim.mkdir()
    for file, data in files.items():
      (victim / file).write_bytes(data)
    before = tree_digest(victim)
    with pytest.raises(ExportError, match='not a previous export'):
      writer.export_workdir(workdir, str(victim), overwrite=True, format='ctranslate2')
    assert tree_digest(victim) == before
  link = tmp_path / 'link'
  link.symlink_to(out)
  with pytest.raises(ExportError, match='symbolic link'):
    writer.export_workdir(workdir, str(link), overwrite=True)
  a_file = tmp_path / 'mine' / 'notes.txt'
  for below, words in ((tmp_path / 'none' / 'x', 'does not exist'), (a_file / 'x', 'is a file')):
    with pytest.raises(ExportError, match=f'the parent directory of --output_dir {below} {words}'):
      output_dir.check_output_dir(str(below), workdir, False)
  assert sorted(os.listdir(tmp_path)) == ['export_plus', 'link', 'mine', 'out']


@pytest.mark.parametrize('flag,words', [
    ('--step=abc', ['--step=abc']),
    ('--average_last=1.5', ['--average_last=1.5']),
    ('--step=99999999999999999999', ['--step=99999999999999999999', 'integer in'])])
def test_bad_flags_are_one_line_exit_2(workdir, tmp_path, flag, words):
  proc = _export(f'--workdir={workdir}', f'--output_dir={tmp_path / "out"}', flag)
  _one_error_line(proc, *words)
  assert os.listdir(tmp_path) == []


MISSING = [('transformers', 'transformers', 'hf'), ('torch', 'transformers', 'hf'),
           ('ctranslate2', 'ctranslate2', 'ct2')]
# export.py's main once per (hidden package, flags), in one interpreter (a process each spent
# ~2-3 s on start-up and imports): the package is hidden for its command line only, and the
# flags export.py defined are dropped before the next, as tests/mains.py does.
_EACH_WITHOUT_ITS_PACKAGE = """
import contextlib, io, json, sys
from absl import flags
import export
from workdir import cli
FLAGS, results = flags.FLAGS, []
for package, args in json.loads(sys.argv[1]):
  before, kept = set(FLAGS), sys.modules.get(package)
  sys.modules[package] = None  # import PACKAGE fails, as if it were not installed
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      export._define_flags()
      sys.argv = ['export.py', *args]
      export.main(cli.parse_absl_flags('export.py', sys.argv))
      code = 0
    except SystemExit as e:
      code = e.code
  if kept is None:
    del sys.modules[package]
  else:
    sys.modules[package] = kept
  for name in set(FLAGS) - before:
    delattr(FLAGS, name)
  FLAGS.unparse_flags()
  results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_missing_package_names_its_extra(workdir, tmp_path):
  """Each optional package missing in turn: one line naming it and its extra, exit 2, nothing
  written. (transformers fails at its import, torch at the check before the restore.)"""
  runs = [(package, [f'--workdir={workdir}', f'--output_dir={tmp_path / package}',
                     f'--format={fmt}']) for package, fmt, _ in MISSING]
  proc = subprocess.run([sys.executable, '-c', _EACH_WITHOUT_ITS_PACKAGE, json.dumps(runs)],
                        cwd=REPO, env=export_workdirs.env(), capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads(proc.stdout)
  assert len(results) == len(MISSING)
  for (package, _, extra), (code, err) in zip(MISSING, results, strict=True):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('export.py: error: '), err
    assert package in lines[0] and f"pip install -e '.[{extra}]'" in lines[0], lines[0]
  assert os.listdir(tmp_path) == []


def test_sigterm_stops_an_export_in_one_line_and_leaves_nothing(workdir, tmp_path):
  """Issue 45 item 17: SIGTERM during the write left a `.NAME.tmp-*` staging directory (the
  default action kills before any cleanup). It now ends like Ctrl-C: one line, exit 130, the
  staging directory removed, nothing published. (The CTranslate2 format: the staging, its
  marker and the signal handling are both formats' (output_dir, writer._write), and its
  process does not import torch and transformers, ~3 s.)"""
  out = tmp_path / 'ct2'
  prelude = ('import os, signal\nfrom hf_export import output_dir\n'
             'write = output_dir.write_marker\n'
             'def killed(*a, **k):\n'
             '  os.kill(os.getpid(), signal.SIGTERM)  # while the export is being written\n'
             '  return write(*a, **k)\n'
             'output_dir.write_marker = killed\n')
  proc = _export(f'--workdir={workdir}', f'--output_dir={out}', '--format=ctranslate2',
                 prelude=prelude)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 130 and lines == [f'export.py: error: interrupted; {out} is as it '
                                              'was'], proc.stderr
  assert os.listdir(tmp_path) == []  # no staging directory, no lock, no export


def test_an_interrupt_python_dropped_still_stops_before_publishing(tmp_path, monkeypatch):
  """A KeyboardInterrupt raised inside a gc callback (JAX's `_xla_gc_callback`) is printed as
  'Exception ignored' and lost: the export went on to exit 0. The request is remembered and
  checked before the export is published."""
  def write(staging, restored, *configs_and_metadata):
    with open(os.path.join(staging, 'weights'), 'w') as f:
      f.write('w')
    return 'an export', {}
  monkeypatch.setattr(interrupts, '_requested', threading.Event())
  interrupts._requested.set()  # the handler ran; its exception went nowhere
  with pytest.raises(KeyboardInterrupt):
    writer._write(types.SimpleNamespace(name='test', write=write), str(tmp_path / 'out'), None,
                  (), {})
  assert os.listdir(tmp_path) == []


def test_the_next_export_removes_what_a_killed_one_left(workdir, tmp_path):
  """SIGKILL during the write (no cleanup can run) leaves the `.NAME.tmp-*` staging directory
  and `.NAME.lock` beside the output; the next export to that output, holding the lock (no
  writer of it is alive), removes them, and nothing else of a similar name."""
  out = tmp_path / 'out'
  prelude = ('import os, signal\nfrom hf_export import output_dir\n'
             'def killed(*a, **k):\n'
             '  os.kill(os.getpid(), signal.SIGKILL)  # while the export is being written\n'
             'output_dir.write_marker = killed\n')
  proc = _export(f'--workdir={workdir}', f'--output_dir={out}', '--format=ctranslate2',
                 prelude=prelude)
  assert proc.returncode == -9, proc.stderr
  left = sorted(os.listdir(tmp_path))
  assert len(left) == 2 and left[0] == '.out.lock' and left[1].startswith('.out.tmp-'), left
  assert os.listdir(tmp_path / left[1])  # the files written before the kill
  kept = [tmp_path / '.out.tmp-deep1234', tmp_path / '.out.tmp-link1234', tmp_path / 'x.tmp']
  (kept[0] / 'sub').mkdir(parents=True)  # not an export's staging: it holds a folder
  kept[1].symlink_to(out)
  kept[2].write_text('mine')
  writer.export_workdir(workdir, str(out), format='ctranslate2')
  assert output_dir.is_previous_export(str(out))
  assert sorted(os.listdir(tmp_path)) == sorted(['out', *(p.name for p in kept)])
  assert atomic_file.remove_leftovers(str(out)) == []

