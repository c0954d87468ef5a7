"""tfds builders for the bundled corpora.

All builders are `GeneratorBasedBuilder`s that prepare ArrayRecord files
(`file_format='array_record'`) from local files, with no network and no
TensorFlow. They are not registered in the tfds catalog (the catalog already
has a `tiny_shakespeare`); `sources.py` maps `config.data.dataset` names to
them.

Features (all `tfds.features.Text`, read back as UTF-8 bytes):
  Multi30k:        {'en', 'de'}; splits train / validation / test
                   (29,000 / 1,014 / 1,000; test = test_2016_flickr).
  ShakespeareChar: {'text'}; one example per split: train = first 90% of the
                   characters of input.txt, validation = last 10% (nanoGPT).
Your own text files are not tfds datasets: `text_store` prepares them, streaming.
"""

from __future__ import annotations

import time

import tensorflow_datasets as tfds

from input_pipeline import textfiles

_MULTI30K_CITATION = """@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016}, doi = {10.18653/v1/W16-3210}}"""

MULTI30K_FILES = {  # split -> file prefix in data/multi30k/
    'train': 'train',
    'validation': 'val',
    'test': 'test_2016_flickr',
}


def _text_features(*names: str) -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({n: tfds.features.Text() for n in names})


class _LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Says what it prepares instead of tfds's "Downloading and preparing dataset Unknown size"
  (nothing is downloaded: the files are local)."""

  def describe(self) -> str:
    """What is prepared, for the console: 'the bundled Multi30k (29,000 pairs)'."""
    return f'the dataset {self.name}'

  def _log_download_bytes(self) -> None:  # tfds's hook, called once before preparing
    self._prepare_started = time.time()
    print(f'preparing {self.describe()} in {self.data_dir} ...', flush=True)

  def _log_download_done(self) -> None:  # tfds's hook, called once prepared
    seconds = time.time() - getattr(self, '_prepare_started', time.time())
    print(f'prepared {self.describe()} in {seconds:.1f}s', flush=True)


class Multi30k(_LocalBuilder, skip_registration=True):
  """Multi30k task 1 En-De (raw, cased) from the bundled `data/multi30k/`."""

  def describe(self) -> str:
    return 'the bundled Multi30k (29,000 pairs)'

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {  # noqa: RUF012 (tfds convention)
      '1.0.0': 'Bundled raw task-1 files, lines stripped.',
  }

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        disable_shuffling=True,  # keep file order (outputs line up with references)
        features=_text_features('en', 'de'),
        supervised_keys=('en', 'de'),
        homepage='https://github.com/multi30k/dataset',
        citation=_MULTI30K_CITATION,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # bundled files; nothing to download
    return {split: self._generate_examples(prefix) for split, prefix in MULTI30K_FILES.items()}

  def _generate_examples(self, prefix: str):
    pairs = textfiles.read_parallel(
        textfiles.bundled_path('multi30k', f'{prefix}.en.gz'),
        textfiles.bundled_path('multi30k', f'{prefix}.de.gz'))
    for i, (en, de) in enumerate(pairs):
      yield i, {'en': en, 'de': de}


class ShakespeareChar(_LocalBuilder, skip_registration=True):
  """Tiny Shakespeare from the bundled `data/tinyshakespeare/input.txt`."""

  def describe(self) -> str:
    return 'the bundled Tiny Shakespeare (1,115,394 characters)'

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {  # noqa: RUF012 (tfds convention)
      '1.0.0': 'nanoGPT split: first 90% train, last 10% validation.',
  }

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        disable_shuffling=True,  # keep file order (outputs line up with references)
        features=_text_features('text'),
        homepage='https://github.com/karpathy/char-rnn',
        citation='Andrej Karpathy, char-rnn, https://github.com/karpathy/char-rnn (2015).',
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    text = textfiles.read_text(textfiles.bundled_path('tinyshakespeare', 'input.txt'))
    n = int(len(text) * 0.9)  # as nanoGPT's data/shakespeare_char/prepare.py
    return {
        'train': self._generate_examples(text[:n]),
        'validation': self._generate_examples(text[n:]),
    }

  def _generate_examples(self, text: str):
    yield 0, {'text': text}
