"""What the searches share (the rows greedy.py, sampling.py and beam.py): the model to decode
with (`autoregressive.decodable`), argument checks, the first decoder
call outside the loop, forced prompt tokens, the length penalty, the loop's windows and row
compaction, and `draw_tokens`: the one-token-at-a-time program of greedy decoding and sampling.

Every search runs the whole generation inside one jitted `lax.while_loop` that carries the
model's KV cache (`model.kv_cache`: no per-token Python round trips, no recomputation of the
prefix), and stops early once every sequence of the batch has finished. Compiled programs are
cached by `jax.jit` (static: the model's config, and the shapes; the parameters are a traced
pure dict), so repeated calls with the same shapes do not recompile.

Models:
  encoder-decoder  `inputs` `[batch, src_len]` (right-padded with 0) are encoded once;
                   the decoder starts from the start token 0. The encoder-decoder
                   attention keys/values are projected once, into the new cache.
  decoder-only     `prompt` `[batch, prompt_len]` (right-padded with 0; rows may have
                   different lengths, and a row may be empty). The decoder reads
                   `[0] + prompt` and continues the prompt. The common prefix (the
                   shortest prompt) is run in one prefill call; the rest of each longer
                   prompt is force-fed token by token inside the loop, so every row keeps
                   its true absolute positions (no left padding).
  An encoder-decoder model also accepts a `prompt`: a forced target prefix.

Outputs hold the generated tokens only (not the prompt), `[..., max_new_tokens]`; a
sequence that emits EOS (id 1 by default; `eos_id=None` for vocabularies without
one, e.g. characters) keeps the EOS and has zeros after it. The pad id 0 is never
generated. The model-kind specifics (encoding a source, the cache, one decoder step) come
from the kind's adapter (`model.kinds`).

The three searches share one argument order, `(module, inputs=None, *, prompt=None,
max_new_tokens, ...)`: `inputs` is the model's input (an encoder-decoder's source; a
decoder-only model, which has no source, takes it as its prompt) and `prompt` a forced prefix
of what is generated (a decoder-only model's prompt, an encoder-decoder's target prefix).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive.strategies.base import check_token_ids
from common.tokens import PAD_ID
from model.build import bind
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


def prompt_lengths(prompt):
  """Per-row length of a right-padded prompt: the index of the last non-pad token + 1."""
  xp = np if isinstance(prompt, np.ndarray) else jnp
  width = prompt.shape[1]
  if width == 0:
    return xp.zeros((prompt.shape[0],), xp.int32)
  cols = xp.arange(1, width + 1)[None, :]
  return xp.max(xp.where(prompt != PAD_ID, cols, 0), axis=1).astype(xp.int32)


def token_batch(x, name: str, vocab_size: int | None = None):
  """`x` as a `[batch, len]` array of at least one row; concrete values (not a tracer's) are
  token ids in [0, vocab_size) (`base.check_token_ids`)."""
  if vocab_size is not None and not isinstance(x, jax.core.Tracer):
    checked = check_token_ids(x, name, vocab_size)
    x = x if hasattr(x, 'shape') else checked
  x = x if hasattr(x, 'shape') else np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} must be [batch, len], got shape {x.shape}')
  if x.shape[0] == 0:
    raise ValueError(f'{name} has no rows (shape {x.shape}): an empty batch has nothing to '
                     'decode')
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
    inputs = token_batch(inputs, 'inputs', cfg.vocab_size)
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
  prompt = token_batch(prompt, 'prompt', cfg.vocab_size)
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


# ----------------------------------------------------------------------------- one token at a time

def _select(logits, rng, temperature, top_p, eos_banned, *, greedy: bool, top_k: int | None,
            use_top_p: bool, eos_id: int | None):
  """Next token `[batch]` from logits `[batch, vocab]`: never pad, nor EOS in the rows where
  `eos_banned` `[batch]`."""
  if greedy:
    return first_argmax(logits, exclude=PAD_ID, eos_banned=eos_banned, eos_id=eos_id)
  never = left_out(jnp.arange(logits.shape[-1])[None, :], PAD_ID, eos_banned, eos_id)
  logits = jnp.where(never, NEG_INF, logits)
  logits = logits / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if use_top_p:
    # Nucleus: the smallest set of most likely tokens whose probability reaches top_p.
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly better tokens
    # The best token always: a top_p that float32 flushes to 0 (1e-38) would keep none, and
    # the draw from all -inf logits would be pad (an empty output).
    keep = (before < top_p) | (jnp.arange(logits.shape[-1]) == 0)
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  if _per_row(rng):  # each row draws from its own key: independent of the batch it is in
    return jax.vmap(jax.random.categorical)(rng, logits).astype(jnp.int32)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def first_argmax(x, exclude: int | None = None, block: int = 32, *, eos_banned=None,
                 eos_id: int | None = None):
  """NumPy's `argmax(x, axis=-1)` `[rows]` int32 of `x` `[rows, n]` (the first maximum; the
  first NaN if any, where `jnp.argmax` on GPU may take a later one), column `exclude` (e.g.
  pad) left out, and column `eos_id` in the rows where `eos_banned` `[rows]`, reading `x` once.

  A max over blocks of about `block` columns (`block_size`) picks the first block
  holding the maximum, then the maximum's first column in that block (the greedy step's
  largest cost after the output projection: masking pad, then argmax's (value, index)
  reduction or a max and a min over the whole row, read the logits 2-3 times). Only the
  blocks holding a left-out column are masked (pad and EOS share the first).
  """
  rows, n = x.shape
  block = block_size(n, block)
  blocks = x.reshape(rows, n // block, block)
  peak = jnp.max(blocks, axis=-1)  # [rows, n // block]
  masked = left_out_blocks(block, exclude, eos_banned, eos_id)
  for j in masked:
    columns = j * block + jnp.arange(block)[None, :]
    own = jnp.where(left_out(columns, exclude, eos_banned, eos_id), NEG_INF,
                    x[:, j * block:(j + 1) * block])
    peak = peak.at[:, j].set(jnp.max(own, axis=-1))
  which = _first_max(peak)
  chosen = jnp.take_along_axis(blocks, which[:, None, None], axis=1)[:, 0]  # [rows, block]
  if masked:
    columns = which[:, None] * block + jnp.arange(block)
    chosen = jnp.where(left_out(columns, exclude, eos_banned, eos_id), NEG_INF, chosen)
  return which * block + _first_max(chosen)


def _first_max(x):
  """The first maximum's (or NaN's) index `[rows]` int32 of `x` `[rows, n]`, as a max and a min
  (XLA:CPU runs argmax's (value, index) reduction ~3x slower)."""
  best = jnp.max(x, axis=-1, keepdims=True)
  hit = (x == best) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1).astype(jnp.int32)


def _per_row(rng) -> bool:
  """Whether `rng` is one key per row (`[batch, 2]` raw keys or `[batch]` typed keys)."""
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  return rng.ndim == (1 if typed else 2)


def _fold_in(rng, t):
  if _per_row(rng):
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(rng, t)
  return jax.random.fold_in(rng, t)


@functools.partial(jax.jit, static_argnames=('config', 'max_new_tokens', 'prefill_len', 'greedy',
                                             'top_k', 'use_top_p', 'eos_id', 'compact_rows',
                                             'first_window'))
def draw_tokens(config, params, inputs, prompt, lengths, rng, temperature, top_p, min_new_tokens,
              *, max_new_tokens, prefill_len, greedy, top_k, use_top_p, eos_id, compact_rows=(),
              first_window=FIRST_WINDOW):
  """Greedy decoding or sampling with the model of `config` (static) holding `params` (traced)
  -> tokens `[batch, max_new_tokens]`. The loop's first `first_window` calls attend over a
  cache of that many steps (0: the whole cache), then it grows to full length (same tokens:
  the empty positions are masked)."""
  model = bind(config, params)  # free inside the trace
  n0, window, calls = windows(first_window, prompt.shape[1], max_new_tokens, prefill_len)
  logits, cache, inputs, t0 = start(model, inputs, prompt, prefill_len, max_new_tokens,
                                    cache_len=n0 + window)
  batch = prompt.shape[0]
  choose = functools.partial(_choose, temperature=temperature, top_p=top_p, greedy=greedy,
                             top_k=top_k, use_top_p=use_top_p, max_new_tokens=max_new_tokens,
                             min_new_tokens=min_new_tokens, eos_id=eos_id)
  # The rows' own inputs; one key for the whole batch draws differently for fewer rows.
  rows = _Rows(inputs, prompt, lengths, rng if _per_row(rng) else None)
  tok, out, done = choose(rows, rng, t0, logits, jnp.zeros((batch, max_new_tokens), jnp.int32),
                          jnp.zeros((batch,), jnp.bool_))
  state = (jnp.asarray(t0, jnp.int32), tok, cache, out, done)
  loop = functools.partial(_draw_loop, model, choose, rng, t0)
  sizes = compact_rows if greedy or _per_row(rng) else ()
  return window_then_whole(loop, rows, state, sizes, window, calls,
                           grow=lambda s: (*s[:2], s[2].grow(n0 + calls), *s[3:]),
                           done=lambda s: s[4], result=lambda s: s[3])


class _Rows(NamedTuple):
  """What a decoding loop reads per row (each `[batch, ...]`, or None)."""
  inputs: Array | None  # the source (its padding masks the cross-attention), or None
  prompt: Array
  lengths: Array
  rng: Array | None  # one key per row, or None (one key for the batch)


def _choose(rows, rng, t, logits, out, done, *, temperature, top_p, greedy, top_k, use_top_p,
            max_new_tokens, min_new_tokens, eos_id):
  """Picks (or force-feeds) the token at target index t -> (tok, out, done)."""
  forced, forced_tok = forced_tokens(rows.prompt, rows.lengths, t)
  key = _fold_in(rng if rows.rng is None else rows.rng, t)
  g = t - rows.lengths  # index among the generated tokens
  chosen = _select(logits, key, temperature, top_p, g < min_new_tokens, greedy=greedy,
                   top_k=top_k, use_top_p=use_top_p, eos_id=eos_id)
  tok = jnp.where(forced, forced_tok, chosen)
  write = (g >= 0) & ~done
  positions = jnp.arange(max_new_tokens)
  out = jnp.where((positions[None, :] == g[:, None]) & write[:, None], tok[:, None], out)
  finished = g >= max_new_tokens - 1
  if eos_id is not None:
    finished |= write & (tok == eos_id)
  return tok, out, done | finished


def _draw_loop(model, choose, rng, t0, rows, state, stop_at: int, calls: int):
  """Decoder steps until at most `stop_at` rows are unfinished or `calls` loop calls are done
  (the cache is full); state (t, tok, cache, out, done) of `rows`' batch."""
  adapter = adapter_of(model)

  def body(state):
    t, tok, cache, out, done = state
    logits, cache = adapter.decoder_step(model, cache.pin(), rows.inputs, tok[:, None])
    tok, out, done = choose(rows, rng, t + 1, logits[:, -1], out, done)
    return t + 1, tok, cache, out, done

  def cond(state):
    return (jnp.sum(~state[4]) > stop_at) & (state[0] - t0 < calls)

  return jax.lax.while_loop(cond, body, state)


def checked_min_new_tokens(value) -> np.int32:
  """The searches' `min_new_tokens`, checked, as a runtime scalar (one program for every value).
  """
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f'min_new_tokens must be an integer >= 0, got {value!r}')
  return np.int32(min(int(value), np.iinfo(np.int32).max))
