"""The pieces every decoding loop shares (`autoregressive.decoding`, `.beam_search`): the model
to decode with (`decoding_model`: the one place a `scan_layers` model is unrolled, and an NNX
module split into the (config, params) that the jitted programs take), argument checks, the
first decoder call outside the loop, forced prompt tokens, the length penalty.

The model-kind specifics (encoding a source, the cache, one decoder step) come from the
kind's adapter (`model.kinds`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common.tokens import PAD_ID
from model.build import params_of, unrolled
from model.config import ModelConfig
from model.kinds import adapter_of

Array = jax.Array

NEG_INF = -np.inf


def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT length penalty `((5 + length) / 6) ** alpha`."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def log_normalizer(logits: Array, peak: Array) -> Array:
  """`log(sum(exp(logits - peak)))` over the last axis `[..., vocab]` -> `[..., 1]`, pad left out:
  every log-probability of decoding and scoring is `logit - peak - log_normalizer`, the model's
  distribution over the tokens an output can hold (never pad, the shift-in token). That is
  the distribution CTranslate2 and transformers compute from the exports (their output bias
  is -1e9 at pad), so the three searches rank hypotheses alike. `peak` `[..., 1]`: any value
  near the maximum, for range.
  """
  terms = jnp.exp(logits - peak)
  terms = jnp.where(jnp.arange(logits.shape[-1]) == PAD_ID, 0.0, terms)
  return jnp.log(jnp.sum(terms, axis=-1, keepdims=True))


def left_out(tokens: Array, exclude: int | None = PAD_ID, eos_banned: Array | None = None,
             eos_id: int | None = None) -> Array:
  """Which token ids `tokens` `[rows or 1, ...]` a search may not choose -> bool, broadcast to
  `[rows, ...]`: `exclude` (pad), and `eos_id` in the rows where `eos_banned` `[rows]` (an
  output shorter than `min_new_tokens`)."""
  out = jnp.zeros(tokens.shape, jnp.bool_) if exclude is None else tokens == exclude
  if eos_banned is not None and eos_id is not None:
    out = out | ((tokens == eos_id) & eos_banned.reshape((-1,) + (1,) * (tokens.ndim - 1)))
  return out


def left_out_blocks(size: int, exclude: int | None = PAD_ID, eos_banned: Array | None = None,
                    eos_id: int | None = None) -> list[int]:
  """The indices of the blocks of `size` tokens that hold a token `left_out` may mask."""
  ids = [exclude, eos_id if eos_banned is not None else None]
  return sorted({i // size for i in ids if i is not None})


class Decodable(NamedTuple):
  """A model as the decoding programs take it: `config` (static: a program is compiled per
  config) and `params` (the pure dict of its parameters, traced), unrolled. Callers that decode
  many batches (`Translator`, `Session`) keep this form, so that the module is split once."""
  config: ModelConfig
  params: dict[str, Any]


def decoding_model(model) -> Decodable:
  """The (config, params) to decode or plot with, of an NNX model (`model.build_model`) or of a
  `Decodable` (returned as it is). A `scan_layers` model runs unrolled, so that every layer has
  its own KV cache and its own kept attention weights (same weights, same results). Every
  inference path goes through here: `workdir.restore` and `Translator` split once, and the
  decoding functions' own call is then a no-op."""
  if isinstance(model, Decodable):
    return model
  model = unrolled(model)
  return Decodable(model.config, params_of(model))


def prompt_lengths(prompt):
  """Per-row length of a right-padded prompt: the index of the last non-pad token + 1."""
  xp = np if isinstance(prompt, np.ndarray) else jnp
  width = prompt.shape[1]
  if width == 0:
    return xp.zeros((prompt.shape[0],), xp.int32)
  cols = xp.arange(1, width + 1)[None, :]
  return xp.max(xp.where(prompt != PAD_ID, cols, 0), axis=1).astype(xp.int32)


def _as_2d(x, name: str):
  x = x if hasattr(x, 'shape') else np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} must be [batch, len], got shape {x.shape}')
  return x


def _check_positions(cfg, what: str, length: int, hint: str = '') -> None:
  if length > cfg.max_len and cfg.positional_encoding != 'rope':
    raise ValueError(f"{what} need {length} positions > the model's max_len {cfg.max_len}{hint}")


def prepare(config: ModelConfig, inputs, prompt, max_new_tokens: int):
  """Validates and normalises the arguments for a model of `config` -> (inputs, prompt,
  lengths, prefill_len).

  Works on host or device arrays, and on tracers (when the caller jits around us); the
  prefill length (a static shape) needs concrete prompt values, else it is 0.
  """
  adapter, cfg = adapter_of(config), config
  if not adapter.has_decoder:
    raise ValueError(f'decoding needs a decoder: this is an {adapter.kind} model')
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens <= 0:
    raise ValueError(f'max_new_tokens must be a positive integer, got {max_new_tokens!r}')
  if adapter.has_source:
    if inputs is None:
      raise ValueError(f'an {adapter.kind} model needs `inputs` `[batch, src_len]`')
    inputs = _as_2d(inputs, 'inputs')
    _check_positions(cfg, 'the inputs', inputs.shape[1], '; truncate them')
    if prompt is None:
      prompt = np.zeros((inputs.shape[0], 0), np.int32)
  else:
    if prompt is None:
      prompt, inputs = inputs, None
    if inputs is not None:
      raise ValueError(f'a {adapter.kind} model takes a `prompt`, not `inputs`')
    if prompt is None:
      raise ValueError(f'a {adapter.kind} model needs a `prompt` `[batch, len]` (it may have '
                       'length 0)')
  prompt = _as_2d(prompt, 'prompt')
  if inputs is not None and inputs.shape[0] != prompt.shape[0]:
    raise ValueError(f'inputs batch {inputs.shape[0]} != prompt batch {prompt.shape[0]}')
  _check_positions(cfg, f'prompt length {prompt.shape[1]} + max_new_tokens {max_new_tokens}',
                   prompt.shape[1] + max_new_tokens)
  # Before the prompt goes to the device: a host prompt's lengths are NumPy ops (as jnp ops
  # each would compile in every new process).
  lengths = prompt_lengths(prompt)
  prefill_len = 0
  if prompt.shape[1] and not isinstance(prompt, jax.core.Tracer):
    prefill_len = int(np.min(lengths))
  prompt = jnp.asarray(prompt, jnp.int32)
  if inputs is not None:
    inputs = jnp.asarray(inputs, jnp.int32)
  return inputs, prompt, jnp.asarray(lengths, jnp.int32), prefill_len


def start(model, inputs, prompt, prefill_len, max_new_tokens, batch_repeat=1, cache_len=None):
  """Encodes, makes the cache and runs the first decoder call, outside the loop.

  `model` is the bound module (`model.bind` inside the trace). The decoder reads `[0] +
  prompt`; the first call feeds the start token and the prompt prefix that every row shares in
  length (`prefill_len` tokens: one call, not one per token); longer prompts are force-fed
  inside the loop. (The cache already holds the encoder's projected keys/values: `init_cache`.)
  With `batch_repeat=k` every row is repeated k times (beam search), after encoding.
  `cache_len` defaults to one cache position per decoder input.
  Returns (logits `[batch*k, vocab]` predicting target index t, cache, inputs `[batch*k,
  src_len]` or None, t).
  """
  adapter = adapter_of(model)
  encoded = None if inputs is None else adapter.encode(model, inputs)
  batch = prompt.shape[0]
  if batch_repeat > 1:
    rep = lambda x: None if x is None else jnp.repeat(x, batch_repeat, axis=0)  # noqa: E731
    encoded, inputs = rep(encoded), rep(inputs)
  if cache_len is None:
    cache_len = prompt.shape[1] + max_new_tokens
  cache = adapter.init_cache(model, encoded, inputs, batch * batch_repeat, cache_len)
  first = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), prompt[:, :prefill_len]], axis=1)
  if batch_repeat > 1:
    first = jnp.repeat(first, batch_repeat, axis=0)
  logits, cache = adapter.decoder_step(model, cache, inputs, first)
  return logits[:, -1], cache, inputs, prefill_len


# A decoding loop's first steps attend over a cache of this many steps (`KVCache.grow`).
FIRST_WINDOW = 16


def windows(first_window: int, prompt_len: int, max_new_tokens: int, prefill_len: int):
  """(n0, window, calls) of a decoding loop: the cache positions the first call writes, the
  loop calls run on the short cache (`first_window`, or all of them), and all loop calls."""
  n0 = 1 + prefill_len
  calls = prompt_len + max_new_tokens - n0
  return n0, first_window if 0 < first_window < calls else calls, calls


def window_then_whole(loop, rows, state, sizes: tuple[int, ...], window: int, calls: int, *,
                      grow, done, result):
  """`in_stages` for a loop whose first `window` calls run on a short cache: `loop(rows, state,
  stop_at, n)` runs until at most `stop_at` rows are unfinished or n calls are done, and
  `grow(state)` pads the cache to full length for the later calls (up to `calls`).

  When the short cache's calls end with at most `sizes[0]` rows unfinished (most batches), only
  those rows' caches are grown: padding every row's cache cost ~10% of a beam search.
  """
  if calls == 0:  # the first call made every token (max_new_tokens=1): no loop to trace,
    return result(state)  # whose body would write past a cache with no room for it
  stop_at = sizes[0] if sizes else 0
  state = loop(rows, state, stop_at, window)
  whole = functools.partial(loop, calls=calls)
  if window >= calls:
    return later_stages(whole, rows, state, sizes, done, result)
  if not sizes:
    return result(whole(rows, grow(state), 0))

  def compact(state):  # -> (the kept rows, their state, every row's result so far)
    keep = unfinished_first(done(state), sizes[0])
    return keep, take_rows(state, keep), result(state)

  def few_left(state):
    keep, part, found = compact(state)
    return keep, grow(part), found

  def many_left(state):
    return compact(whole(rows, grow(state), stop_at))

  keep, part, found = jax.lax.cond(jnp.sum(~done(state)) <= stop_at, few_left, many_left, state)
  part = in_stages(whole, take_rows(rows, keep), part, sizes[1:], done, result)
  return put_rows(found, keep, part)


def block_size(n: int, most: int) -> int:
  """The largest divisor of n up to `most`: the block length of a two-level reduction over n."""
  return max(b for b in range(1, min(most, n) + 1) if n % b == 0)


def forced_tokens(prompt, lengths, t):
  """(forced `[batch]` bool, the prompt token at target index t `[batch]`)."""
  forced = t < lengths
  if prompt.shape[1] == 0:
    return forced, jnp.zeros_like(lengths)
  return forced, prompt[:, jnp.minimum(t, prompt.shape[1] - 1)]


# ----------------------------------------------------------------------------- finished rows

def compact_sizes(batch: int, drop_finished: bool | int | tuple = True) -> tuple[int, ...]:
  """Rows of a decoding loop's later stages, each run on the unfinished rows of the stage
  before it (() : one stage, every row to the end of the batch).

  A batch runs until its longest output ends, so once most rows have finished, most of each
  step is spent on rows whose result is final (on test2016, batch 64: about half of all row
  steps). With `drop_finished=True` the loop runs on all rows until at most a quarter are
  unfinished, then on those until at most a quarter of them are, and so on down to 2 rows
  (64 -> 16 -> 4); an int n > 0 gives one later stage of n rows, a tuple the stages' rows
  (decreasing); False (or 0): one stage.
  """
  if drop_finished is True:
    sizes = []
    while batch >= 8:
      batch //= 4
      sizes.append(batch)
    return tuple(sizes)
  sizes = tuple(int(n) for n in drop_finished) if isinstance(drop_finished, (tuple, list)) \
      else (int(drop_finished),)
  if any(n < 0 for n in sizes):
    raise ValueError(f'drop_finished must be a bool or numbers of rows >= 0, got {drop_finished}')
  if any(b >= a for a, b in zip(sizes, sizes[1:], strict=False)):
    raise ValueError(f'drop_finished stages must decrease, got {drop_finished}')
  return tuple(n for n in sizes if 0 < n < batch)


def in_stages(loop, rows, state, sizes: tuple[int, ...], done, result):
  """`loop(rows, state, stop_at)` over the whole batch until at most `sizes[0]` rows are
  unfinished, then over those rows only (and so on for the later sizes) -> `result(state)`
  with every row's final value. `done(state)` `[batch]` says which rows are finished; `rows`
  is a pytree of the rows' own inputs (`take_rows`)."""
  state = loop(rows, state, sizes[0] if sizes else 0)
  return later_stages(loop, rows, state, sizes, done, result)


def later_stages(loop, rows, state, sizes: tuple[int, ...], done, result):
  """`in_stages` after its first stage: `state` has run until at most `sizes[0]` rows were
  unfinished."""
  if not sizes:
    return result(state)
  keep = unfinished_first(done(state), sizes[0])
  part = in_stages(loop, take_rows(rows, keep), take_rows(state, keep), sizes[1:], done, result)
  return put_rows(result(state), keep, part)


def unfinished_first(done, n: int):
  """The indices of `n` rows `[n]`: the unfinished ones (`done` `[batch]` False) first."""
  return jnp.argsort(done.astype(jnp.int32), stable=True)[:n]


def take_rows(tree, rows):
  """Every array of `tree` at `rows` `[n]` of its leading (batch) axis; scalars are kept."""
  return jax.tree.map(lambda x: x if jnp.ndim(x) == 0 else x[rows], tree)


def put_rows(tree, rows, part):
  """`tree` with rows `rows` replaced by `part` (as `take_rows` took them)."""
  return jax.tree.map(lambda x, p: x if jnp.ndim(x) == 0 else x.at[rows].set(p), tree, part)
