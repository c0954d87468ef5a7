"""Grain pipelines: training iterators and evaluation batches, in one of two `LAYOUTS`.

The pipeline knows layouts, not model kinds: each kind's adapter (`model.kinds`) names the
layout it trains on, and the trainer passes it to `get_datasets`.

'sentence_pairs' (translation), batches of `[batch, max_length]` int32 arrays, token id 0 = pad:
  inputs, targets                 token ids, EOS (1) last; longer examples are
                                  truncated to max_length keeping EOS last
  *_segmentation, *_position      (packed training batches only) segment ids
                                  1, 2, ... (0 = pad); positions restart at 0
'text_blocks' (language model), `[batch, max_length + 1]`:
  targets                         contiguous blocks of the token stream
  targets_weights  float32        0.0 at position 0 (nothing predicts it) and
                                  on padding, 1.0 elsewhere

Training: the split is sharded per process (`[process_index::process_count]`),
shuffled with `config.train.seed` (a new order each epoch) and repeated;
fixed windows of the example stream are read from the token cache (`token_cache`; or encoded
with sampled segmentations), truncated and packed (`packing.pack_ragged`), then rebatched to
`batch_size // process_count` rows. A language model draws random blocks of its split's token
stream, memory-mapped.
Every stage is a Grain dataset, so the iterator state is a small JSON dict
and a restored iterator continues with exactly the same batches.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import grain
import numpy as np
from absl import flags

from input_pipeline import packing, sources
from input_pipeline.errors import DataError

SENTENCE_PAIRS, TEXT_BLOCKS = 'sentence_pairs', 'text_blocks'
LAYOUTS = (SENTENCE_PAIRS, TEXT_BLOCKS)  # see the module docstring

log = logging.getLogger(__name__)

_LM_STEPS = 2 ** 62  # "infinite" number of LM training batches


def _np_to_py(x):
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.floating):
    return float(x)
  raise TypeError(f'iterator state holds a non-JSON value of type {type(x).__name__}')


class TrainIterator:
  """Infinite iterator of training batches with a JSON-serializable state.

  `get_state()` -> dict (json.dumps-able, e.g. for orbax `ocp.args.JsonSave`);
  `set_state(state)` restores the position: the next batch is then the one
  an uninterrupted run would have produced.
  """

  def __init__(self, dataset: grain.IterDataset, info: dict[str, Any]):
    self._dataset = dataset
    self._iter = iter(dataset)
    self._info = info  # what the state is only valid for

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iter)

  def get_state(self) -> dict[str, Any]:
    state = {'grain': self._iter.get_state(), **self._info}
    return json.loads(json.dumps(state, default=_np_to_py))

  def set_state(self, state: dict[str, Any]) -> None:
    if not isinstance(state, dict) or 'grain' not in state:
      raise DataError('data iterator state in the checkpoint is not one saved by '
                      'TrainIterator.get_state()')
    # A key the state lacks was saved by an earlier version, which did not record it.
    changed = {k: (state[k], v) for k, v in self._info.items() if k in state and state[k] != v}
    if changed:
      log.warning('Restoring a data iterator saved with different settings %s (saved, now): '
                  'the batch sequence will not continue exactly', changed)
    self._iter.set_state(state['grain'])

  def close(self) -> None:
    close = getattr(self._iter, 'close', None)
    if close is not None:
      close()


# ----------------------------------------------------------------------------
# Translation

FEATURES = ('inputs', 'targets')  # a pair's source and target, in the batch


class CachedIds:
  """(index, example indices) -> {'inputs', 'targets'}: (flat ids, lengths), each example cut
  to max_length (EOS kept last), read from the token cache: no tokenizer runs."""

  def __init__(self, ids, max_length: int, eos_id: int | None):
    self.ids = ids  # token_cache.TokenIds
    self.max_length = max_length
    self.eos_id = eos_id

  def __call__(self, index: int, indices: np.ndarray) -> dict[str, packing.Ragged]:
    del index  # the same ids whenever the example is seen
    out = {}
    for feature, key in zip(FEATURES, self.ids.keys, strict=True):
      array = self.ids.arrays[key]
      full = array.offsets[indices + 1] - array.offsets[indices]
      out[feature] = packing.truncate(array.gather(indices, self.max_length), full,
                                      self.max_length, self.eos_id)
    return out


class SampledIds:
  """(index, example indices) -> {'inputs', 'targets'} as `CachedIds`, but each side encoded
  from its text with a sampled segmentation (subword regularisation, Kudo 2018; BPE-dropout,
  Provilkov et al. 2020, for a BPE model), seeded by (seed, index): a resumed run samples
  exactly what an uninterrupted one would."""

  def __init__(self, source, keys: tuple[str, str], tokenizer, max_length: int, seed: int,
               alpha: float, nbest_size: int):
    self.source, self.keys, self.tokenizer = source, keys, tokenizer
    self.max_length, self.seed = max_length, seed
    self.alpha, self.nbest_size = alpha, nbest_size

  def __call__(self, index: int, indices: np.ndarray) -> dict[str, packing.Ragged]:
    examples = sources.read_examples(self.source, indices)
    out = {}
    for side, (feature, key) in enumerate(zip(FEATURES, self.keys, strict=True)):
      seed = np.random.SeedSequence([self.seed, index, side]).generate_state(1)[0]
      ids = self.tokenizer.sample_batch([sources.as_str(e[key]) for e in examples],
                                        alpha=self.alpha, nbest_size=self.nbest_size,
                                        seed=int(seed))
      out[feature] = packing.ragged_from_lists(ids, self.max_length, self.tokenizer.eos_id)
    return out


class PackWindow:
  """(index, window of example indices) -> packed rows {F, F_segmentation, F_position}
  `[rows, L]` for F in FEATURES."""

  def __init__(self, read, max_length: int, seed: int):
    self.read = read  # CachedIds or SampledIds
    self.max_length = max_length
    self.seed = seed

  def __call__(self, index: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, index])  # row order within the window
    return packing.pack_ragged(self.read(index, indices), self.max_length, rng)


class PadBatch:
  """(index, example indices) -> padded batch {'inputs', 'targets'} `[batch_size, L]`."""

  def __init__(self, read, batch_size: int, max_length: int):
    self.read = read  # CachedIds or SampledIds
    self.batch_size = batch_size
    self.max_length = max_length

  def __call__(self, index: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    return packing.pad_ragged(self.read(index, indices), self.batch_size, self.max_length)


# Each element is a whole batch or window: prefetch a few, in one background thread.
_READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)


def _to_iter(ds: grain.MapDataset, num_workers: int) -> grain.IterDataset:
  if num_workers:
    if not flags.FLAGS.is_parsed():  # Grain's worker processes read absl flags
      flags.FLAGS.mark_as_parsed()
    return ds.to_iter_dataset(_READ_OPTIONS).mp_prefetch(
        grain.MultiprocessingOptions(num_workers=num_workers))
  return ds.to_iter_dataset(_READ_OPTIONS)


def translation_train(read, num_examples: int, *, max_length: int, batch_size: int, seed: int,
                      packing_enabled: bool, packing_window: int, process_index: int,
                      process_count: int, num_workers: int = 0) -> grain.IterDataset:
  """Infinite IterDataset of per-process training batches (see module doc); `read` gives the
  ids of example indices (`CachedIds`, or `SampledIds` for sampled segmentations)."""
  ds = grain.MapDataset.range(num_examples)[process_index::process_count]
  if len(ds) == 0:
    raise DataError(f'the training split has {num_examples} examples: too few for '
                    f'{process_count} processes')
  ds = ds.shuffle(seed=seed).repeat()
  if packing_enabled:
    windows = ds.batch(packing_window, batch_fn=np.asarray)
    windows = windows.map_with_index(PackWindow(read, max_length, seed))
    return grain.experimental.RebatchIterDataset(
        _to_iter(windows, num_workers), batch_size=batch_size, drop_remainder=True)
  batches = ds.batch(batch_size, drop_remainder=True, batch_fn=np.asarray)
  batches = batches.map_with_index(PadBatch(read, batch_size, max_length))
  return _to_iter(batches, num_workers)


def num_eval_batches(num_examples: int, batch_size: int, process_count: int) -> int:
  """Batches per process: the same on every process (collectives stay in step)."""
  return max(1, math.ceil(math.ceil(num_examples / process_count) / batch_size))


def translation_eval(ids, *, eos_id: int | None, max_length: int, batch_size: int,
                     process_index: int, process_count: int) -> Iterator[dict[str, np.ndarray]]:
  """Padded batches of this process's shard of `ids` (`token_cache.TokenIds`); every example
  exactly once.

  The last batch is filled with all-zero rows, and a process whose shard is
  shorter gets all-zero batches so that every process yields the same count.
  """
  ds = grain.MapDataset.range(len(ids))[process_index::process_count]
  batches = ds.batch(batch_size, drop_remainder=False, batch_fn=np.asarray)
  batches = batches.map_with_index(PadBatch(CachedIds(ids, max_length, eos_id), batch_size,
                                            max_length))
  count = 0
  for batch in batches.to_iter_dataset(_READ_OPTIONS):
    count += 1
    yield batch
  for _ in range(num_eval_batches(len(ids), batch_size, process_count) - count):
    yield packing.pad_batch([], batch_size, max_length, keys=FEATURES)


# ----------------------------------------------------------------------------
# Language model


class LMTrainBatch:
  """Step -> `batch_size` random blocks of `block_length` tokens of the stream (a memory map
  of the cached ids: only the blocks drawn are read).

  Offsets come from a generator seeded with (seed, process_index, step), so
  any step's batch is recomputed exactly from its index.
  """

  def __init__(self, stream: np.ndarray, block_length: int, batch_size: int, seed: int,
               process_index: int):
    self.stream = stream
    self._tokens = np.asarray(stream)  # indexing an ndarray view, not the np.memmap subclass
    self.block_length = block_length
    self.batch_size = batch_size
    self.seed = seed
    self.process_index = process_index
    self.weights = np.ones((batch_size, block_length), np.float32)
    self.weights[:, 0] = 0.0

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self.process_index, step])
    starts = rng.integers(0, len(self.stream) - self.block_length + 1, size=self.batch_size)
    idx = starts[:, None] + np.arange(self.block_length)[None, :]
    return {'targets': self._tokens[idx].astype(np.int32),
            'targets_weights': self.weights.copy()}


def lm_train(stream: np.ndarray, *, max_length: int, batch_size: int, seed: int,
             process_index: int) -> grain.IterDataset:
  block = max_length + 1
  if len(stream) < block:
    raise DataError(f'the training stream has {len(stream)} tokens, fewer than '
                    f'config.data.max_length + 1 = {block}')
  steps = grain.MapDataset.range(_LM_STEPS)
  return steps.map(LMTrainBatch(stream, block, batch_size, seed, process_index)).to_iter_dataset(
      _READ_OPTIONS)


def lm_eval_blocks(stream: np.ndarray, max_length: int) -> dict[str, np.ndarray]:
  """Blocks of `max_length + 1` tokens at stride `max_length` covering the stream.

  Consecutive blocks share one token, so every token but the first is
  predicted exactly once (weight 1.0); the last block is zero-padded with
  weight 0.0.

  Returns:
    {'targets': int32 [num_blocks, max_length + 1],
     'targets_weights': float32 [num_blocks, max_length + 1]}
  """
  block = max_length + 1
  n = max(1, math.ceil((len(stream) - 1) / max_length))
  targets = np.zeros((n, block), np.int32)
  weights = np.zeros((n, block), np.float32)
  for b in range(n):
    chunk = stream[b * max_length: b * max_length + block]
    targets[b, : len(chunk)] = chunk
    weights[b, 1: len(chunk)] = 1.0
  return {'targets': targets, 'targets_weights': weights}


def lm_eval(stream: np.ndarray, *, max_length: int, batch_size: int, process_index: int,
            process_count: int) -> Iterator[dict[str, np.ndarray]]:
  """Padded batches of this process's share of the eval blocks (see lm_eval_blocks)."""
  blocks = lm_eval_blocks(stream, max_length)
  rows = {k: v[process_index::process_count] for k, v in blocks.items()}
  total = num_eval_batches(len(blocks['targets']), batch_size, process_count)
  for b in range(total):
    batch = {k: np.zeros((batch_size, max_length + 1), v.dtype) for k, v in rows.items()}
    for k, v in rows.items():
      part = v[b * batch_size: (b + 1) * batch_size]
      batch[k][: len(part)] = part
    yield batch
