"""What the Translator and reference scoring share about batches: their padded length (a few
shapes, so a few programs), and running them on a few worker threads, results in order (on a
CPU a batch's program is a chain of small ops that mostly keep one core busy, so two batches at
once use two cores).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import jax

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
