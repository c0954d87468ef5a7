"""One way to write a file (`common.atomic_file`) and one way to read one (`common.files`):
issue 45 items 1, 2, 3, 11 and 14 (outputs), in-process. A hang on a FIFO becomes a failure
through SIGALRM; a full disk is a patched writer and a small tmpfs, a bind mount a real one:
mounted by root in-process, and by any user in a user namespace of its own (`unshare -Urm`)."""

import contextlib
import errno
import gc
import io
import json
import os
import signal
import subprocess
import sys

import pytest

from common.atomic_file import OutputError, OutputFile, write_output
from common.errors import EXIT_FAILED, EXIT_REFUSED, exit_code
from inference import streaming
from tests import REPO


@contextlib.contextmanager
def no_hang(seconds=10):
  """Fails the test instead of hanging it (an open() waiting on a FIFO)."""
  def fail(*_):
    raise TimeoutError(f'blocked for {seconds}s')
  previous = signal.signal(signal.SIGALRM, fail)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def mounted(*args):
  """`mount ARGS` for the block (skips the test where this user cannot mount)."""
  target = args[-1]
  os.makedirs(target, exist_ok=True)
  proc = subprocess.run(['mount', *args], capture_output=True, check=False)
  if proc.returncode != 0:
    pytest.skip(f'cannot mount here: {proc.stderr.decode().strip()}')
  try:
    yield target
  finally:
    subprocess.run(['umount', '-l', target], check=False)


def make_workdir(root):
  """The entries that make a directory a workdir (what `train.py` leaves)."""
  workdir = root / 'w'
  for folder in ('checkpoints/5/data', 'tokenizer'):
    (workdir / folder).mkdir(parents=True)
  for name in ('config.json', 'best_metrics.json', 'train.lock', 'events.out.tfevents.1.h',
               'tokenizer/spm.model', 'checkpoints/5/data/d'):
    (workdir / name).write_text('{"kept": true}\n')
  return workdir


def one_line(error) -> str:
  text = str(error.value)
  assert '\n' not in text
  return text


# ----------------------------------------------------------------------------- writing

def test_an_output_replaces_its_file_whole_with_nothing_left_beside(tmp_path):
  path = tmp_path / 'out.txt'
  path.write_text('old\n')
  with open(path) as reader:  # a reader of the old file keeps reading the old file
    assert write_output(str(path), 'new\n') == str(path)
    assert reader.read() == 'old\n'
  assert path.read_text() == 'new\n'
  assert os.listdir(tmp_path) == ['out.txt']  # no temporary file, no lock file
  umask = os.umask(0)
  os.umask(umask)
  assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_links_fifos_devices_and_directories_are_refused(tmp_path):
  target = tmp_path / 'target.txt'
  target.write_text('precious\n')
  (tmp_path / 'link').symlink_to(target)
  os.mkfifo(tmp_path / 'fifo')
  for path, kind in ((tmp_path / 'link', 'a symbolic link'), (tmp_path / 'fifo', 'a FIFO'),
                     ('/dev/null', 'a device'), (tmp_path, 'a directory')):
    with no_hang(), pytest.raises(OutputError) as error:
      write_output(str(path), 'x\n', what='--output_file')
    assert one_line(error).startswith(f'--output_file {path} is {kind}: refusing')
  assert target.read_text() == 'precious\n'


def test_a_workdirs_own_files_are_refused_however_spelled(tmp_path):
  workdir = make_workdir(tmp_path)
  (tmp_path / 'alias').symlink_to(workdir)
  own = ['config.json', 'best_metrics.json', 'train.lock', 'events.out.tfevents.1.h',
         'tokenizer/spm.model', 'checkpoints/5/data/d', 'checkpoints/9/new']
  for root in (workdir, tmp_path / 'alias'):
    for name in own:
      with pytest.raises(OutputError) as error:
        write_output(str(root / name), 'x\n', what='--output_file')
      assert "a workdir's own" in one_line(error), name
  assert (workdir / 'config.json').read_text() == '{"kept": true}\n'
  # A workdir named by the command is protected even without its marks (config.json is new).
  bare = tmp_path / 'bare'
  bare.mkdir()
  with pytest.raises(OutputError):
    write_output(str(bare / 'best_metrics.json'), 'x\n', workdirs=[str(bare)])
  # Beside a workdir's files is fine (experiments.report's output inside a workdir).
  write_output(str(workdir / 'report' / 'summary.md'), 'table\n')
  write_output(str(workdir / 'notes.txt'), 'mine\n')


def test_a_bind_mount_of_a_workdir_is_still_the_workdir(tmp_path):
  workdir = make_workdir(tmp_path)
  with mounted('--bind', str(workdir), str(tmp_path / 'mnt')) as mnt:
    with pytest.raises(OutputError):  # found by its marks through the mount
      write_output(os.path.join(mnt, 'checkpoints', '5', 'data', 'd'), 'x\n')
    os.remove(workdir / 'config.json')  # no marks: only device and inode can tell
    with pytest.raises(OutputError):
      write_output(os.path.join(mnt, 'checkpoints', 'x'), 'x\n', workdirs=[str(workdir)])
    from hf_export import output_dir
    with pytest.raises(output_dir.ExportError, match='is inside the workdir'):
      output_dir.check_output_dir(os.path.join(mnt, 'export'), str(workdir), False)
  assert (workdir / 'checkpoints/5/data/d').read_text() == '{"kept": true}\n'


def test_a_second_writer_is_refused_until_the_first_is_done(tmp_path):
  path = str(tmp_path / 'out.txt')
  first = OutputFile(path, what='--output_file')
  first.write('a\n')
  with pytest.raises(OutputError) as error:
    OutputFile(path, what='--output_file')
  assert 'is being written by another process' in one_line(error)
  first.write('b\n')
  first.commit()
  assert open(path).read() == 'a\nb\n'
  write_output(path, 'c\n')  # one after the other: the second replaces the first, as `>` does
  assert open(path).read() == 'c\n' and os.listdir(tmp_path) == ['out.txt']


class _FullDisk(io.RawIOBase):
  """A file whose every write meets a full disk."""

  def writable(self):
    return True

  def write(self, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fill_on_write(out: OutputFile) -> None:
  out._file.close()  # pylint: disable=protected-access
  out._file = io.BufferedWriter(_FullDisk())  # pylint: disable=protected-access


def test_a_full_disk_is_one_line_and_leaves_the_file_as_it_was(tmp_path):
  path = tmp_path / 'out.txt'
  path.write_text('before\n')
  out = OutputFile(str(path), what='--output_file')
  _fill_on_write(out)
  with pytest.raises(OutputError) as error:
    out.write('x' * 100_000)
  assert one_line(error) == (f'cannot write --output_file {path}: No space left on device '
                             f'(nothing written: {path} is as it was)')
  assert path.read_text() == 'before\n' and os.listdir(tmp_path) == ['out.txt']
  assert exit_code(error.value) == EXIT_FAILED  # a failure of the machine, as in train.py


def test_a_full_disk_ends_export_and_import_with_exit_1(workdirs, tmp_path, monkeypatch):
  """One exit status per kind of end, in every command (common.errors): a full disk is 1
  (train.py's), where export.py and import.py said 2, a refused input's."""
  from hf_export import ExportError, export_workdir, writer  # pylint: disable=import-outside-toplevel
  from hf_import import importer  # pylint: disable=import-outside-toplevel
  from hf_import.checkpoint_dir import ImportProblem  # pylint: disable=import-outside-toplevel

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(writer, '_write', full)
  with pytest.raises(ExportError, match='No space left on device') as error:
    export_workdir(workdirs['mt'], str(tmp_path / 'hf'))
  assert exit_code(error.value) == EXIT_FAILED and not (tmp_path / 'hf').exists()
  # The disk fills while the tokenizer is written, after config.json.
  imported = importer.Imported('MarianMTModel', {'max_len': 8}, {}, _NoSpaceTokenizer())
  with pytest.raises(ImportProblem, match='no space left on device') as error:
    importer.write_workdir(imported, str(tmp_path / 'new'))
  assert exit_code(error.value) == EXIT_FAILED and not (tmp_path / 'new').exists()
  with pytest.raises(ImportProblem) as error:
    importer.refuse_existing(str(tmp_path))
  assert exit_code(error.value) == EXIT_REFUSED


class _NoSpaceTokenizer:
  name, vocab_size = 'marian', 8

  def save(self, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_real_full_disk_too(tmp_path):
  with mounted('-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', str(tmp_path / 'small')) as small:
    path = os.path.join(small, 'out.txt')
    out = OutputFile(path, what='--output_file')
    with pytest.raises(OutputError, match='No space left on device'):
      for _ in range(100):
        out.write('y' * 4096)
    assert os.listdir(small) == []
    from hf_export import writer  # safetensors' own error on a full disk: one OSError
    with pytest.raises(OSError) as error:
      writer.save_safetensors({'w': __import__('numpy').zeros(100_000)},
                              os.path.join(small, 'model.safetensors'), {})
    assert error.value.errno == errno.ENOSPC


@pytest.mark.parametrize('check', [test_a_bind_mount_of_a_workdir_is_still_the_workdir,
                                   test_a_real_full_disk_too], ids=['bind_mount', 'full_disk'])
def test_the_mount_checks_need_no_root_in_a_user_namespace(check, tmp_path):
  """The two checks above, run by a process that may mount without being root: `unshare -Urm`
  gives any user a mount namespace of its own (where the kernel allows user namespaces), so
  the properties are checked where the suite runs unprivileged too."""
  if subprocess.run(['unshare', '-Urm', 'true'], capture_output=True, check=False).returncode:
    pytest.skip('this kernel refuses user namespaces (unshare -Urm)')
  code = (f'import sys, pathlib; sys.path.insert(0, {REPO!r})\n'
          f'from tests.common import test_output_files\n'
          f'test_output_files.{check.__name__}(pathlib.Path({str(tmp_path)!r}))\n'
          'print("checked")')
  proc = subprocess.run(['unshare', '-Urm', sys.executable, '-c', code], capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0 and proc.stdout.split() == ['checked'], proc.stderr[-2000:]


def test_an_output_left_unfinished_leaves_the_file_as_it_was(tmp_path):
  path = tmp_path / 'out.txt'
  path.write_text('before\n')
  with pytest.raises(KeyboardInterrupt), OutputFile(str(path)) as out:
    out.write('half\n')
    raise KeyboardInterrupt
  out = OutputFile(str(path))  # dropped without commit (an exception elsewhere)
  out.write('half\n')
  del out
  gc.collect()
  assert path.read_text() == 'before\n' and os.listdir(tmp_path) == ['out.txt']


# ----------------------------------------------------------------------------- decode.py's output

def test_a_streamed_output_file_appears_whole_at_the_end(tmp_path):
  path = tmp_path / 'out.txt'
  out = streaming.Output(str(path))
  out.write('line 1\n')
  hidden = [name for name in os.listdir(tmp_path) if name.startswith('.out.txt.tmp-')]
  assert not path.exists() and open(tmp_path / hidden[0]).read() == 'line 1\n'
  out.write('line 2\n')
  out.close()
  assert path.read_text() == 'line 1\nline 2\n' and os.listdir(tmp_path) == ['out.txt']
  workdir = make_workdir(tmp_path)
  with pytest.raises(streaming.InputError, match="config.json, a workdir's own file"):
    streaming.Output(str(workdir / 'config.json'))


def test_attention_plots_go_through_the_same_writer(tmp_path):
  from inference import plotting
  fig = plotting._figure(1, 1, 10)  # pylint: disable=protected-access
  fig.canvas.draw()
  (tmp_path / 'planted.png').symlink_to(tmp_path / 'elsewhere.png')
  with pytest.raises(streaming.InputError, match='is a symbolic link'):
    plotting._write_png(fig, str(tmp_path / 'planted.png'))  # pylint: disable=protected-access
  assert not (tmp_path / 'elsewhere.png').exists()
  workdir = make_workdir(tmp_path)
  with pytest.raises(streaming.InputError, match="checkpoints/, a workdir's own folder"):
    plotting._make_dir(str(workdir / 'checkpoints' / 'plots'))  # pylint: disable=protected-access


# ----------------------------------------------------------------------------- reading

def test_a_fifo_where_the_project_reads_a_file_is_refused_at_once(tmp_path):
  """`common.files.open_regular` opens without blocking and refuses a FIFO (or a directory, a
  device) before reading, where a planted FIFO hung a run forever; the project's readers go
  through it (best_metrics.json and the checksum files too)."""
  from common import files
  from input_pipeline import textfiles, tokenizers
  from input_pipeline.errors import DataFileError
  from workdir import config_io
  with pytest.raises(files.NotARegularFileError, match='is a directory'):
    files.read_regular(str(tmp_path))
  with pytest.raises(files.NotARegularFileError, match='is a device'):
    files.read_regular('/dev/null')
  (tmp_path / 'ok').write_bytes(b'{}')
  assert files.read_regular(str(tmp_path / 'ok')) == b'{}'
  os.mkfifo(tmp_path / 'best_metrics.json')
  with no_hang(), pytest.raises(files.NotARegularFileError) as error:
    files.read_regular(str(tmp_path / 'best_metrics.json'))
  assert one_line(error) == f'{tmp_path}/best_metrics.json is a FIFO, not a regular file'
  workdir = make_workdir(tmp_path)
  os.remove(workdir / 'config.json')
  os.mkfifo(workdir / 'config.json')
  with no_hang(), pytest.raises(ValueError, match='is a FIFO, not a regular file'):
    config_io.load_config(str(workdir))
  (workdir / 'tokenizer' / 'tokenizer.json').write_text(json.dumps(
      {'kind': 'sentencepiece', 'model_file': 'spm.model', 'checksums': 'checksums.json'}))
  os.remove(workdir / 'tokenizer' / 'spm.model')
  os.mkfifo(workdir / 'tokenizer' / 'spm.model')
  with no_hang(), pytest.raises(DataFileError, match='is a FIFO, not a regular file'):
    tokenizers.load_tokenizer(str(workdir))
  data_dir = tmp_path / 'data'
  data_dir.mkdir()
  os.mkfifo(data_dir / '.multi30k.lock')
  with no_hang(), pytest.raises(DataFileError, match='not a regular file'):
    with textfiles.file_lock(str(data_dir / '.multi30k.lock')):
      pass


def test_the_data_dir_lock_never_follows_a_symlink(tmp_path):
  from input_pipeline import textfiles
  from input_pipeline.errors import DataFileError
  (tmp_path / '.multi30k.lock').symlink_to(tmp_path / 'created_elsewhere')
  with pytest.raises(DataFileError, match='symbolic link'):
    with textfiles.file_lock(str(tmp_path / '.multi30k.lock')):
      pass
  assert not (tmp_path / 'created_elsewhere').exists()
  with textfiles.file_lock(str(tmp_path / 'sub' / '.other.lock')):  # the usual case
    assert (tmp_path / 'sub' / '.other.lock').is_file()


# ------------------------------------------------------------------------- decode.py, end to end

def _decode(workdir, *flags, stdout=subprocess.PIPE):
  from tests.training import test_train_synthetic as syn  # pylint: disable=import-outside-toplevel
  return subprocess.run([sys.executable, os.path.join(syn.REPO, 'decode.py'),
                         f'--workdir={workdir}', '--compilation_cache=', *flags],
                        env=syn.subprocess_env(1), cwd=syn.REPO, stdout=stdout,
                        stderr=subprocess.PIPE, text=True, check=False)


def test_decode_py_ends_a_full_stdout_in_one_line(workdirs, tmp_path):
  """Item 14: `> /dev/full` ended in a 19-line traceback; a process of its own, as the flush at
  its exit meets the full disk too (this is also streaming.Output's line for stdout, which an
  in-process test checked again). (Item 1, `--output_file=W/config.json` refused where it
  wrote a translation, exit 0: test_robustness's
  test_output_file_may_not_be_an_input_nor_a_workdirs_own_file, in one interpreter with the
  other decode.py refusals.)"""
  source = tmp_path / 'src.txt'
  source.write_text('A dog.\n')
  with open('/dev/full', 'w') as full:
    proc = _decode(workdirs['mt'], f'--input_file={source}', stdout=full)
  assert proc.returncode == 1, proc.stderr[-2000:]  # a full disk: exit 1, as in train.py
  assert proc.stderr.strip().splitlines()[-1] == (
      'decode.py: error: cannot write the output to stdout: No space left on device')
  assert 'Traceback' not in proc.stderr and 'Exception ignored' not in proc.stderr
