"""Forced decoding: the log-probability a model gives to given outputs (references, or the
outputs of a search that reports no score), as `fairseq-generate --score-reference` does.

`forced_log_probs` scores one padded batch; `score_references` a list of (source, target) id
sequences, sorted by length in batches (longest first) as `strategies.base.search_in_batches`
decodes them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive.decodable import decoding_model
from autoregressive.strategies.base import default_workers, in_order, padded_length
from autoregressive.strategies.loop import log_normalizer, prompt_lengths
from common.tokens import EOS_ID, PAD_ID
from model.build import bind
from model.kinds import adapter_of

Array = jax.Array

# The (inputs, targets) shapes scored (compiled) in this process, per model config.
_RAN_SHAPES: dict = {}


@functools.partial(jax.jit, static_argnums=0)
def _summed_log_probs(config, params, inputs, targets):
  """Teacher-forced log P(targets[:, t] | targets[:, :t], inputs) summed over the non-pad
  targets, under the model of `config` (static) holding `params`: `inputs` `[batch, src]`
  (None: a language model), `targets` `[batch, len]` -> `[batch]`."""
  logits = adapter_of(config).teacher_forced(bind(config, params), inputs, targets)
  logits = logits.astype(jnp.float32)
  # The log-softmax over the tokens an output can hold (`log_normalizer`) at the targets only:
  # the whole `[batch, len, vocab]` log-softmax is never written (it was ~half of a warm
  # --score_reference pass on CPU).
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_sum = log_normalizer(logits, peak)
  x = jnp.take_along_axis(logits, targets[..., None], axis=-1)
  lp = ((x - peak) - log_sum)[..., 0]
  return jnp.where(targets != PAD_ID, lp, 0.0).sum(axis=-1)


def forced_log_probs(module, inputs, targets) -> np.ndarray:
  """log P(targets | inputs) per row under `module` (an NNX model):
  `inputs` `[batch, src]` (None for a decoder-only model), `targets` `[batch, len]`
  right-padded with 0 (the pad id is never a target) -> `[batch]` float32, the sum over the
  targets (EOS included when present)."""
  config, params = decoding_model(module)
  inputs = None if inputs is None else jnp.asarray(inputs, jnp.int32)
  return np.asarray(_summed_log_probs(config, params, inputs, jnp.asarray(targets, jnp.int32)))


def _padded(rows: Sequence[Sequence[int]], count: int, length: int) -> np.ndarray:
  """`rows` right-padded with 0 into `[count, length]`."""
  out = np.zeros((count, length), np.int32)
  for row, ids in enumerate(rows):
    out[row, :len(ids)] = ids
  return out


def score_references(module, sources: Sequence[Sequence[int] | None],
                     targets: Sequence[Sequence[int]], *, batch_size: int,
                     progress: Callable[[int], None] | None = None,
                     workers: int | None = None) -> list[float | None]:
  """log P(target i | source i) for every i whose source is not None (None elsewhere).

  Sources and targets must fit the model's positions (`max_len`; the caller truncates or
  refuses). Batches of `batch_size` pairs sorted by length (longest first), padded to one
  row count; the targets of the batches whose sources have one padded length share one
  padded length too (fewer programs to compile, for little work: one forward pass). `workers`
  batches run at once (None: `base.default_workers()`).
  """
  model = decoding_model(module)  # split once for every batch
  limit = model.config.max_len
  order = sorted((i for i, s in enumerate(sources) if s is not None),
                 key=lambda i: (len(sources[i]), len(targets[i])), reverse=True)
  chunks = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
  src_lens = [padded_length([sources[i] for i in chunk], limit) for chunk in chunks]
  tgt_lens: dict[int, int] = {}
  for chunk, src_len in zip(chunks, src_lens, strict=True):
    longest = padded_length([targets[i] for i in chunk], limit)
    tgt_lens[src_len] = max(tgt_lens.get(src_len, 0), longest)
  batches = [(chunk, (_padded([sources[i] for i in chunk], batch_size, src_len),
                      _padded([targets[i] for i in chunk], batch_size, tgt_lens[src_len])))
             for chunk, src_len in zip(chunks, src_lens, strict=True)]

  def run(batch):
    chunk, (inputs, padded) = batch
    return chunk, forced_log_probs(model, inputs, padded)

  out: list[float | None] = [None] * len(sources)
  ready = _RAN_SHAPES.setdefault(model.config, set())
  workers = default_workers() if workers is None else max(1, int(workers))
  for chunk, scores in in_order(run, batches, workers, ready,
                                shape=lambda batch: tuple(x.shape for x in batch[1])):
    for row, i in enumerate(chunk):
      out[i] = float(scores[row])
    if progress is not None:
      progress(len(chunk))
  return out


def sequence_log_probs(module, inputs=None, *, prompt=None, tokens) -> Array:
  """Full-forward-pass log P of candidate continuations `tokens` `[batch, n, len]` -> `[batch, n]`.

  Sums the log-softmax of the teacher-forced logits (over the tokens an output can hold:
  `strategies.loop.log_normalizer`) up to and including the first EOS
  (all tokens when there is none); the zeros after EOS are ignored. The tokens continue
  each row's `prompt` (a decoder-only model's prompt, or an encoder-decoder's forced target
  prefix), given the source `inputs` of an encoder-decoder. For tests and rescoring.
  """
  config, params = decoding_model(module)
  adapter = adapter_of(config)
  tokens = np.asarray(tokens, np.int32)
  batch, n, length = tokens.shape
  flat = tokens.reshape(batch * n, length)
  prompt = np.zeros((batch, 0), np.int32) if prompt is None else np.asarray(prompt, np.int32)
  prompt = prompt.reshape(batch, -1)
  lengths = prompt_lengths(prompt)
  full = np.zeros((batch * n, prompt.shape[1] + length), np.int32)
  for r in range(batch * n):
    b = r // n
    full[r, :lengths[b]] = prompt[b, :lengths[b]]
    full[r, lengths[b]:lengths[b] + length] = flat[r]
  source = np.repeat(np.asarray(inputs, np.int32), n, axis=0) if adapter.has_source else None
  cols = np.repeat(lengths, n)[:, None] + np.arange(length)[None, :]
  is_eos = flat == EOS_ID
  counted = np.cumsum(is_eos, axis=1) - is_eos == 0  # up to and including the first EOS
  return _continuation_log_probs(config, params, source, full, cols, counted).reshape(batch, n)


@functools.partial(jax.jit, static_argnums=0)
def _continuation_log_probs(config, params, source, full, cols, counted):
  """`sequence_log_probs`' one program: the log P of `full`'s tokens at columns `cols`
  `[rows, len]` where `counted`, summed -> `[rows]` (op by op, each new shape compiled ~100
  small programs)."""
  logits = adapter_of(config).teacher_forced(bind(config, params), source, full)
  logits = logits.astype(jnp.float32)
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_sum = log_normalizer(logits, peak)  # over the tokens an output can hold
  x = jnp.take_along_axis(logits, full[..., None], axis=-1)
  lp = jnp.take_along_axis(((x - peak) - log_sum)[..., 0], cols, axis=1)
  return jnp.where(counted, lp, 0.0).sum(axis=1)


def forced_scores(module, inputs, prompt, tokens, *, scores: bool) -> tuple[np.ndarray, np.ndarray]:
  """Outputs `tokens` `[batch, n, len]` of a search that draws one token at a time, with their
  log P under the model (forced decoding; NaN without `scores`), best first when scored."""
  tokens = np.asarray(tokens)
  batch, n, _ = tokens.shape
  if not scores:
    return tokens, np.full((batch, n), np.nan, np.float32)
  if not adapter_of(module).has_source and prompt is None:
    inputs, prompt = None, inputs  # a language model takes a positional array as its prompt
  if prompt is None and inputs is not None:  # one jitted pass over the flattened rows
    flat = forced_log_probs(module, np.repeat(np.asarray(inputs), n, axis=0),
                            tokens.reshape(batch * n, -1))
    log_p = flat.reshape(batch, n)
  else:
    log_p = np.asarray(sequence_log_probs(module, inputs, prompt=prompt, tokens=tokens))
  order = np.argsort(-log_p, axis=1, kind='stable')
  return (np.take_along_axis(tokens, order[..., None], axis=1),
          np.take_along_axis(log_p, order, axis=1))
