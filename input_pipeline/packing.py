"""Packing several examples per row, and padding, for token-id examples.

Examples are dicts of 1-D int32 arrays (e.g. {'inputs': [n], 'targets': [m]}).
A packed row of length L holds several examples back to back, with
  FEATURE               [L] int32 token ids, 0 = padding
  FEATURE_segmentation  [L] int32 1, 2, 3, ... per example, 0 on padding
  FEATURE_position      [L] int32 0, 1, 2, ... restarting at each example
Every feature of an example goes into the same row with the same segment id.

`pack_ragged` packs a window of examples with first-fit decreasing (deterministic): ~93-97%
of tokens are non-pad on Multi30k at L=64. Examples come as ragged arrays (flat ids and
lengths, as read from the token cache), and every step but the choice of rows is one numpy
operation over the window. The pipeline packs fixed windows of the shuffled example stream,
so a window can be recomputed from its index alone (exact, cheap checkpoint/resume).
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


Ragged = tuple[np.ndarray, np.ndarray]  # (flat values [total], lengths [n]): n examples


def pad_ragged(examples: dict[str, Ragged], batch_size: int, length: int
               ) -> dict[str, np.ndarray]:
  """`pad_batch` of examples given per feature as (flat ids, lengths), each at most `length`."""
  out = {}
  for f, (flat, lens) in examples.items():
    within = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
    out[f] = np.zeros((batch_size, length), np.int32)
    out[f][np.repeat(np.arange(len(lens)), lens), within] = flat
  return out


def ragged_from_lists(arrays: Sequence[Sequence[int]], max_length: int | None = None,
                      eos_id: int | None = None) -> Ragged:
  """Examples given as id lists -> (flat, lengths), each cut by `truncate` (EOS kept last)."""
  lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
  flat = (np.concatenate([np.asarray(a, np.int32) for a in arrays]) if len(arrays)
          else np.zeros(0, np.int32))
  if max_length is None:
    return flat, lengths
  return truncate((flat, lengths), lengths, max_length, eos_id)


def truncate(ids: Ragged, full_lengths: np.ndarray, max_length: int, eos_id: int | None
             ) -> Ragged:
  """`common.tokens.truncate` on every example at once: `ids` holds each example's first
  `min(full_length, max_length)` ids (or all of them); a cut example ends with `eos_id`."""
  flat, lengths = ids
  keep = np.minimum(full_lengths, max_length)
  if (lengths != keep).any():  # the full examples: keep their first `keep` ids
    within = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    flat = flat[within < np.repeat(keep, lengths)]
  flat = np.array(flat, np.int32)
  cut = full_lengths > max_length
  if eos_id is not None and cut.any():
    flat[(np.cumsum(keep) - 1)[cut]] = eos_id
  return flat, keep


def first_fit_decreasing(lengths: np.ndarray, length: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Rows for examples of `lengths` `[n, F]` (F features packed together): longest total
  first, each into the first row where every feature has room.

  Returns (row `[n]`, offset `[n, F]` within the row, segment id `[n]` 1, 2, ...,
  number of rows). Rows are numbered in the order they were opened.

  A scalar loop over the open rows, kept short by one observation: a row whose room is below
  every remaining example's need (feature by feature) can take none of them, so the search
  starts after that closed prefix. The rows chosen are first-fit decreasing's.
  """
  n, num_features = lengths.shape
  if num_features not in (1, 2):
    raise ValueError(f'first_fit_decreasing packs 1 or 2 features together, not {num_features}')
  if n and lengths.max() > length:
    raise ValueError(f'example longer than the packing length {length}')
  order = np.argsort(-lengths.sum(1), kind='stable')  # longest first
  needs = lengths[order]
  floor = np.minimum.accumulate(needs[::-1], axis=0)[::-1]  # the rest's least need
  # Plain lists: at ~10 ids a row, a scalar loop beats a numpy call per example.
  need_a = needs[:, 0].tolist()
  need_b = needs[:, -1].tolist()  # a single feature is tested twice: harmless
  floor_a, floor_b = floor[:, 0].tolist(), floor[:, -1].tolist()
  room_a: list[int] = []
  room_b: list[int] = []
  rows, offsets_a, offsets_b = [0] * n, [0] * n, [0] * n
  first = 0  # rows before it are closed
  for k in range(n):
    a, b, least_a, least_b = need_a[k], need_b[k], floor_a[k], floor_b[k]
    num_rows = len(room_a)
    while first < num_rows and (room_a[first] < least_a or room_b[first] < least_b):
      first += 1
    row = first
    while row < num_rows and (room_a[row] < a or room_b[row] < b):
      row += 1
    if row == num_rows:
      room_a.append(length)
      room_b.append(length)
    offsets_a[k], offsets_b[k] = length - room_a[row], length - room_b[row]
    room_a[row] -= a
    room_b[row] -= b
    rows[k] = row
  num_rows = len(room_a)
  row_of = np.array(rows, np.int64)
  offset_of = np.stack([offsets_a, offsets_b][:num_features], axis=1).astype(np.int64)
  segment_of = np.empty(n, np.int64)
  # Each row's examples in the order they came: the segment ids first-fit gives.
  by_row = np.lexsort((np.arange(n), row_of))
  starts = np.searchsorted(row_of[by_row], row_of[by_row], side='left')
  segment_of[by_row] = np.arange(n) - starts + 1
  unsorted = np.empty_like(order)
  unsorted[order] = np.arange(n)
  return (row_of[unsorted], offset_of[unsorted], segment_of[unsorted], num_rows)


def pack_ragged(examples: dict[str, Ragged], length: int,
                rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
  """Packs n examples, given per feature F as (flat ids, lengths `[n]`), into as few rows of
  `length` as first-fit decreasing finds; the features of an example share a row and id.

  Returns, for each feature F: F, F_segmentation, F_position, each `[num_rows, length]`
  int32; rows in packing order, or shuffled by `rng`.
  """
  names = list(examples)
  lengths = np.stack([examples[f][1] for f in names], axis=1).astype(np.int64)
  row_of, offset_of, segment_of, num_rows = first_fit_decreasing(lengths, length)
  out = {}
  for j, f in enumerate(names):
    flat, lens = examples[f]
    within = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
    where = np.repeat(row_of * length + offset_of[:, j], lens) + within
    for key, values in ((f, flat), (f'{f}_segmentation', np.repeat(segment_of, lens)),
                        (f'{f}_position', within)):
      out[key] = np.zeros(num_rows * length, np.int32)
      out[key][where] = values
      out[key] = out[key].reshape(num_rows, length)
  if rng is not None and num_rows:
    perm = rng.permutation(num_rows)
    out = {k: v[perm] for k, v in out.items()}
  return out


def pack_window(examples: Sequence[dict[str, np.ndarray]], features: Sequence[str],
                length: int, rng: np.random.Generator | None = None
                ) -> dict[str, np.ndarray]:
  """`pack_ragged` of examples given as dicts of 1-D int arrays (each at most `length`)."""
  return pack_ragged({f: ragged_from_lists([ex[f] for ex in examples]) for f in features},
                     length, rng)


def unpack(row: dict[str, np.ndarray], feature: str) -> list[np.ndarray]:
  """The examples of one packed row `[length]`, in segment order (tests, inspection)."""
  seg = row[f'{feature}_segmentation']
  return [row[feature][seg == s] for s in range(1, int(seg.max(initial=0)) + 1)]
