"""Lists of sentences in batches: `search_in_batches` (a strategy over a list of sources, what
every `Session` decodes with), their padded length (a few shapes, so a few programs), and
running them on a few worker threads, results in order (on a CPU a batch's program is a chain
of small ops that mostly keep one core busy, so two batches at once use two cores;
test2016, batch 64, 2 cores: 1.5x the sentences per second at beam 4, 1.4x greedy).

Sources are token ids (EOS-terminated, as the tokenizer gives them); a source longer than the
model's positions is cut by `common.tokens.truncate`, the training pipeline's rule. Batches
hold sentences of similar length, padded to a multiple of `LENGTH_MULTIPLE` tokens and to a
fixed number of rows (a whole file: the batch size; a stream: the next power of two), so a
whole test set, or a stream of any rhythm, compiles only a few shapes. A sentence's random
draws depend on its index (`line_ids`), so it gets the same samples whatever batch, bucket or
stream rhythm it comes in.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import jax
import numpy as np

from common.tokens import EOS_ID, truncate

# Batches are padded to a multiple of this many positions: a whole test set compiles a few
# shapes.
LENGTH_MULTIPLE = 16


def padded_length(rows: Iterable[Sequence[int]], limit: int) -> int:
  """The padded length of a batch of `rows`: the longest, rounded up to LENGTH_MULTIPLE, at
  most `limit` (the model's positions)."""
  return min(limit, -(-max(1, *map(len, rows)) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)


def default_workers() -> int:
  """Batches decoded at once by default: 2 on a CPU with 2 cores or more (XLA's own threads
  split only the larger ops), else 1 (an accelerator runs one program at a time anyway)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return 2 if jax.default_backend() == 'cpu' and (cores or 1) >= 2 else 1


def in_order(fn: Callable, batches: Iterable, workers: int, ready: set,
             shape: Callable[[object], Hashable] = lambda batch: batch[1].shape) -> Iterator:
  """`fn(batch)` for each of `batches`, yielded in order; with `workers` > 1 that many run at
  once. The first batch of a shape (`shape(batch)`: default, that of the batch's second item)
  not in `ready` (the shapes that have run) runs before the others of its shape start, so
  that each shape compiles once; the first batches of the new shapes are taken up before all
  others, so that their programs load (or compile) side by side rather than one worker
  waiting idle for another's (batches sorted by length put each shape's batches together).
  `ready` gains each shape that has run."""
  def run(batch, first):
    if first is not None:
      first.result()  # compiled (or failed: then this batch fails the same way)
    found = fn(batch)
    ready.add(shape(batch))
    return found

  if workers <= 1:
    yield from (run(batch, None) for batch in batches)
    return
  batches, pending = list(batches), collections.deque()
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    firsts, early = {}, {}  # a new shape -> its first batch's future; that batch's index -> it
    for i, batch in enumerate(batches):
      key = shape(batch)
      if key not in ready and key not in firsts:
        firsts[key] = early[i] = pool.submit(run, batch, None)
    for i, batch in enumerate(batches):
      # FIFO: every first-of-shape was taken up before this batch, so waiting on it is safe.
      pending.append(early[i] if i in early else pool.submit(run, batch, firsts.get(shape(batch))))
      while len(pending) > workers:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()


# A search's settings -> the batch shapes it has run (compiled) in this process.
_RAN_SHAPES: dict[tuple, set[tuple[int, ...]]] = {}


def _bucket_rows(n: int, batch_size: int) -> int:
  """The next power of two >= n, at most `batch_size`: few shapes for batches of any size."""
  return min(batch_size, 1 << max(0, n - 1).bit_length())


def search_in_batches(model, strategy, limits, sources: Sequence[Sequence[int] | None], *,
                      eos_id: int | None = EOS_ID, progress: Callable[[int], None] | None = None,
                      line_ids: Sequence[int] | None = None, scores: bool = True,
                      fixed_rows: bool = True, drop_finished: bool | int = True,
                      workers: int | None = None) -> list:
  """`strategy`'s hypotheses (`limits.nbest` per source, best first) of every source under
  `model` (an NNX model; a `Session` passes the split it keeps), None where the source is None.

  Sources are decoded sorted by length (longest first) in batches of `limits.batch_size`;
  `fixed_rows` pads every batch to that many rows (one shape for a whole file), else to the
  next power of two (a stream's few waiting lines). `line_ids` (default: the positions) seed
  the samples; `scores=False` skips the forced-decoding pass that scores greedy and sampled
  outputs (their scores are then NaN). `progress(n)` hears after each batch how many
  sentences it held. `workers` batches run at once (None: `default_workers()`); any number,
  and `drop_finished`, give the same outputs.
  """
  line_ids = range(len(sources)) if line_ids is None else line_ids
  model_len = model.config.max_len
  # Longest first: the slowest batches start first, so that a pass does not end with one
  # worker on the longest batch while the others wait (test2016, 2 workers: warm passes
  # 3-4% shorter than shortest first). Any order gives the same outputs.
  order = sorted((i for i, s in enumerate(sources) if s is not None),
                 key=lambda i: len(sources[i]), reverse=True)
  batches, size = [], limits.batch_size
  for first in range(0, len(order), size):
    chunk = order[first:first + size]
    cut = [truncate(sources[i], model_len, eos_id) for i in chunk]
    rows = size if fixed_rows else _bucket_rows(len(chunk), size)
    inputs = np.zeros((rows, padded_length(cut, model_len)), np.int32)
    # Padding rows repeat the shortest source, so that they end with it: an empty source
    # decodes to whatever the model makes of nothing, maybe up to the limit, and an
    # unfinished row keeps the whole batch running (their outputs are dropped).
    shortest = min(cut, key=len)
    for row in range(rows):
      ids = cut[row] if row < len(cut) else shortest
      inputs[row, :len(ids)] = ids
    batches.append((chunk, inputs))

  def run(batch):
    chunk, inputs = batch
    tokens, found = strategy.search(model, inputs, limits=limits, eos_id=eos_id,
                                    line_ids=[line_ids[i] for i in chunk], scores=scores,
                                    drop_finished=drop_finished)
    return chunk, strategy.hypotheses(tokens, found, eos_id=eos_id, rows=len(chunk))

  # The key is the settings that shape the search's programs; a key too coarse would only let
  # two batches compile one shape at once.
  ran = _RAN_SHAPES.setdefault((model.config, strategy.NAME, strategy.program_key(),
                                limits.max_new_tokens, eos_id, limits.nbest, str(drop_finished)),
                               set())
  workers = default_workers() if workers is None else max(1, int(workers))
  outputs: list = [None] * len(sources)
  for chunk, found in in_order(run, batches, workers, ran):
    for row, i in enumerate(chunk):
      outputs[i] = found[row]
    if progress is not None:
      progress(len(chunk))
  return outputs
