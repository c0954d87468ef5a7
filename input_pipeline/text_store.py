"""Your own text files as a dataset, prepared once into ragged UTF-8 arrays (`ragged`).

  'parallel_text'   translation: `config.data.train_files='SRC,TGT'` (and eval_files,
                    test_files); each side stripped, pairs with an empty side skipped
  'text_files'      a language model's text: `config.data.train_files='A[,B,...]'`; one
                    document or sentence a line, kept as written, blank lines skipped

Plain or `.gz` files. Each split is prepared on its own, streaming: the files are read one
line at a time and written in chunks of `CHUNK` lines, so preparing a 4.5M-pair corpus takes
the memory of a small one. A split's directory is named by a digest of its files' bytes
(`textfiles.files_fingerprint`: read whole only when a file's stat changed), so an edited file
is a new directory, prepared again, and never read stale. A file that changes while it is
being read fails the preparation, and nothing is kept.

    DATA_DIR/parallel_text/train-1f2e3d4c5b6a7988/source.{bin,idx} target.{bin,idx} meta.json
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from input_pipeline import ragged, textfiles
from input_pipeline.errors import DataError

log = logging.getLogger(__name__)

# dataset name -> its features (one ragged array each)
LOCAL_TEXT = {'parallel_text': ('source', 'target'), 'text_files': ('text',)}
# split -> the config.data field naming its files
SPLIT_FIELDS = {'train': 'train_files', 'validation': 'eval_files', 'test': 'test_files'}
CHUNK = 1 << 16  # lines written at a time: the preparation's memory bound
# Bytes the prepared copy takes per byte of text: the text itself plus an 8-byte offset per
# line of ~25 bytes (short sentences; longer lines take less).
_BYTES_PER_TEXT_BYTE = 1.35


def split_files(data_config) -> dict[str, list[str]]:
  """{split: [files]} named by `config.data.*_files`, absolute; train is required.
  parallel_text: exactly two files a split (source, target); text_files: one or more."""
  name = data_config.dataset
  per_split = len(LOCAL_TEXT[name]) if name == 'parallel_text' else None
  form = "'SOURCE_FILE,TARGET_FILE'" if per_split else "'FILE[,FILE...]'"
  files = {}
  for split, field in SPLIT_FIELDS.items():
    value = data_config.get(field)
    if not value:
      if split == 'train':
        raise DataError(f'config.data.train_files must be {form} for dataset {name!r}')
      continue
    parts = [p.strip() for p in str(value).split(',')]
    if not all(parts) or (per_split and len(parts) != per_split):
      raise DataError(f'config.data.{field} must be {form}, got {value!r}')
    files[split] = [os.path.abspath(os.path.expanduser(p)) for p in parts]
  return files


class LocalText:
  """The prepared splits of one `parallel_text` / `text_files` config.

  `source(split)` -> a random-access source of {feature: bytes} (as `sources.TextSource`);
  `num_examples(split)`; `fingerprint(split)` (the digest of its files' bytes) keys the token
  ids cached from it."""

  def __init__(self, data_config, data_dir: str):
    self.name = data_config.dataset
    self.keys = LOCAL_TEXT[self.name]
    self.files = split_files(data_config)
    self.root = os.path.join(data_dir, self.name)
    hashes = os.path.join(data_dir, '.file_hashes')
    self.split_keys = {split: textfiles.files_fingerprint(paths, hashes)
                       for split, paths in self.files.items()}
    self.data_dir = self.root
    self._sources: dict[str, TextStoreSource] = {}

  @property
  def splits(self) -> list[str]:
    return list(self.files)

  def fingerprint(self, split: str) -> str:
    return f'{self.name}/{split}-{self.split_keys[split]}'

  def directory(self, split: str) -> str:
    return os.path.join(self.root, f'{split}-{self.split_keys[split]}')

  def source(self, split: str) -> TextStoreSource:
    if split not in self._sources:
      directory = self.directory(split)
      if ragged.read_meta(directory) is None:
        with textfiles.file_lock(os.path.join(self.root, '.lock')):
          if ragged.read_meta(directory) is None:  # re-checked under the lock
            self._prepare(split, directory)
      self._sources[split] = TextStoreSource(directory, self.keys)
    return self._sources[split]

  def num_examples(self, split: str) -> int:
    return len(self.source(split))

  def _describe(self, split: str) -> str:
    return f"the {split} split of {self.name} ({', '.join(self.files[split])})"

  def _prepare(self, split: str, directory: str) -> None:
    paths = self.files[split]
    what = self._describe(split)
    stats = textfiles.stats_of(paths)
    text_bytes = sum(textfiles.uncompressed_size(p) for p in paths)
    ragged.check_room(self.root, int(text_bytes * _BYTES_PER_TEXT_BYTE), what)
    print(f'preparing {what} in {directory} ...', flush=True)
    start = time.time()
    if self.name == 'parallel_text':
      rows = textfiles.iter_parallel(*paths)
    else:
      rows = ((text,) for text in textfiles.iter_text(paths))
    meta = {'dataset': self.name, 'split': split, 'files': paths, 'features': list(self.keys)}
    with ragged.staged(directory, meta, what) as stage:
      writers = [ragged.RaggedWriter(stage, key, 'uint8') for key in self.keys]
      for chunk in ragged.chunks(rows, CHUNK):
        for j, writer in enumerate(writers):
          writer.extend([row[j].encode('utf-8') for row in chunk])
      meta['arrays'] = {key: w.close() for key, w in zip(self.keys, writers, strict=True)}
      meta['examples'] = writers[0].rows
      if textfiles.stats_of(paths) != stats:
        raise DataError(f'{what} changed while it was being prepared: nothing was kept; run '
                        'again once the files are written')
    print(f'prepared {what}: {meta["examples"]:,} examples in {time.time() - start:.1f}s',
          flush=True)


class TextStoreSource:
  """A prepared split: len, [i] and __getitems__ -> {feature: UTF-8 bytes}."""

  def __init__(self, directory: str, keys: Sequence[str]):
    self.directory = directory
    self.keys = tuple(keys)
    self.arrays = {key: ragged.Ragged(directory, key, 'uint8') for key in self.keys}

  def __len__(self) -> int:
    return len(self.arrays[self.keys[0]])

  def __getitem__(self, index: int) -> dict[str, bytes]:
    if not -len(self) <= index < len(self):
      raise IndexError(index)
    return {key: self.arrays[key][int(index)].tobytes() for key in self.keys}

  def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
    return [self[i] for i in indices]

  def read_range(self, first: int, last: int) -> list[dict[str, bytes]]:
    """Examples `first:last`, read from the files (`ragged.Ragged.read_rows`): what a
    sequential pass over the whole split uses, so that its memory stays one chunk's."""
    columns = {key: array.read_rows(first, last) for key, array in self.arrays.items()}
    return [dict(zip(self.keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]

  def __repr__(self) -> str:
    return f'TextStoreSource({self.directory!r})'
