"""Token ids computed once per (split, tokenizer), then read by index from memory maps.

The tokenizer runs here, at preparation, never per epoch and never at a resume: training,
evaluation and every later start read the ids (`TokenIds`). One ragged array per feature
(`ragged`: uint16 ids for a vocabulary of up to 65,536, else uint32), untruncated, so one
cache serves every `max_length`. A language model's split is its feature's flat array: the
token stream, memory-mapped as nanoGPT's `.bin` files.

    DATA_DIR/token_ids/<dataset>/<split>-<digest>/{en,de}.{bin,idx} meta.json

`digest` is a hash of the split's fingerprint (`sources.split_fingerprint`: your own files'
bytes, or a tfds dataset's name, version and size) and the tokenizer's (`tokenizers.fingerprint`:
its model's bytes). Another tokenizer, or changed data, is another directory. Processes
starting together prepare once (a file lock); a preparation killed half-way leaves nothing that
a later run would read (`ragged.staged`).

The one path that still reads text at every epoch: sampled segmentations
(`config.data.subword_sampling_alpha`), which must differ each time an example is seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any

import numpy as np

from input_pipeline import ragged, sources, textfiles, tokenizers

CHUNK = 8192  # examples encoded and written at a time: the preparation's memory bound
# Bytes of ids and offsets per byte of text, at most: one id (<= 4 bytes) per 2 bytes of text
# (sentencepiece averages 3-5 characters a piece), plus each example's 8-byte offset.
_ID_BYTES_PER_TEXT_BYTE = 2.0


class TokenIds:
  """The ids of one split: `len`, `arrays[feature]` (a `ragged.Ragged`), `stream(feature)`.
  Pickles as its paths (a Grain worker maps the files itself)."""

  def __init__(self, directory: str, keys: tuple[str, ...], dtype):
    self.directory, self.keys = directory, tuple(keys)
    self.arrays = {key: ragged.Ragged(directory, key, dtype) for key in self.keys}

  def __len__(self) -> int:
    return len(self.arrays[self.keys[0]])

  def stream(self, key: str) -> np.ndarray:
    """Every example's ids back to back `[num_tokens]` (a memory map; a language model's
    token stream)."""
    return self.arrays[key].flat

  def __repr__(self) -> str:
    return f'TokenIds({self.directory!r})'


def _slug(name: str) -> str:
  return re.sub(r'[^A-Za-z0-9._-]+', '_', name)


def directory(data_config, split: str, tokenizer) -> str:
  """Where the ids of `split` by `tokenizer` are kept (see the module docstring)."""
  key = json.dumps([ragged.FORMAT, sources.split_fingerprint(data_config, split),
                    tokenizers.fingerprint(tokenizer), sources.text_keys(data_config)])
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  return os.path.join(sources.resolve_data_dir(data_config.get('data_dir')), 'token_ids',
                      _slug(data_config.dataset), f'{split}-{digest}')


def token_ids(data_config, split: str, tokenizer) -> TokenIds:
  """The ids of every example of `split` (tokenizing it first if no run has yet)."""
  where = directory(data_config, split, tokenizer)
  keys = sources.text_keys(data_config)
  dtype = ragged.ids_dtype(tokenizer.vocab_size)
  if ragged.read_meta(where) is None:
    with textfiles.file_lock(os.path.join(os.path.dirname(where), '.lock')):
      if ragged.read_meta(where) is None:  # re-checked under the lock
        _prepare(data_config, split, tokenizer, where, keys, dtype)
  return TokenIds(where, keys, dtype)


def line_end(data_config, tokenizer) -> str:
  """What ends each line of a `text_files` corpus in its token stream: the tokenizer's EOS
  (which `encode` appends), or for a character vocabulary, which has none, the newline itself
  (so that a character model reads the lines as the file has them, not glued together)."""
  return '\n' if data_config.dataset == 'text_files' and tokenizer.eos_id is None else ''


def _text_bytes(source, data_config, split: str) -> int:
  """About how many bytes of text `split` has (for the disk check)."""
  arrays = getattr(source, 'arrays', None)
  if arrays:
    return sum(len(a.flat) for a in arrays.values())
  builder = sources.get_builder(data_config)
  return int(builder.info.splits[split].num_bytes)


def _prepare(data_config, split: str, tokenizer, where: str, keys, dtype) -> None:
  source = sources.get_source(data_config, split)
  what = f'the token ids of the {split} split of {data_config.dataset!r}'
  ragged.check_room(where, int(_text_bytes(source, data_config, split) * _ID_BYTES_PER_TEXT_BYTE),
                    what)
  print(f'tokenizing the {split} split of {data_config.dataset!r} ({len(source):,} examples) '
        f'into {where} ...', flush=True)
  start = time.time()
  meta: dict[str, Any] = {'dataset': data_config.dataset, 'split': split,
                          'data': sources.split_fingerprint(data_config, split),
                          'tokenizer': tokenizers.fingerprint(tokenizer),
                          'vocab_size': tokenizer.vocab_size, 'features': list(keys)}
  with ragged.staged(where, meta, what) as stage:
    writers = [ragged.RaggedWriter(stage, key, dtype) for key in keys]
    end = line_end(data_config, tokenizer)
    for first in range(0, len(source), CHUNK):
      last = min(first + CHUNK, len(source))
      examples = (source.read_range(first, last) if hasattr(source, 'read_range')
                  else sources.read_examples(source, range(first, last)))
      for j, (key, writer) in enumerate(zip(keys, writers, strict=True)):
        texts = [sources.as_str(example[key]) + end for example in examples]
        writer.extend(tokenizers.encode_all(tokenizer, texts, target=j == 1))
    meta['arrays'] = {key: writer.close() for key, writer in zip(keys, writers, strict=True)}
  tokens = sum(a['values'] for a in meta['arrays'].values())
  print(f'tokenized the {split} split: {tokens:,} tokens in {time.time() - start:.1f}s',
        flush=True)
