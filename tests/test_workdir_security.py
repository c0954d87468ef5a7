"""Issue 17, security: a workdir is data (no path escapes through tokenizer.json), written
files get the umask's mode, and temporary files are never predictable symlink targets."""

import json
import os

import pytest
import test_train_synthetic as syn

from input_pipeline import tokenizers
from training import config_io


@pytest.mark.parametrize('model_file', ['../../secret', '/etc/hostname', '..', 'sub/spm.model',
                                        'link.model'])
def test_tokenizer_model_file_stays_in_its_directory(tmp_path, model_file):
  directory = tmp_path / 'tokenizer'
  directory.mkdir()
  (tmp_path / 'outside.model').write_bytes(b'x')
  (directory / 'link.model').symlink_to(tmp_path / 'outside.model')
  (directory / 'tokenizer.json').write_text(json.dumps(
      {'kind': 'sentencepiece', 'vocab_size': 8, 'model_file': model_file}))
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
