"""Packing several examples per row, and padding, for token-id examples.

Examples are dicts of 1-D int32 arrays (e.g. {'inputs': [n], 'targets': [m]}).
A packed row of length L holds several examples back to back, with
  FEATURE               [L] int32 token ids, 0 = padding
  FEATURE_segmentation  [L] int32 1, 2, 3, ... per example, 0 on padding
  FEATURE_position      [L] int32 0, 1, 2, ... restarting at each example
Every feature of an example goes into the same row with the same segment id.

`pack_window` packs a window of examples with first-fit decreasing (numpy;
deterministic): ~93-97% of tokens are non-pad on Multi30k at L=64. The
pipeline packs fixed windows of the shuffled example stream, so a window can
be recomputed from its index alone (exact, cheap checkpoint/resume).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pad_batch(examples: Sequence[dict[str, np.ndarray]], batch_size: int, length: int,
              keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
  """Stacks examples into zero-padded `[batch_size, length]` arrays.

  Rows after `len(examples)` are all zeros (pad), so they carry no loss weight.
  """
  keys = list(keys if keys is not None else examples[0].keys())
  out = {k: np.zeros((batch_size, length), np.int32) for k in keys}
  for i, ex in enumerate(examples):
    for k in keys:
      v = ex[k]
      out[k][i, : len(v)] = v
  return out


def pack_window(examples: Sequence[dict[str, np.ndarray]], features: Sequence[str],
                length: int, rng: np.random.Generator | None = None
                ) -> dict[str, np.ndarray]:
  """Packs `examples` into as few rows of `length` as first-fit decreasing finds.

  Args:
    examples: dicts with 1-D int arrays under `features`, each at most `length`.
    features: keys packed together (an example's features share a row and id).
    length: row length L.
    rng: if given, shuffles the output rows (else rows come in packing order).

  Returns:
    dict with, for each feature F: F, F_segmentation, F_position, each
    `[num_rows, length]` int32.
  """
  n = len(examples)
  lens = np.array([[len(ex[f]) for f in features] for ex in examples], np.int64).reshape(n, -1)
  if n and lens.max() > length:
    raise ValueError(f'example longer than the packing length {length}')
  order = np.argsort(-lens.sum(1), kind='stable')  # longest first
  room = np.full((n, len(features)), length, np.int64)  # free space per open row
  row_of = np.empty(n, np.int64)
  offset_of = np.empty((n, len(features)), np.int64)
  segment_of = np.empty(n, np.int64)
  counts = np.zeros(n, np.int64)
  num_rows = 0
  for i in order:
    need = lens[i]
    fits = np.flatnonzero((room[:num_rows] >= need).all(1)) if num_rows else ()
    row = fits[0] if len(fits) else num_rows
    num_rows += row == num_rows
    row_of[i] = row
    offset_of[i] = length - room[row]
    room[row] -= need
    counts[row] += 1
    segment_of[i] = counts[row]

  out = {}
  for j, f in enumerate(features):
    tokens = np.zeros((num_rows, length), np.int32)
    seg = np.zeros((num_rows, length), np.int32)
    pos = np.zeros((num_rows, length), np.int32)
    for i, ex in enumerate(examples):
      r, o, k = row_of[i], offset_of[i, j], lens[i, j]
      tokens[r, o:o + k] = ex[f]
      seg[r, o:o + k] = segment_of[i]
      pos[r, o:o + k] = np.arange(k)
    out[f], out[f'{f}_segmentation'], out[f'{f}_position'] = tokens, seg, pos
  if rng is not None and num_rows:
    perm = rng.permutation(num_rows)
    out = {k: v[perm] for k, v in out.items()}
  return out


def unpack(row: dict[str, np.ndarray], feature: str) -> list[np.ndarray]:
  """The examples of one packed row `[length]`, in segment order (tests, inspection)."""
  seg = row[f'{feature}_segmentation']
  return [row[feature][seg == s] for s in range(1, int(seg.max(initial=0)) + 1)]
