"""Beam search on the KV cache: `beam_search_decode` (token ids), the search itself, and the
strategy table's row `BeamSearch`.

Alive and finished beams are kept apart (the Flax-WMT/t5x layout) with fairseq's (and
CTranslate2's) selection rule: each step extends the `beam_size` (k) alive hypotheses and takes
the best 2k candidates by log-probability; those among the best k that end (EOS, or
`max_new_tokens` reached) join the finished set, scored `log P(y) / lp(y)` with the GNMT
penalty `lp(y) = ((5 + |y|) / 6) ** alpha` (|y| counts the EOS); the best k that did not end
stay alive, so a finished hypothesis never costs an alive slot. EOS cannot end a hypothesis
before `min_new_tokens` generated tokens (1: no empty output, the "empty translation" that
often scores best under a translation model, Stahlberg & Byrne 2019).

A row is done once its n best (`nbest`, default k) cannot be overtaken: no alive hypothesis
can score above the n-th finished one, whatever it adds (log-probabilities only fall; the
penalty is monotonic in the length: `best_reachable`). This is t5x's and Flax's stopping rule;
fairseq stops at k finished hypotheses, and CTranslate2 does too when a length penalty is set,
which loses the longer hypotheses the penalty favours. With `alpha=0` it is CTranslate2's
rule (a sentence ends when its best candidate ends) and beam size 1 is greedy decoding; with
`alpha > 0` a beam of 1 may go on past an EOS, so greedy decoding is `greedy_decode`.

Two cache layouts give the same results: `_slot_search` (the default: a sentence's k
hypotheses are k queries of one decoder row, an ancestry mask instead of cache reordering)
and `_reordered_search` (the reference: one row per hypothesis, caches reordered each step).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive import program_cache
from autoregressive.decodable import decoding_model
from autoregressive.strategies.base import NBEST_MAX, Limits, Strategy, setting
from autoregressive.strategies.loop import (
  FIRST_WINDOW,
  NEG_INF,
  block_size,
  checked_min_new_tokens,
  compact_sizes,
  forced_tokens,
  left_out,
  left_out_blocks,
  length_penalty,
  log_normalizer,
  prepare,
  start,
  window_then_whole,
  windows,
)
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, PAD_ID
from model.build import bind
from model.kinds import adapter_of

Array = jax.Array

ALPHA_MAX = 10.0  # the length penalty ((5 + len) / 6) ** alpha stays finite in float32
BEAM_SIZE_MAX = NBEST_MAX
# One program for the penalties (as eager jnp ops, each op compiled in every new process).
_length_penalty = jax.jit(length_penalty, static_argnums=1)


@dataclasses.dataclass(frozen=True)
class BeamSearch(Strategy):
  NAME = 'beam'
  HELP = 'the beam_size best prefixes at every step, ranked with a length penalty'
  beam_size: int = setting(4, 'beams (1 = greedy decoding)', low=1, high=BEAM_SIZE_MAX)
  alpha: float = setting(0.6, 'length penalty ((5 + len) / 6) ** alpha (GNMT; the paper: 0.6)',
                         low=0.0, high=ALPHA_MAX)

  def check_nbest(self, nbest: int, where: str) -> None:
    if nbest > self.beam_size:
      raise ValueError(f'{where}={nbest} is more than the beam size {self.beam_size}')

  def describe(self) -> str:
    return f'beam {self.beam_size}, alpha {self.alpha}'

  def program_key(self) -> tuple:
    return (self.beam_size,)

  def search(self, module, inputs=None, *, prompt=None, limits=None, eos_id=EOS_ID,
             line_ids=None, scores=True, drop_finished=True):
    del line_ids, scores  # no random draws; the search's own scores
    limits = limits or Limits()
    tokens, found = beam_search_decode(
        module, inputs, prompt=prompt, beam_size=self.beam_size, alpha=self.alpha,
        max_new_tokens=limits.max_new_tokens, min_new_tokens=limits.min_new_tokens,
        eos_id=eos_id, drop_finished=drop_finished, nbest=limits.nbest)
    return np.asarray(tokens)[:, :limits.nbest], np.asarray(found)[:, :limits.nbest]

  def log_probs(self, scores, lengths):
    # score = log P / penalty; one call for the batch (one per sentence took ~5% of a pass).
    return scores * np.asarray(_length_penalty(lengths, self.alpha))


def beam_search_decode(module, inputs=None, *, prompt=None, beam_size: int,
                       alpha: float, max_new_tokens: int,
                       min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, eos_id: int | None = EOS_ID,
                       reorder_cache: bool = False, drop_finished: bool | int = True,
                       nbest: int | None = None):
  """Beam search -> (tokens `[batch, beam, max_new_tokens]`, scores `[batch, beam]`), best first.

  `scores` are `sum log P(token) / ((5 + len) / 6) ** alpha` of each returned sequence
  (log-softmax of the model's logits over every token but pad: `loop.log_normalizer`;
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
  return program_cache.call(search, config, params, inputs, prompt, lengths,
                            np.float32(alpha), checked_min_new_tokens(min_new_tokens),
                            beam_size=int(beam_size), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, eos_id=eos_id,
                            reorder_cache=bool(reorder_cache),
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished),
                            nbest=None if nbest is None else int(nbest))


# ----------------------------------------------------------------------------- the search

class Beams(NamedTuple):
  """The search state of a batch of sentences, k hypotheses each."""
  alive_seq: Array  # [batch, k, max_new_tokens] generated tokens of the alive hypotheses
  alive_lp: Array  # [batch, k] their log-probabilities (-inf: empty slot)
  fin_seq: Array  # [batch, k, max_new_tokens] finished hypotheses, best first
  fin_score: Array  # [batch, k] their length-penalised scores (-inf: empty slot)
  origin: Array  # [batch, k] each alive hypothesis' parent among the previous alive ones
  next_tok: Array  # [batch, k] each alive hypothesis' newest token (the next decoder input)
  done: Array  # [batch] bool: the sentence's result is final

  @classmethod
  def initial(cls, batch: int, k: int, max_new_tokens: int) -> Beams:
    tokens = jnp.zeros((batch, k, max_new_tokens), jnp.int32)
    return cls(alive_seq=tokens,
               alive_lp=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32),
                                 (batch, 1)),
               fin_seq=tokens, fin_score=jnp.full((batch, k), NEG_INF, jnp.float32),
               origin=jnp.zeros((batch, k), jnp.int32),
               next_tok=jnp.zeros((batch, k), jnp.int32), done=jnp.zeros((batch,), jnp.bool_))


def best_extensions(logits, alive_lp, n: int, block: int = 32, *, eos_banned=None,
                    eos_id: int | None = EOS_ID):
  """The n most likely one-token extensions of a sentence's beams -> (log-probabilities,
  beams, tokens), each `[batch, n]`, best first, pad excluded, and EOS too in the rows where
  `eos_banned` `[batch]` (`NEG_INF` entries fill in when fewer exist).

  logits `[batch, b, vocab]` (b = k beams, or 1 while they share their prefix), alive_lp
  `[batch, k]`. An extension's log-probability `alive_lp + (x - max) - log_normalizer`
  (`jax.nn.log_softmax`'s arithmetic over every token but pad; a banned EOS keeps its share
  of the probability, as in fairseq, so a score stays the model's log-probability) only grows
  with its logit x within a beam, so the n best lie in the n blocks (of about `block` tokens:
  `block_size`) whose best allowed tokens score highest over all beams. Two top-ks, over the
  `[batch, b * vocab / block]` block scores and the `[batch, n * block]` tokens of the chosen
  blocks, replace one per beam over its vocabulary (XLA's CPU TopK costs ~10x a reduction per
  element), and the log-softmax of the whole vocabulary is never written. Exactly `lax.top_k`
  over all allowed `[batch, b * vocab]` extensions, ties included (to the lower beam, then
  token): a block ranks as its best allowed token, and blocks do not overlap.
  """
  batch, b, vocab = logits.shape
  size = block_size(vocab, block)
  blocks = logits.reshape(batch, b, vocab // size, size)
  excluded = functools.partial(left_out, exclude=PAD_ID, eos_banned=eos_banned, eos_id=eos_id)
  maxima = jnp.max(blocks, axis=-1)
  for j in left_out_blocks(size, PAD_ID, eos_banned, eos_id):  # their maxima, recomputed
    cols = (j * size + jnp.arange(size))[None, None, :]
    maxima = maxima.at[:, :, j].set(
        jnp.max(jnp.where(excluded(cols), NEG_INF, blocks[:, :, j]), axis=-1))
  # The maximum over the tokens that can be output, from the block maxima (written so, XLA
  # would reread the logits for it): pad is not one of them, a banned EOS is.
  peak = jnp.max(maxima, axis=-1)
  if eos_banned is not None and eos_id is not None:
    peak = jnp.maximum(peak, logits[:, :, eos_id])
  peak = peak[:, :, None]  # [batch, b, 1]
  log_sum = log_normalizer(logits, peak)
  alive_lp = alive_lp[:, :b, None]
  scores = (alive_lp + ((maxima - peak) - log_sum)).reshape(batch, -1)  # [batch, b * blocks]
  _, chosen = jax.lax.top_k(scores, min(n, scores.shape[1]))
  chosen = jnp.sort(chosen, axis=-1)  # candidates in (beam, token) order: ties as lax.top_k
  x = jnp.take_along_axis(blocks.reshape(batch, -1, size), chosen[:, :, None], axis=1)
  chosen_beam = chosen // (vocab // size)  # [batch, m]

  def of_chosen(y):  # a per-beam value `[batch, b, 1]` -> that of each chosen block's beam
    return jnp.take_along_axis(y[..., 0], chosen_beam, axis=1)[:, :, None]

  lp = (of_chosen(alive_lp) + ((x - of_chosen(peak)) - of_chosen(log_sum))).reshape(batch, -1)
  beam = jnp.repeat(chosen_beam, size, axis=1)
  tok = ((chosen % (vocab // size))[:, :, None] * size + jnp.arange(size)).reshape(batch, -1)
  lp = jnp.where(excluded(tok), NEG_INF, lp)
  top, idx = jax.lax.top_k(lp, min(n, lp.shape[1]))
  missing = ((0, 0), (0, n - top.shape[1]))
  return (jnp.pad(top, missing, constant_values=NEG_INF),
          jnp.pad(jnp.take_along_axis(beam, idx, axis=1), missing),
          jnp.pad(jnp.take_along_axis(tok, idx, axis=1), missing, constant_values=PAD_ID))


@jax.tree_util.register_pytree_node_class
class _Stepper:
  """One extension of every alive beam (`__call__`), for the prompt, `max_new_tokens` and `alpha`
  of one search. A pytree (prompt and lengths per row), so `take_rows` selects sentences."""

  def __init__(self, prompt, lengths, alpha, min_new_tokens, k: int, max_new_tokens: int,
               eos_id, nbest: int | None = None):
    self.prompt, self.lengths, self.alpha = prompt, lengths, alpha
    self.min_new_tokens = min_new_tokens
    self.k, self.max_new_tokens, self.eos_id = k, max_new_tokens, eos_id
    self.nbest = k if nbest is None else nbest

  def tree_flatten(self):
    return ((self.prompt, self.lengths, self.alpha, self.min_new_tokens),
            (self.k, self.max_new_tokens, self.eos_id, self.nbest))

  @classmethod
  def tree_unflatten(cls, static, arrays):
    return cls(*arrays, *static)

  def candidates(self, t, logits, alive_lp):
    """Log-probs of every (beam, token) extension -> (top 2k values, beam, token, forced),
    the best 2k found by `best_extensions`."""
    k2 = 2 * self.k
    early = t - self.lengths < self.min_new_tokens  # EOS would end the output too soon
    top_lp, beam, tok = best_extensions(logits, alive_lp, k2, eos_banned=early,
                                        eos_id=self.eos_id)  # [batch, 2k]
    forced, forced_tok = forced_tokens(self.prompt, self.lengths, t)
    if self.prompt.shape[1]:  # a forced prompt token: log-prob 0, each beam's only extension
      only, only_beam = jax.lax.top_k(
        jnp.concatenate([alive_lp, jnp.full_like(alive_lp, NEG_INF)], axis=1), k2)
      top_lp = jnp.where(forced[:, None], only, top_lp)
      beam = jnp.where(forced[:, None], only_beam % self.k, beam)
      tok = jnp.where(forced[:, None], forced_tok[:, None], tok)
    return top_lp, beam, tok, forced

  def best_reachable(self, alive_lp, g):
    """The highest score an extension of a hypothesis with log-probability `alive_lp`
    `[batch]` (g + 1 tokens) can reach: its log-probability can only fall, and the length
    penalty is monotonic in the length, so the bound is at the shortest or the longest."""
    return jnp.maximum(alive_lp / length_penalty(g + 1, self.alpha),
                       alive_lp / length_penalty(self.max_new_tokens, self.alpha))

  def __call__(self, t, logits, beams: Beams) -> Beams:
    """`logits` `[batch, k, vocab]` (or `[batch, 1, vocab]` while every beam has the same
    prefix) predict target index t. Rows already done keep their finished hypotheses (a row's
    result does not depend on how long the other rows of its batch run)."""
    k, rows = self.k, jnp.arange(beams.done.shape[0])[:, None]
    top_lp, beam, tok, forced = self.candidates(t, logits, beams.alive_lp)
    g = t - self.lengths  # [batch] index among the generated tokens
    seq = jnp.take_along_axis(beams.alive_seq, beam[:, :, None], axis=1)
    seq = jnp.where(jnp.arange(self.max_new_tokens)[None, None, :] == g[:, None, None],
                    tok[:, :, None], seq)
    ends = (g >= self.max_new_tokens - 1)[:, None] & ~forced[:, None]
    if self.eos_id is not None:
      ends |= (tok == self.eos_id) & ~forced[:, None]
    # As in fairseq, a hypothesis that ends is finished only when it is among the best
    # `k` candidates of this step (so beam size 1 is greedy decoding).
    finishing = ends & (jnp.arange(2 * k) < k)[None, :]
    new_score = jnp.where(finishing, top_lp / length_penalty(g + 1, self.alpha)[:, None],
                          NEG_INF)
    fin_score, idx = jax.lax.top_k(jnp.concatenate([beams.fin_score, new_score], axis=1), k)
    fin_seq = jnp.concatenate([beams.fin_seq, seq], axis=1)[rows, idx]
    was_done = beams.done
    fin_score = jnp.where(was_done[:, None], beams.fin_score, fin_score)
    fin_seq = jnp.where(was_done[:, None, None], beams.fin_seq, fin_seq)
    alive_lp, idx = jax.lax.top_k(jnp.where(ends, NEG_INF, top_lp), k)
    # A row is done once its n best are final (no alive hypothesis can score above the n-th
    # finished one, whatever it adds: having k finished is not enough when the length penalty
    # favours longer outputs), or nothing is left alive, or at max_new_tokens.
    done = ((g >= self.max_new_tokens - 1) | ~jnp.isfinite(alive_lp[:, 0]) |
            (fin_score[:, self.nbest - 1] >= self.best_reachable(alive_lp[:, 0], g)))
    done = (done & ~(t + 1 < self.lengths)) | was_done
    return Beams(alive_seq=seq[rows, idx], alive_lp=alive_lp, fin_seq=fin_seq,
                 fin_score=fin_score, origin=beam[rows, idx], next_tok=tok[rows, idx],
                 done=done)


@functools.partial(jax.jit, static_argnames=('config', 'beam_size', 'max_new_tokens',
                                             'prefill_len', 'eos_id', 'reorder_cache',
                                             'compact_rows', 'first_window', 'nbest'))
def search(config, params, inputs, prompt, lengths, alpha, min_new_tokens, *, beam_size,
           max_new_tokens, prefill_len, eos_id=EOS_ID, reorder_cache=False, compact_rows=(),
           first_window=FIRST_WINDOW, nbest=None):
  """-> (tokens `[batch, k, max_new_tokens]`, scores `[batch, k]`), best first, of the model
  of `config` (static) holding `params` (the pure dict, traced; arguments prepared by
  `loop.prepare`). With `compact_rows` (a tuple of decreasing row counts) the slot
  layout's loop goes on with the unfinished sentences only once they are at most that many, in
  stages (`loop.compact_sizes`); its first `first_window` steps attend over a cache of
  that many steps (0: the whole cache). `nbest` < k: only the first `nbest` results are wanted
  (module docstring); the later ones are then the finished ones so far."""
  step = _Stepper(prompt, lengths, alpha, min_new_tokens, beam_size, max_new_tokens, eos_id,
                  nbest)
  beams = Beams.initial(prompt.shape[0], beam_size, max_new_tokens)
  model = bind(config, params)  # free inside the trace
  if reorder_cache:
    beams = _reordered_search(model, inputs, prompt, prefill_len, max_new_tokens, beam_size,
                              step, beams)
  else:
    beams = _slot_search(model, inputs, prompt, prefill_len, max_new_tokens, beam_size, step,
                         beams, compact_rows, first_window)
  fin_seq = jnp.where(jnp.isfinite(beams.fin_score)[:, :, None], beams.fin_seq, 0)
  return fin_seq, beams.fin_score


def _slot_search(model, inputs, prompt, prefill_len, max_new_tokens, k, step, beams, sizes,
                 window):
  """The decoder runs a sentence's k hypotheses as k queries of one batch row (`[batch, k]`).

  The self-attention cache of a row holds the keys/values of all its hypotheses: the first
  call writes the shared prefix (start token and prompt prefix, `n0` positions), and loop
  call i writes hypothesis j's new key at `n0 + k * i + j`. Instead of reordering the caches
  by parent beam at every step (a gather of every self-attention cache, ~15% of the time),
  `visible` `[batch, k, cache_len]` marks the positions holding each hypothesis' ancestors,
  and the attention mask shows each query only those. Reordering `visible` is a gather of
  booleans. The encoder keys/values are also kept once per sentence, not once per beam,
  and the first call (all beams equal) runs one row per sentence.

  Each step attends over the whole cache, k positions per generated token, most of them still
  empty early on: the first `window` steps run on a cache of `n0 + k * window`
  positions, then it is padded to full length (on test2016, beam 4, 64 generated tokens at
  most: 65 positions instead of 253 for the steps most sentences need). Once at most
  `sizes[0]` sentences are unfinished the loop goes on with those rows only, and so on.
  """
  n0, window, calls = windows(window, prompt.shape[1], max_new_tokens, prefill_len)
  logits, cache, inputs, t0 = start(model, inputs, prompt, prefill_len, max_new_tokens,
                                    cache_len=n0 + k * window)
  beams = step(t0, logits[:, None], beams)
  visible = jnp.broadcast_to(jnp.arange(n0 + k * window) < n0, (prompt.shape[0], k,
                                                                n0 + k * window))
  state = (jnp.asarray(t0, jnp.int32), cache, visible, beams)
  stage = functools.partial(_slot_loop, model, n0, t0)
  return window_then_whole(stage, (step, inputs), state, sizes, window, calls,
                           grow=lambda s: _grow(s, n0 + k * calls), done=lambda s: s[3].done,
                           result=lambda s: s[3])


def _grow(state, cache_len: int):
  """The slot state (t, cache, visible, beams) with its self-attention caches (and `visible`)
  padded to `cache_len` positions (empty, invisible)."""
  t, cache, visible, beams = state
  pad = cache_len - visible.shape[-1]
  return t, cache.grow(cache_len), jnp.pad(visible, ((0, 0), (0, 0), (0, pad))), beams


def _slot_loop(model, n0, t0, rows, state, stop_at: int, calls: int):
  """`_slot_search`'s decoder steps until at most `stop_at` sentences are unfinished or
  `calls` loop calls are done (the cache is full); rows (stepper, inputs) and state
  (t, cache, visible, beams) of a batch of sentences."""
  adapter = adapter_of(model)
  step, inputs = rows
  batch, k, cache_len = state[2].shape

  def body(state):
    t, cache, visible, beams = state
    own = jnp.arange(cache_len)[None, :] == (n0 + k * (t - t0) + jnp.arange(k))[:, None]
    mask = visible | own  # [batch, k, cache_len]
    # Every hypothesis' new token is at target index t + 1 (decoder position t + 1).
    logits, cache = adapter.decoder_step(model, cache.pin(), inputs, beams.next_tok,
                                         positions=jnp.full((batch, k), t + 1),
                                         mask=mask[:, None])
    beams = step(t + 1, logits, beams)
    visible = jnp.take_along_axis(mask, beams.origin[:, :, None], axis=1)  # the parents' view
    return t + 1, cache, visible, beams

  def cond(state):
    return (jnp.sum(~state[3].done) > stop_at) & (state[0] - t0 < calls)

  return jax.lax.while_loop(cond, body, state)


def _reordered_search(model, inputs, prompt, prefill_len, max_new_tokens, k, step, beams):
  """Reference layout: one decoder row per hypothesis, caches reordered by parent every step."""
  adapter, batch = adapter_of(model), prompt.shape[0]
  rows = jnp.arange(batch)[:, None]
  logits, cache, inputs, t0 = start(model, inputs, prompt, prefill_len, max_new_tokens,
                                    batch_repeat=k)
  beams = step(t0, logits.reshape(batch, k, -1), beams)

  def reorder(cache, origin):
    return cache.select_rows((rows * k + origin).reshape(-1))

  def body(state):
    t, cache, beams = state
    logits, cache = adapter.decoder_step(model, cache.pin(), inputs,
                                         beams.next_tok.reshape(-1, 1))
    beams = step(t + 1, logits.reshape(batch, k, -1), beams)
    # Reordering here (not at the start of the next step) lets the decoder's cache update
    # happen in place on the loop's buffers.
    return t + 1, reorder(cache, beams.origin), beams

  def body_twice(state):
    # Two steps per iteration: the beam reorder cannot permute the cache in place, so one
    # step per iteration would copy every reordered cache back into the loop's buffer;
    # alternating between two buffers avoids that. A step after every row is done changes
    # nothing (done rows are frozen).
    return body(body(state))

  state = (jnp.asarray(t0, jnp.int32), reorder(cache, beams.origin), beams)
  return jax.lax.while_loop(lambda s: ~jnp.all(s[2].done), body_twice, state)[2]
