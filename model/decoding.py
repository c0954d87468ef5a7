"""Decoding on the KV cache: greedy, sampling (temperature, top-k, top-p) and beam search.

Every function runs the whole generation inside one jitted `lax.while_loop` over the
model's `cache` collection (no per-token Python round trips, no recomputation of the
prefix) and stops early once every sequence of the batch has finished. Compiled
functions are cached by `jax.jit` (static: the module, which hashes by its config, and
the shapes), so repeated calls with the same shapes do not recompile.

Models:
  encoder-decoder  `inputs` `[batch, src_len]` (right-padded with 0) are encoded once;
                   the decoder starts from the start token 0. The encoder-decoder
                   attention keys/values are projected on the first step and cached.
  decoder-only     `prompt` `[batch, prompt_len]` (right-padded with 0; rows may have
                   different lengths, and a row may be empty). The decoder reads
                   `[0] + prompt` and continues the prompt. The common prefix (the
                   shortest prompt) is run in one prefill call; the rest of each longer
                   prompt is force-fed token by token inside the loop, so every row keeps
                   its true absolute positions (no left padding).
  An encoder-decoder model also accepts a `prompt`: a forced target prefix.

Outputs hold the generated tokens only (not the prompt), `[..., max_len]`; a
sequence that emits EOS (id 1 by default; `eos_id=None` for vocabularies without
one, e.g. characters) keeps the EOS and has zeros after it. The pad id 0 is never
generated.

Beam search keeps alive and finished beams (the Flax-WMT/t5x layout) with fairseq's
selection rule: each step extends the `beam_size` (k) alive hypotheses and takes the
best 2k candidates by log-probability; those among the best k that end (EOS, or
`max_len` reached) join the finished set, scored `log P(y) / lp(y)` with the GNMT
penalty `lp(y) = ((5 + |y|) / 6) ** alpha` (|y| counts the EOS); the best k that did
not end stay alive. A batch row is done once it has k finished hypotheses (so beam
size 1 is exactly greedy decoding), and the loop stops when every row is done.
Only the self-attention key/value caches are reordered by beam; the cached
encoder-decoder keys/values are the same for every beam of a sentence.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from model import transformer

Array = jax.Array

PAD_ID = 0
EOS_ID = 1
NEG_INF = -np.inf

# Cache leaves that hold one row per hypothesis and follow the beams (see layers.py).
_BEAM_CACHE_LEAVES = ('cached_key', 'cached_value')


# ----------------------------------------------------------------------------- helpers

def length_penalty(length: Array, alpha: float) -> Array:
  """GNMT length penalty `((5 + length) / 6) ** alpha`."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _unwrap_params(params):
  """Accepts the params tree or the variables dict `{'params': tree}`."""
  if isinstance(params, dict) or hasattr(params, 'keys'):
    keys = set(params.keys())
    if keys == {'params'}:
      return params['params']
  return params


def _decoding_model(module, params):
  """(module, params) to decode with: a `scan_layers` model runs unrolled, so that every
  layer has its own KV cache (same weights, same results). Callers that decode many batches
  with one set of weights unroll once (`transformer.unrolled`); this is then a no-op."""
  return transformer.unrolled(module, _unwrap_params(params))


def _kind(module) -> str:
  return module.config.kind


def _prompt_lengths(prompt):
  """Per-row length of a right-padded prompt: the index of the last non-pad token + 1."""
  xp = np if isinstance(prompt, np.ndarray) else jnp
  width = prompt.shape[1]
  if width == 0:
    return xp.zeros((prompt.shape[0],), xp.int32)
  cols = xp.arange(1, width + 1)[None, :]
  return xp.max(xp.where(prompt != PAD_ID, cols, 0), axis=1).astype(xp.int32)


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _prepare(module, inputs, prompt, max_len: int):
  """Validates and normalises the arguments -> (inputs, prompt, lengths, prefill_len).

  Works on host or device arrays, and on tracers (when the caller jits around us); the
  prefill length (a static shape) needs concrete prompt values, else it is 0.
  """
  kind = _kind(module)
  cfg = module.config
  if kind == 'encoder_only':
    raise ValueError('decoding needs a decoder: this is an encoder_only model')
  if not isinstance(max_len, (int, np.integer)) or max_len <= 0:
    raise ValueError(f'max_len must be a positive integer, got {max_len!r}')
  if kind == 'decoder_only':
    if prompt is None:
      prompt, inputs = inputs, None
    if inputs is not None:
      raise ValueError('a decoder_only model takes a `prompt`, not `inputs`')
    if prompt is None:
      raise ValueError('a decoder_only model needs a `prompt` `[batch, len]` (it may have length 0)')
  else:
    if inputs is None:
      raise ValueError('an encoder_decoder model needs `inputs` `[batch, src_len]`')
    if not hasattr(inputs, 'shape'):
      inputs = np.asarray(inputs)
    if inputs.ndim != 2:
      raise ValueError(f'inputs must be [batch, src_len], got shape {inputs.shape}')
    if inputs.shape[1] > cfg.max_len and cfg.positional_encoding != 'rope':
      raise ValueError(f'inputs have length {inputs.shape[1]} > the model\'s max_len '
                       f'{cfg.max_len}; truncate them')
    if prompt is None:
      prompt = np.zeros((inputs.shape[0], 0), np.int32)
  if not hasattr(prompt, 'shape'):
    prompt = np.asarray(prompt)
  if prompt.ndim != 2:
    raise ValueError(f'prompt must be [batch, len], got shape {prompt.shape}')
  if inputs is not None and inputs.shape[0] != prompt.shape[0]:
    raise ValueError(f'inputs batch {inputs.shape[0]} != prompt batch {prompt.shape[0]}')
  if prompt.shape[1] + max_len > cfg.max_len and cfg.positional_encoding != 'rope':
    raise ValueError(
        f'prompt length {prompt.shape[1]} + max_len {max_len} = {prompt.shape[1] + max_len} '
        f'positions > the model\'s max_len {cfg.max_len}')
  prefill_len = 0
  if prompt.shape[1] and _is_concrete(prompt):
    prefill_len = int(_prompt_lengths(np.asarray(prompt)).min())
  prompt = jnp.asarray(prompt, jnp.int32)
  if inputs is not None:
    inputs = jnp.asarray(inputs, jnp.int32)
  return inputs, prompt, _prompt_lengths(prompt), prefill_len


def _encode(module, params, inputs):
  if inputs is None:
    return None
  return module.apply({'params': params}, inputs, method=module.encode)


def _init_cache(module, params, encoded, inputs, batch: int, cache_len: int):
  """Zero cache for `batch` rows and `cache_len` positions (shapes only: no init compute)."""
  dummy = jnp.zeros((batch, cache_len), jnp.int32)
  rng = jax.random.PRNGKey(0)
  if encoded is None:
    fn = lambda: module.init(rng, dummy, decode=True)
  else:
    fn = lambda: module.init(rng, encoded, inputs, dummy, decode=True, method=module.decode)
  shapes = jax.eval_shape(fn)['cache']
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _decoder_step(module, params, cache, encoded, inputs, tokens, positions=None, mask=None):
  """tokens `[batch, n]` (decoder inputs) -> (logits `[batch, n, vocab]` float32, cache).

  `positions` `[batch, n]` and `mask` `[batch, 1, n, cache_len]` (see `Decoder`) are only
  given by the beam search, whose n queries of a row are a sentence's hypotheses.
  """
  variables = {'params': params, 'cache': cache}
  if encoded is None:
    logits, state = module.apply(variables, tokens, positions=positions, decode=True,
                                 decode_mask=mask, mutable=['cache'])
  else:
    logits, state = module.apply(variables, encoded, inputs, tokens, targets_position=positions,
                                 decode=True, decode_mask=mask, method=module.decode,
                                 mutable=['cache'])
  return logits.astype(jnp.float32), state['cache']


def _start(module, params, inputs, prompt, prefill_len, max_len, batch_repeat=1,
           cache_len=None):
  """Encodes, makes the cache and runs the first decoder call, outside the loop.

  The decoder reads `[0] + prompt`; the first call feeds the start token and the prompt
  prefix that every row shares in length (`prefill_len` tokens: one call, not one per
  token); longer prompts are force-fed inside the loop. (The first call also projects the
  encoder keys/values into the cache, which changes its structure: it cannot be a loop
  step.) With `batch_repeat=k` every row is repeated k times (beam search), after encoding.
  `cache_len` defaults to one cache position per decoder input.
  Returns (logits `[batch*k, vocab]` predicting target index t, cache, encoded, inputs, t).
  """
  encoded = _encode(module, params, inputs)
  batch = prompt.shape[0]
  if batch_repeat > 1:
    rep = lambda x: None if x is None else jnp.repeat(x, batch_repeat, axis=0)
    encoded, inputs = rep(encoded), rep(inputs)
  if cache_len is None:
    cache_len = prompt.shape[1] + max_len
  cache = _init_cache(module, params, encoded, inputs, batch * batch_repeat, cache_len)
  first = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), prompt[:, :prefill_len]], axis=1)
  if batch_repeat > 1:
    first = jnp.repeat(first, batch_repeat, axis=0)
  logits, cache = _decoder_step(module, params, cache, encoded, inputs, first)
  return logits[:, -1], cache, encoded, inputs, prefill_len


def _pin(cache):
  """Keeps XLA from hoisting views of the loop-invariant cross-attention cache out of the loop.

  The encoder keys/values do not change inside the decoding loop, so XLA's loop-invariant
  code motion moves their heads-major -> `[batch, len, heads, head_dim]` view (a transpose)
  out of the loop and then has to transpose them back, physically, at every step for the
  attention matmuls. An optimization barrier on them at the top of the loop body stops that.
  """
  def pin(path, x):
    name = getattr(path[-1], 'key', None)
    return jax.lax.optimization_barrier(x) if name in ('cross_key', 'cross_value') else x
  return jax.tree_util.tree_map_with_path(pin, cache)


def _forced_tokens(prompt, lengths, t):
  """(forced `[batch]` bool, the prompt token at target index t `[batch]`)."""
  forced = t < lengths
  if prompt.shape[1] == 0:
    return forced, jnp.zeros_like(lengths)
  return forced, prompt[:, jnp.minimum(t, prompt.shape[1] - 1)]


# ----------------------------------------------------------------------------- greedy / sample

def _select(logits, rng, temperature, top_p, *, greedy: bool, top_k: int | None,
            use_top_p: bool):
  """Next token `[batch]` from logits `[batch, vocab]` (pad excluded)."""
  logits = logits.at[:, PAD_ID].set(NEG_INF)
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if use_top_p:
    # Nucleus: the smallest set of most likely tokens whose probability reaches top_p.
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly better tokens
    keep = before < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=('module', 'max_len', 'prefill_len', 'greedy',
                                             'top_k', 'use_top_p', 'eos_id'))
def _generate(module, params, inputs, prompt, lengths, rng, temperature, top_p, *,
              max_len, prefill_len, greedy, top_k, use_top_p, eos_id):
  logits, cache, encoded, inputs, t0 = _start(module, params, inputs, prompt, prefill_len,
                                              max_len)
  batch = prompt.shape[0]
  positions = jnp.arange(max_len)

  def choose(t, logits, out, done):
    """Picks (or force-feeds) the token at target index t."""
    forced, forced_tok = _forced_tokens(prompt, lengths, t)
    chosen = _select(logits, jax.random.fold_in(rng, t), temperature, top_p, greedy=greedy,
                     top_k=top_k, use_top_p=use_top_p)
    tok = jnp.where(forced, forced_tok, chosen)
    g = t - lengths  # index among the generated tokens
    write = (g >= 0) & ~done
    out = jnp.where((positions[None, :] == g[:, None]) & write[:, None], tok[:, None], out)
    finished = g >= max_len - 1
    if eos_id is not None:
      finished |= write & (tok == eos_id)
    return tok, out, done | finished

  tok, out, done = choose(t0, logits, jnp.zeros((batch, max_len), jnp.int32),
                          jnp.zeros((batch,), jnp.bool_))

  def cond(state):
    return ~jnp.all(state[4])

  def body(state):
    t, tok, cache, out, done = state
    logits, cache = _decoder_step(module, params, _pin(cache), encoded, inputs, tok[:, None])
    tok, out, done = choose(t + 1, logits[:, -1], out, done)
    return t + 1, tok, cache, out, done

  state = (jnp.asarray(t0, jnp.int32), tok, cache, out, done)
  return jax.lax.while_loop(cond, body, state)[3]


def greedy_decode(module, params, inputs=None, *, prompt=None, max_len: int,
                  eos_id: int | None = EOS_ID) -> Array:
  """Greedy decoding -> generated tokens `[batch, max_len]` (EOS kept, zeros after it).

  Args:
    module: an encoder-decoder or decoder-only model from `model.build_model`.
    params: its parameters (the tree, or `{'params': tree}`).
    inputs: encoder-decoder source tokens `[batch, src_len]`, right-padded with 0.
      For a decoder-only model, a positional `inputs` is taken as the prompt.
    prompt: decoder-only prompt `[batch, len]` right-padded with 0 (rows may differ in
      length); for an encoder-decoder, an optional forced target prefix.
    max_len: number of tokens to generate (prompt length + max_len must fit in the
      model's `max_len` positions).
    eos_id: the id that ends a sequence, or None (e.g. character vocabularies).
  """
  module, params = _decoding_model(module, params)
  inputs, prompt, lengths, prefill_len = _prepare(module, inputs, prompt, max_len)
  return _generate(module, params, inputs, prompt, lengths, jax.random.PRNGKey(0),
                   jnp.float32(1.0), jnp.float32(1.0), max_len=max_len,
                   prefill_len=prefill_len, greedy=True, top_k=None, use_top_p=False,
                   eos_id=eos_id)


def sample(module, params, prompt=None, *, inputs=None, rng, max_len: int,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           eos_id: int | None = EOS_ID) -> Array:
  """Ancestral sampling -> generated tokens `[batch, max_len]` (EOS kept, zeros after it).

  `logits / temperature`, restricted to the `top_k` most likely tokens and/or the nucleus
  of probability `top_p`; `temperature=0` is greedy. For an encoder-decoder model give
  the source as `inputs` (a positional argument is taken as the source when `inputs` is
  None). The same `rng` gives the same tokens.
  """
  module, params = _decoding_model(module, params)
  if _kind(module) == 'encoder_decoder' and inputs is None:
    inputs, prompt = prompt, None
  if top_k is not None and top_k <= 0:
    top_k = None
  if top_k is not None:
    top_k = min(int(top_k), module.config.vocab_size)
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError(f'top_p must be in (0, 1], got {top_p}')
  if temperature < 0:
    raise ValueError(f'temperature must be >= 0, got {temperature}')
  inputs, prompt, lengths, prefill_len = _prepare(module, inputs, prompt, max_len)
  greedy = temperature == 0
  return _generate(module, params, inputs, prompt, lengths, rng,
                   jnp.float32(temperature if not greedy else 1.0),
                   jnp.float32(1.0 if top_p is None else top_p), max_len=max_len,
                   prefill_len=prefill_len, greedy=greedy, top_k=top_k,
                   use_top_p=top_p is not None and top_p < 1.0, eos_id=eos_id)


# ----------------------------------------------------------------------------- beam search

def _top_k(x, k: int, block: int = 128):
  """`lax.top_k` over the last axis of `x` `[rows, n]`, reading most of `x` only once.

  The k largest values lie in the k blocks (of `block` columns) with the largest maxima, so a
  max-reduction over blocks, a top-k over the block maxima and a top-k over the gathered
  k blocks replace a top-k over all n (XLA's CPU TopK costs ~10x a reduction per element).
  """
  rows, n = x.shape
  if n % block or n // block <= k:
    return jax.lax.top_k(x, k)
  blocks = x.reshape(rows, n // block, block)
  _, best = jax.lax.top_k(jnp.max(blocks, axis=-1), k)  # [rows, k] block ids
  best = jnp.sort(best, axis=-1)  # keeps ties in index order, as lax.top_k
  candidates = jnp.take_along_axis(blocks, best[:, :, None], axis=1).reshape(rows, k * block)
  values, idx = jax.lax.top_k(candidates, k)
  columns = (best[:, :, None] * block + jnp.arange(block)).reshape(rows, k * block)
  return values, jnp.take_along_axis(columns, idx, axis=1)


def _gather_beams(tree, batch_index):
  """Reorders the per-hypothesis cache leaves by `batch_index` `[batch * beam]`."""
  def gather(path, x):
    name = getattr(path[-1], 'key', None)
    if name in _BEAM_CACHE_LEAVES:
      return x.at[batch_index].get(mode='promise_in_bounds')
    return x
  return jax.tree_util.tree_map_with_path(gather, tree)


@functools.partial(jax.jit, static_argnames=('module', 'beam_size', 'max_len', 'prefill_len',
                                             'eos_id', 'reorder_cache'))
def _beam_search(module, params, inputs, prompt, lengths, alpha, *, beam_size, max_len,
                 prefill_len, eos_id, reorder_cache=False):
  """Beam search on one of two cache layouts (same results; see `_slot_search`)."""
  k = beam_size
  batch = prompt.shape[0]
  positions = jnp.arange(max_len)
  rows = jnp.arange(batch)[:, None]

  def step(t, logits, alive_seq, alive_lp, fin_seq, fin_score, was_done):
    """One extension of every alive beam -> the new beams and the next decoder inputs.

    `logits` `[batch, k, vocab]` (or `[batch, 1, vocab]` when every beam has the same
    prefix) predict target index t. Rows that were already done keep their finished
    hypotheses (a row's result does not depend on how long the other rows of its batch run).
    """
    old_fin_seq, old_fin_score = fin_seq, fin_score
    lp = jax.nn.log_softmax(logits)
    vocab = lp.shape[-1]
    lp = lp.at[:, :, PAD_ID].set(NEG_INF)
    forced, forced_tok = _forced_tokens(prompt, lengths, t)
    if prompt.shape[1]:
      onehot = jnp.arange(vocab)[None, :] == forced_tok[:, None]
      forced_lp = jnp.where(onehot, 0.0, NEG_INF)[:, None, :]
      lp = jnp.where(forced[:, None, None], forced_lp, lp)
    cand = (alive_lp[:, :, None] + lp).reshape(batch, k * vocab)
    top_lp, top_idx = _top_k(cand, 2 * k)  # [batch, 2k]
    beam, tok = top_idx // vocab, top_idx % vocab
    g = t - lengths  # [batch]
    seq = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1)
    seq = jnp.where(positions[None, None, :] == g[:, None, None], tok[:, :, None], seq)
    at_end = (g >= max_len - 1)[:, None]
    ends = at_end & ~forced[:, None]
    if eos_id is not None:
      ends |= (tok == eos_id) & ~forced[:, None]
    # As in fairseq, a hypothesis that ends is finished only when it is among the best
    # `k` candidates of this step (so beam size 1 is greedy decoding).
    finishing = ends & (jnp.arange(2 * k) < k)[None, :]
    # Finished: merge the new ones into the best k so far.
    new_score = jnp.where(finishing, top_lp / length_penalty(g + 1, alpha)[:, None], NEG_INF)
    all_score = jnp.concatenate([fin_score, new_score], axis=1)
    all_seq = jnp.concatenate([fin_seq, seq], axis=1)
    fin_score, idx = jax.lax.top_k(all_score, k)
    fin_seq = all_seq[rows, idx]
    fin_score = jnp.where(was_done[:, None], old_fin_score, fin_score)
    fin_seq = jnp.where(was_done[:, None, None], old_fin_seq, fin_seq)
    # Alive: the best k candidates that did not end.
    alive_lp, idx = jax.lax.top_k(jnp.where(ends, NEG_INF, top_lp), k)
    alive_seq = seq[rows, idx]
    origin = beam[rows, idx]  # [batch, k] index of the parent beam
    next_tok = tok[rows, idx]  # [batch, k]
    # A row is done with k finished hypotheses, or nothing left alive, or at max_len.
    done = ((g >= max_len - 1) | jnp.isfinite(fin_score[:, -1]) |
            ~jnp.isfinite(alive_lp[:, 0]))
    done &= ~(t + 1 < lengths)
    done |= was_done
    return alive_seq, alive_lp, fin_seq, fin_score, origin, next_tok, done

  beams = (jnp.zeros((batch, k, max_len), jnp.int32),  # alive_seq
           jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
           jnp.zeros((batch, k, max_len), jnp.int32),  # fin_seq
           jnp.full((batch, k), NEG_INF, jnp.float32),  # fin_score
           jnp.zeros((batch,), jnp.bool_))  # done
  search = _reordered_search if reorder_cache else _slot_search
  fin_seq, fin_score = search(module, params, inputs, prompt, prefill_len, max_len, k, step,
                              beams)
  fin_seq = jnp.where(jnp.isfinite(fin_score)[:, :, None], fin_seq, 0)
  return fin_seq, fin_score


def _slot_search(module, params, inputs, prompt, prefill_len, max_len, k, step, beams):
  """The decoder runs a sentence's k hypotheses as k queries of one batch row (`[batch, k]`).

  The self-attention cache of a row holds the keys/values of all its hypotheses: the first
  call writes the shared prefix (start token and prompt prefix, `n0` positions), and loop
  call i writes hypothesis j's new key at `n0 + k * i + j`. Instead of reordering the caches
  by parent beam at every step (a gather of every self-attention cache, ~15% of the time),
  `visible` `[batch, k, cache_len]` marks the positions holding each hypothesis' ancestors,
  and the attention mask shows each query only those. Reordering `visible` is a gather of
  booleans. The encoder keys/values are also kept once per sentence, not once per beam,
  and the first call (all beams equal) runs one row per sentence.
  """
  batch = prompt.shape[0]
  n0 = 1 + prefill_len
  calls = prompt.shape[1] + max_len - n0  # the most decoder calls the loop makes
  cache_len = n0 + k * calls
  logits, cache, encoded, inputs, t0 = _start(module, params, inputs, prompt, prefill_len,
                                              max_len, cache_len=cache_len)
  beams = step(t0, logits[:, None], *beams[:4], beams[4])
  visible = jnp.broadcast_to(jnp.arange(cache_len) < n0, (batch, k, cache_len))

  def cond(state):
    return ~jnp.all(state[3][-1])

  def body(state):
    t, cache, visible, (alive_seq, alive_lp, fin_seq, fin_score, _, tok, done) = state
    own = jnp.arange(cache_len)[None, :] == (n0 + k * (t - t0) + jnp.arange(k))[:, None]
    mask = visible | own  # [batch, k, cache_len]
    # Every hypothesis' new token is at target index t + 1 (decoder position t + 1).
    logits, cache = _decoder_step(module, params, _pin(cache), encoded, inputs, tok,
                                  positions=jnp.full((batch, k), t + 1), mask=mask[:, None])
    beams = step(t + 1, logits, alive_seq, alive_lp, fin_seq, fin_score, done)
    visible = jnp.take_along_axis(mask, beams[4][:, :, None], axis=1)  # the parents' view
    return t + 1, cache, visible, beams

  state = (jnp.asarray(t0, jnp.int32), cache, visible, beams)
  beams = jax.lax.while_loop(cond, body, state)[3]
  return beams[2], beams[3]


def _reordered_search(module, params, inputs, prompt, prefill_len, max_len, k, step, beams):
  """Reference layout: one decoder row per hypothesis, caches reordered by parent every step."""
  batch = prompt.shape[0]
  rows = jnp.arange(batch)[:, None]
  logits, cache, encoded, inputs, t0 = _start(module, params, inputs, prompt, prefill_len,
                                              max_len, batch_repeat=k)
  beams = step(t0, logits.reshape(batch, k, -1), *beams[:4], beams[4])

  def reorder(cache, origin):
    return _gather_beams(cache, (rows * k + origin).reshape(-1))

  cache = reorder(cache, beams[4])

  def cond(state):
    return ~jnp.all(state[2][-1])

  def body(state):
    t, cache, (alive_seq, alive_lp, fin_seq, fin_score, _, tok, done) = state
    logits, cache = _decoder_step(module, params, _pin(cache), encoded, inputs,
                                  tok.reshape(-1, 1))
    beams = step(t + 1, logits.reshape(batch, k, -1), alive_seq, alive_lp, fin_seq, fin_score,
                 done)
    # Reordering here (not at the start of the next step) lets the decoder's cache update
    # happen in place on the loop's buffers.
    return t + 1, reorder(cache, beams[4]), beams

  def body_twice(state):
    # Two steps per iteration: the beam reorder cannot permute the cache in place, so one
    # step per iteration would copy every reordered cache back into the loop's buffer;
    # alternating between two buffers avoids that. A step after every row is done changes
    # nothing (done rows are frozen).
    return body(body(state))

  state = (jnp.asarray(t0, jnp.int32), cache, beams)
  beams = jax.lax.while_loop(cond, body_twice, state)[2]
  return beams[2], beams[3]


def beam_search_decode(module, params, inputs=None, *, beam_size: int, alpha: float,
                       max_len: int, prompt=None, eos_id: int | None = EOS_ID,
                       reorder_cache: bool = False):
  """Beam search -> (tokens `[batch, beam, max_len]`, scores `[batch, beam]`), best first.

  `scores` are `sum log P(token) / ((5 + len) / 6) ** alpha` of each returned sequence
  (log-softmax of the model's logits; `len` counts the EOS; a sequence that reaches
  `max_len` without EOS ends there). Tokens are zero after EOS. When fewer than
  `beam_size` distinct sequences exist (tiny vocabularies) the extra entries have score
  -inf and all-zero tokens. Arguments as in `greedy_decode`. `reorder_cache=True` runs the
  reference implementation (one decoder row per hypothesis, caches reordered every step):
  same results, slower.
  """
  module, params = _decoding_model(module, params)
  if not isinstance(beam_size, (int, np.integer)) or beam_size <= 0:
    raise ValueError(f'beam_size must be a positive integer, got {beam_size!r}')
  inputs, prompt, lengths, prefill_len = _prepare(module, inputs, prompt, max_len)
  return _beam_search(module, params, inputs, prompt, lengths, jnp.float32(alpha),
                      beam_size=int(beam_size), max_len=max_len, prefill_len=prefill_len,
                      eos_id=eos_id, reorder_cache=bool(reorder_cache))


# ----------------------------------------------------------------------------- scoring

def sequence_log_probs(module, params, inputs=None, *, prompt=None, tokens) -> Array:
  """Full-forward-pass log P of candidate continuations `tokens` `[batch, n, len]` -> `[batch, n]`.

  Sums the log-softmax of the teacher-forced logits up to and including the first EOS
  (all tokens when there is none); the zeros after EOS are ignored. For a decoder-only
  model the tokens continue each row's `prompt`. For tests and rescoring.
  """
  module, params = _decoding_model(module, params)
  tokens = np.asarray(tokens, np.int32)
  batch, n, length = tokens.shape
  flat = tokens.reshape(batch * n, length)
  if _kind(module) == 'decoder_only':
    prompt = np.asarray(prompt, np.int32).reshape(batch, -1)
    lengths = _prompt_lengths(prompt)
    full = np.zeros((batch * n, prompt.shape[1] + length), np.int32)
    for r in range(batch * n):
      b = r // n
      full[r, :lengths[b]] = prompt[b, :lengths[b]]
      full[r, lengths[b]:lengths[b] + length] = flat[r]
    logits = module.apply({'params': params}, jnp.asarray(full))
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), full[..., None], -1)[..., 0]
    cols = np.repeat(lengths, n)[:, None] + np.arange(length)[None, :]
    lp = jnp.take_along_axis(lp, jnp.asarray(cols), axis=1)
  else:
    src = jnp.repeat(jnp.asarray(inputs, jnp.int32), n, axis=0)
    logits = module.apply({'params': params}, src, jnp.asarray(flat))
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), flat[..., None], -1)[..., 0]
  is_eos = flat == EOS_ID
  after_eos = np.cumsum(is_eos, axis=1) - is_eos > 0
  lp = jnp.where(after_eos, 0.0, lp)
  return lp.sum(axis=1).reshape(batch, n)
