"""Security: a workdir is data (no path escapes through tokenizer.json), written
files get the umask's mode, and temporary files are never predictable symlink targets."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from common.lock_file import UnsafeLockFileError
from input_pipeline import tokenizers
from tests.shared_dirs import tree_digest
from tests.training import test_train_synthetic as syn
from training import config_check
from workdir import checkpoint_files, config_io, train_lock


@pytest.mark.parametrize('model_file', ['../../secret', '/etc/hostname', '..', 'sub/spm.model',
                                        'link.model'])
def test_tokenizer_model_file_stays_in_its_directory(tmp_path, model_file):
  directory = tmp_path / 'tokenizer'
  directory.mkdir()
  (tmp_path / 'outside.model').write_bytes(b'x')
  (directory / 'link.model').symlink_to(tmp_path / 'outside.model')
  (directory / 'tokenizer.json').write_text(json.dumps(
      {'kind': 'sentencepiece', 'vocab_size': 8, 'model_file': model_file,
       'checksums': 'checksums.json'}))
  with pytest.raises(tokenizers.DataError, match='model_file='):
    tokenizers.load_tokenizer(str(tmp_path))


def test_written_files_get_the_umask_mode_and_no_predictable_temp_file(tmp_path):
  old = os.umask(0o022)
  try:
    workdir = str(tmp_path)
    # A symlink where the old code put its temporary file must not be followed.
    victim = tmp_path / 'victim'
    victim.write_text('untouched')
    (tmp_path / f'config.json.tmp.{os.getpid()}').symlink_to(victim)
    config_io.save_config(syn.tiny_config(), workdir)
    tokenizers.CharTokenizer(list('ab')).save(os.path.join(workdir, 'tokenizer'))
    for path in ('config.json', 'tokenizer/tokenizer.json'):
      assert os.stat(os.path.join(workdir, path)).st_mode & 0o777 == 0o644, path
    assert victim.read_text() == 'untouched'
    assert [n for n in os.listdir(workdir) if n.startswith('.')] == []
  finally:
    os.umask(old)


# -- issue 27: symlinks at lock files, refused runs, tokenizer checksums -------------------------

def _hashes(*paths):
  """sha256 of each path (None if absent), to show a victim file was not touched."""
  out = []
  for path in paths:
    try:
      with open(path, 'rb') as f:
        out.append(hashlib.sha256(f.read()).hexdigest())
    except FileNotFoundError:
      out.append(None)
  return out


@pytest.fixture
def victims(tmp_path):
  """A file outside the workdir that a planted symlink points to, and a path that must not
  come to exist."""
  victim = tmp_path / 'victim.txt'
  victim.write_text('precious\n')
  return str(victim), str(tmp_path / 'absent.txt')


@pytest.mark.parametrize('target', [0, 1])
def test_a_symlinked_train_lock_is_refused_and_not_followed(tmp_path, victims, target):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'train.lock').symlink_to(victims[target])
  before, tree = _hashes(*victims), tree_digest(workdir)
  with pytest.raises(UnsafeLockFileError,
                     match=r'train.lock is a symbolic link .*refusing to follow it'):
    train_lock.acquire(str(workdir))
  assert _hashes(*victims) == before and tree_digest(workdir) == tree


@pytest.mark.parametrize('target', [0, 1])
def test_a_symlinked_tokenizer_lock_is_refused_and_not_followed(tmp_path, victims, target):
  workdir = tmp_path / 'w'
  (workdir / 'tokenizer').mkdir(parents=True)
  (workdir / 'tokenizer' / '.lock').symlink_to(victims[target])
  before, tree = _hashes(*victims), tree_digest(workdir)
  with pytest.raises(UnsafeLockFileError, match=r'tokenizer/.lock is a symbolic'):
    with tokenizers.workdir_lock(str(workdir)):
      pass
  assert _hashes(*victims) == before and tree_digest(workdir) == tree


def test_a_planted_fifo_lock_is_refused(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  os.mkfifo(workdir / 'train.lock')
  with pytest.raises(UnsafeLockFileError, match='not a regular file'):
    train_lock.acquire(str(workdir))


def test_a_symlinked_lock_through_train_py_is_one_line(tmp_path, victims):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'train.lock').symlink_to(victims[0])
  before = _hashes(*victims)
  proc = subprocess.run(
      [sys.executable, 'train.py', '--config=configs/default.py:tiny', f'--workdir={workdir}'],
      cwd=syn.REPO, env=syn.subprocess_env(1), capture_output=True, text=True,
      check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines() == [
      f'train.py: error: {workdir}/train.lock is a symbolic link (to {victims[0]}): refusing to '
      'follow it for a lock file; remove it (nothing was written)']
  assert _hashes(*victims) == before and os.listdir(workdir) == ['train.lock']


def test_a_checksum_file_is_never_written_through_a_symlink(tmp_path, victims):
  step = tmp_path / 'step'
  (step / 'state').mkdir(parents=True)
  (step / 'state' / 'x').write_bytes(b'x')
  (step / 'checksums.json').symlink_to(victims[0])
  before = _hashes(*victims)
  checkpoint_files.write_checksums(str(step))
  assert _hashes(*victims) == before and not os.path.islink(step / 'checksums.json')
  assert checkpoint_files.verify_checksums(str(step)) is None


class _WrongVocab(syn.SyntheticDatasets):
  """Refused after the lock is taken: the tokenizer does not fit config.model.vocab_size."""

  def __init__(self, config):
    super().__init__(config)
    self.tokenizer = type('T', (syn.Tokenizer,), {'vocab_size': 10 * syn.VOCAB})()


@pytest.mark.parametrize('existing', [False, True])
def test_a_refused_run_leaves_the_workdir_as_it_found_it(tmp_path, monkeypatch, existing):
  from training import trainer  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / 'w'
  if existing:  # a user's folder with a file of theirs and an empty tokenizer/ folder
    (workdir / 'tokenizer').mkdir(parents=True)
    (workdir / 'notes.txt').write_text('mine\n')
  tree = tree_digest(tmp_path)
  config = syn.tiny_config()

  def refuse_after_saving_a_tokenizer(*_):  # as a refused split check would, after training it
    with tokenizers.workdir_lock(str(workdir)):
      tokenizers.CharTokenizer(list('ab')).save(str(workdir / 'tokenizer'))
    raise config_io.ConfigError('refused')

  with pytest.raises(config_io.ConfigError, match='the tokenizer has 320 ids'):
    trainer.train_and_evaluate(config, str(workdir), datasets=_WrongVocab(config))
  assert tree_digest(tmp_path) == tree
  monkeypatch.setattr(config_check, 'check_compatible', refuse_after_saving_a_tokenizer)
  with pytest.raises(config_io.ConfigError, match='refused'):
    trainer.train_and_evaluate(config, str(workdir), datasets=_WrongVocab(config))
  assert tree_digest(tmp_path) == tree


def _flip(path, at=None):
  data = bytearray(path.read_bytes())
  data[len(data) // 2 if at is None else at] ^= 1
  path.write_bytes(bytes(data))


@pytest.fixture
def spm_workdir(tmp_path):
  """A workdir holding a small sentencepiece tokenizer, saved as train.py saves it."""
  texts = ['A man is riding a bike.', 'Two dogs play in the snow.', 'A woman reads.'] * 20
  tokenizer = tokenizers.train_sentencepiece(texts, 300)
  tokenizer.save(str(tmp_path / 'tokenizer'))
  return tmp_path, tokenizer


def test_tokenizer_files_are_checksummed_and_verified(spm_workdir):
  workdir, tokenizer = spm_workdir
  directory = workdir / 'tokenizer'
  assert sorted(os.listdir(directory)) == ['checksums.json', 'spm.model', 'tokenizer.json']
  text = 'A man is riding a bike.'
  assert tokenizers.load_tokenizer(str(workdir)).encode(text) == tokenizer.encode(text)
  _flip(directory / 'spm.model')
  with pytest.raises(tokenizers.TokenizerChecksumError,
                     match=rf'^tokenizer file {directory}/spm.model does not match its checksum'):
    tokenizers.load_tokenizer(str(workdir))


def test_a_changed_character_vocabulary_is_caught(tmp_path):
  tokenizers.CharTokenizer(list('abc')).save(str(tmp_path / 'tokenizer'))
  meta = tmp_path / 'tokenizer' / 'tokenizer.json'
  meta.write_text(meta.read_text().replace('"b"', '"x"'))  # still valid JSON, another vocabulary
  with pytest.raises(tokenizers.TokenizerChecksumError, match='tokenizer.json does not match'):
    tokenizers.load_tokenizer(str(tmp_path))


def test_deleted_tokenizer_checksums_are_damage(spm_workdir):
  workdir, _ = spm_workdir
  os.remove(workdir / 'tokenizer' / 'checksums.json')
  with pytest.raises(tokenizers.TokenizerChecksumError, match='checksums.json is missing'):
    tokenizers.load_tokenizer(str(workdir))


def test_a_tokenizer_without_checksums_is_refused(spm_workdir):
  """Issue 45 item 6: 0.2.0 has no compatibility layer; a tokenizer saved before checksums
  (no checksums.json, no key naming it) is refused in one line saying what to do (exit 1)."""
  workdir, _ = spm_workdir
  directory = workdir / 'tokenizer'
  os.remove(directory / 'checksums.json')  # as the previous version saved it
  meta = json.loads((directory / 'tokenizer.json').read_text())
  del meta['checksums']
  (directory / 'tokenizer.json').write_text(json.dumps(meta))
  with pytest.raises(tokenizers.TokenizerChecksumError) as error:
    tokenizers.load_tokenizer(str(workdir))
  assert str(error.value) == (
      f'tokenizer file {directory}/tokenizer.json has no checksums (saved by a version before '
      "0.2.0, which cannot be verified): re-create the workdir with this version's train.py (a "
      'new --workdir)')
  assert error.value.exit_code == 1


def test_a_flipped_bit_in_the_checksums_key_is_damage(spm_workdir):
  """Issue 45 item 6: one bit of the key's name ('checksums' -> 'checksuls') must not turn
  verification off; here spm.model is damaged too, which would then decode other pieces."""
  workdir, _ = spm_workdir
  directory = workdir / 'tokenizer'
  meta = directory / 'tokenizer.json'
  meta.write_bytes(meta.read_bytes().replace(b'"checksums"', b'"checksuls"'))
  _flip(directory / 'spm.model')
  with pytest.raises(tokenizers.TokenizerChecksumError) as error:
    tokenizers.load_tokenizer(str(workdir))
  assert str(error.value) == (
      f'tokenizer file {meta} names no checksum file although checksums.json is beside it: it '
      'was changed or damaged (restore it from a backup, or use a new workdir)')


def test_a_tokenizer_of_another_config_is_refused_on_resume(tmp_path, spm_workdir):
  """Issue 45 item 7 (the trainer's side): a workdir's tokenizer that is not what config.data
  names, or has more ids than the model, is one line naming the file and both sizes."""
  from ml_collections import ConfigDict  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / 'char'  # (tmp_path/tokenizer is spm_workdir's)
  tokenizers.CharTokenizer(list('abc')).save(str(workdir / 'tokenizer'))
  meta = workdir / 'tokenizer' / 'tokenizer.json'
  cases = [({'tokenizer': 'sentencepiece', 'vocab_size': 512}, None,
            "is a char tokenizer of 4 ids but config.data.tokenizer='sentencepiece' "
            '(config.data.vocab_size=512)'),
           ({'tokenizer': 'char', 'vocab_size': 4}, 3,
            'has 4 ids but config.model.vocab_size=3 (ids past 2 have no embedding)')]
  for data, model_vocab, problem in cases:
    with pytest.raises(tokenizers.DataError) as error:
      tokenizers.get_tokenizer(ConfigDict(data), str(workdir), model_vocab)
    assert str(error.value) == (f'the tokenizer {meta} {problem}: the workdir was trained with '
                                'another config; use a new workdir')
  assert tokenizers.get_tokenizer(ConfigDict(cases[1][0]), str(workdir), 4).chars == list('abc')
  _, tokenizer = spm_workdir  # 300 pieces
  assert tokenizers.vocabulary_mismatch(tokenizer, ConfigDict(
      {'tokenizer': 'sentencepiece', 'vocab_size': 512})) == (
      'has 300 pieces but config.data.vocab_size=512')
