"""Decoding on the KV cache: greedy, sampling (temperature, top-k, top-p) and beam search, over
token ids (the strategy table, `autoregressive.strategies`, runs them on batches).

Every function runs the whole generation inside one jitted `lax.while_loop` that carries the
model's KV cache, a pytree (no per-token Python round trips, no recomputation of the
prefix), and stops early once every sequence of the batch has finished. Compiled
functions are cached by `jax.jit` (static: the model's config, and the shapes; the parameters
are a traced pure dict), so repeated calls with the same shapes do not recompile. The public
functions take the NNX model (or its `decode_loop.decoding_model` form, which callers that
decode many batches keep so as to split the module once).

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
generated.

Beam search (`autoregressive.beam_search`) keeps alive and finished beams with fairseq's selection
rule and the GNMT length penalty; beam size 1 is greedy decoding only at `alpha=0` (with a
penalty a beam of one may go on past an EOS). The loops share
`autoregressive.decode_loop`; what differs by model kind comes from its adapter (`model.kinds`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive import beam_search, program_cache
from autoregressive.decode_loop import (
  FIRST_WINDOW,
  NEG_INF,
  block_size,
  compact_sizes,
  decoding_model,
  forced_tokens,
  left_out,
  left_out_blocks,
  length_penalty,
  log_normalizer,
  prepare,
  prompt_lengths,
  start,
  window_then_whole,
  windows,
)
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, PAD_ID
from model.build import bind
from model.kinds import adapter_of

Array = jax.Array

__all__ = ['greedy_decode', 'sample', 'beam_search_decode', 'sequence_log_probs',
           'length_penalty']


# ----------------------------------------------------------------------------- greedy / sample

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
  """`jnp.argmax(x, axis=-1)` `[rows]` int32 of `x` `[rows, n]` (the first maximum; the first
  NaN if any), column `exclude` (e.g. pad) left out, and column `eos_id` in the rows where
  `eos_banned` `[rows]`, reading `x` once.

  A max over blocks of about `block` columns (`decode_loop.block_size`) picks the first block
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
def _generate(config, params, inputs, prompt, lengths, rng, temperature, top_p, min_new_tokens,
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
  loop = functools.partial(_generate_loop, model, choose, rng, t0)
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


def _generate_loop(model, choose, rng, t0, rows, state, stop_at: int, calls: int):
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


# The three searches share one argument order, `(module, inputs=None, *, prompt=None,
# max_new_tokens, ...)`: `inputs` is the model's input (an encoder-decoder's source; a
# decoder-only model, which has no source, takes it as its prompt) and `prompt` a forced prefix
# of what is generated (a decoder-only model's prompt, an encoder-decoder's target prefix).

def greedy_decode(module, inputs=None, *, prompt=None, max_new_tokens: int,
                  min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, eos_id: int | None = EOS_ID,
                  drop_finished: bool | int = True) -> Array:
  """Greedy decoding -> generated tokens `[batch, max_new_tokens]` (EOS kept, zeros after it).

  Args:
    module: an encoder-decoder or decoder-only NNX model (`model.build_model`; it holds its
      parameters), or its `decode_loop.decoding_model` form.
    inputs: encoder-decoder source tokens `[batch, src_len]`, right-padded with 0.
      A decoder-only model (no source) takes `inputs` as its prompt.
    prompt: decoder-only prompt `[batch, len]` right-padded with 0 (rows may differ in
      length); for an encoder-decoder, an optional forced target prefix.
    max_new_tokens: number of tokens to generate (prompt length + max_new_tokens must fit in
      the model's `config.max_len` positions).
    min_new_tokens: EOS cannot be chosen before this many generated tokens (1: no empty
      output; 0: EOS may come first).
    eos_id: the id that ends a sequence, or None (e.g. character vocabularies).
    drop_finished: once at most a quarter of the rows are unfinished, decode only those, and
      so on (`decode_loop.compact_sizes`: an int or a tuple sets the stages' rows; same
      tokens). False runs every row to the end of the batch.
  """
  config, params = decoding_model(module)
  inputs, prompt, lengths, prefill_len = prepare(config, inputs, prompt, max_new_tokens)
  return program_cache.call(_generate, config, params, inputs, prompt, lengths,
                            jax.random.PRNGKey(0), np.float32(1.0), np.float32(1.0),
                            _min_new_tokens(min_new_tokens), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, greedy=True, top_k=None, use_top_p=False,
                            eos_id=eos_id,
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished))


def sample(module, inputs=None, *, prompt=None, rng, max_new_tokens: int,
           min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, eos_id: int | None = EOS_ID,
           drop_finished: bool | int = True) -> Array:
  """Ancestral sampling -> generated tokens `[batch, max_new_tokens]` (EOS kept, zeros after it).

  `logits / temperature`, restricted to the `top_k` most likely tokens and/or the nucleus
  of probability `top_p`; `temperature=0` is greedy. `inputs`, `prompt`, `max_new_tokens`,
  `min_new_tokens`, `eos_id` as in `greedy_decode`. The same `rng` gives the same tokens.
  `rng` is one key, or one key per row (`[batch, 2]`, e.g. from `jax.random.split`): a row's
  tokens then depend only on its own key and inputs, not on the other rows of the batch or the
  batch size.
  `drop_finished` as in `greedy_decode` (it applies to greedy decoding and to keys per row: one
  key for the whole batch would draw differently for fewer rows).
  """
  config, params = decoding_model(module)
  if top_k is not None and top_k <= 0:
    top_k = None
  if top_k is not None:
    top_k = min(int(top_k), config.vocab_size)
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError(f'top_p must be in (0, 1], got {top_p}')
  if temperature < 0:
    raise ValueError(f'temperature must be >= 0, got {temperature}')
  inputs, prompt, lengths, prefill_len = prepare(config, inputs, prompt, max_new_tokens)
  greedy = temperature == 0
  return program_cache.call(_generate, config, params, inputs, prompt, lengths, rng,
                            np.float32(temperature if not greedy else 1.0),
                            np.float32(1.0 if top_p is None else top_p),
                            _min_new_tokens(min_new_tokens), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, greedy=greedy, top_k=top_k,
                            use_top_p=top_p is not None and top_p < 1.0, eos_id=eos_id,
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished))


# ----------------------------------------------------------------------------- beam search

def beam_search_decode(module, inputs=None, *, prompt=None, beam_size: int,
                       alpha: float, max_new_tokens: int,
                       min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, eos_id: int | None = EOS_ID,
                       reorder_cache: bool = False, drop_finished: bool | int = True,
                       nbest: int | None = None):
  """Beam search -> (tokens `[batch, beam, max_new_tokens]`, scores `[batch, beam]`), best first.

  `scores` are `sum log P(token) / ((5 + len) / 6) ** alpha` of each returned sequence
  (log-softmax of the model's logits over every token but pad: `decode_loop.log_normalizer`;
  `len` counts the EOS; a sequence that reaches
  `max_new_tokens` without EOS ends there). Tokens are zero after EOS. When fewer than
  `beam_size` distinct sequences exist (tiny vocabularies) the extra entries have score
  -inf and all-zero tokens. Arguments as in `greedy_decode` (`min_new_tokens`: no hypothesis
  ends before that many tokens). `reorder_cache=True` runs the
  reference implementation (one decoder row per hypothesis, caches reordered every step):
  same results, slower. `drop_finished` as in `greedy_decode` (sentences, not hypotheses).
  A sentence stops once its `nbest` (default `beam_size`) best cannot be overtaken; with
  `nbest=n` < beam_size the n best come sooner, and the entries after them are what was
  finished by then.
  """
  config, params = decoding_model(module)
  if not isinstance(beam_size, (int, np.integer)) or beam_size <= 0:
    raise ValueError(f'beam_size must be a positive integer, got {beam_size!r}')
  if nbest is not None and not 0 < nbest <= beam_size:
    raise ValueError(f'nbest must be in [1, beam_size={beam_size}], got {nbest!r}')
  inputs, prompt, lengths, prefill_len = prepare(config, inputs, prompt, max_new_tokens)
  return program_cache.call(beam_search.search, config, params, inputs, prompt, lengths,
                            np.float32(alpha), _min_new_tokens(min_new_tokens),
                            beam_size=int(beam_size), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, eos_id=eos_id,
                            reorder_cache=bool(reorder_cache),
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished),
                            nbest=None if nbest is None else int(nbest))


def _min_new_tokens(value) -> np.int32:
  """The searches' `min_new_tokens`, checked, as a runtime scalar (one program for every value).
  """
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f'min_new_tokens must be an integer >= 0, got {value!r}')
  return np.int32(min(int(value), np.iinfo(np.int32).max))


# ----------------------------------------------------------------------------- scoring

def sequence_log_probs(module, inputs=None, *, prompt=None, tokens) -> Array:
  """Full-forward-pass log P of candidate continuations `tokens` `[batch, n, len]` -> `[batch, n]`.

  Sums the log-softmax of the teacher-forced logits (over the tokens an output can hold:
  `decode_loop.log_normalizer`) up to and including the first EOS
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
  source = jnp.repeat(jnp.asarray(inputs, jnp.int32), n, axis=0) if adapter.has_source else None
  logits = adapter.teacher_forced(bind(config, params), source, jnp.asarray(full))
  logits = logits.astype(jnp.float32)
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_probs = logits - peak - log_normalizer(logits, peak)  # over the tokens an output can hold
  lp = jnp.take_along_axis(log_probs, full[..., None], -1)[..., 0]
  cols = np.repeat(lengths, n)[:, None] + np.arange(length)[None, :]
  lp = jnp.take_along_axis(lp, jnp.asarray(cols), axis=1)
  is_eos = flat == EOS_ID
  after_eos = np.cumsum(is_eos, axis=1) - is_eos > 0
  lp = jnp.where(after_eos, 0.0, lp)
  return lp.sum(axis=1).reshape(batch, n)
