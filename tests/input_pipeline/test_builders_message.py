"""Bundled corpora say what they prepare: no tfds "Downloading ... Unknown size" message,
since nothing is downloaded."""

import pytest

from configs import default, shakespeare_char
from input_pipeline import sources


@pytest.mark.parametrize('get_config, what', [
    (default.get_config, 'preparing the bundled Multi30k (29,000 pairs) in '),
    (shakespeare_char.get_config,
     'preparing the bundled Tiny Shakespeare (1,115,394 characters) in '),
])
def test_bundled_corpus_prepares_without_download_message(tmp_path, capfd, get_config, what):
  config = get_config()
  config.data.data_dir = str(tmp_path)
  builder = sources.get_builder(config.data)
  assert builder.info.splits['train'].num_examples > 0
  out = capfd.readouterr().out
  assert 'Downloading' not in out and 'Unknown size' not in out, out
  assert what in out and 'prepared the bundled' in out, out
  sources.get_builder(config.data)  # prepared once: nothing printed the second time
  assert 'prepar' not in capfd.readouterr().out
