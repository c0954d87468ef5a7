"""Forced decoding: the log-probability a model gives to given outputs (references, or the
outputs of a search that reports no score), as `fairseq-generate --score-reference` does.

`forced_log_probs` scores one padded batch; `score_references` a list of (source, target) id
sequences, sorted by length in batches as the translator decodes them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive.decode_loop import PAD_ID, decoding_model
from model.kinds import adapter_of

LENGTH_MULTIPLE = 16


@functools.partial(jax.jit, static_argnums=0)
def _summed_log_probs(module, params, inputs, targets):
  """Teacher-forced log P(targets[:, t] | targets[:, :t], inputs) summed over the non-pad
  targets: `inputs` `[batch, src]` (None: a language model), `targets` `[batch, len]`
  -> `[batch]`."""
  logits = adapter_of(module).teacher_forced(module, {'params': params}, inputs, targets)
  lp = jax.nn.log_softmax(logits.astype(jnp.float32))
  lp = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
  return jnp.where(targets != PAD_ID, lp, 0.0).sum(axis=-1)


def forced_log_probs(module, params, inputs, targets) -> np.ndarray:
  """log P(targets | inputs) per row: `inputs` `[batch, src]` (None for a decoder-only model),
  `targets` `[batch, len]` right-padded with 0 (the pad id is never a target) -> `[batch]`
  float32, the sum over the targets (EOS included when present)."""
  module, params = decoding_model(module, params)
  inputs = None if inputs is None else jnp.asarray(inputs, jnp.int32)
  return np.asarray(_summed_log_probs(module, params, inputs, jnp.asarray(targets, jnp.int32)))


def _padded(rows: Sequence[Sequence[int]], count: int, limit: int) -> np.ndarray:
  """`rows` right-padded with 0 into `[count, length]`, length a multiple of LENGTH_MULTIPLE."""
  length = min(limit, -(-max(1, *map(len, rows)) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
  out = np.zeros((count, length), np.int32)
  for row, ids in enumerate(rows):
    out[row, :len(ids)] = ids
  return out


def score_references(module, params, sources: Sequence[Sequence[int] | None],
                     targets: Sequence[Sequence[int]], *, batch_size: int,
                     progress: Callable[[int], None] | None = None) -> list[float | None]:
  """log P(target i | source i) for every i whose source is not None (None elsewhere).

  Sources and targets must fit the model's positions (`max_len`; the caller truncates or
  refuses). Batches of `batch_size` pairs sorted by source length, padded to one row count.
  """
  module, params = decoding_model(module, params)
  limit = module.config.max_len
  order = sorted((i for i, s in enumerate(sources) if s is not None),
                 key=lambda i: (len(sources[i]), len(targets[i])))
  out: list[float | None] = [None] * len(sources)
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    scores = forced_log_probs(module, params,
                              _padded([sources[i] for i in chunk], batch_size, limit),
                              _padded([targets[i] for i in chunk], batch_size, limit))
    for row, i in enumerate(chunk):
      out[i] = float(scores[row])
    if progress is not None:
      progress(len(chunk))
  return out
