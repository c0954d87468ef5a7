"""The beam search rule in plain NumPy, for tests: a reference to compare our jitted search and
CTranslate2's with, that also measures how close the search came to choosing otherwise.

The rule (autoregressive/strategies/beam.py's docstring): each step extends the k alive hypotheses
by every token but pad (and EOS before `min_new_tokens` tokens) and ranks the extensions by
log-probability (ties to the lower beam, then the lower token); an extension that ends (EOS,
or the token limit) among the k best is finished, scored `log P / ((5 + len) / 6) ** alpha`;
the k best that do not end stay alive. A sentence is done once no alive hypothesis can score
above the best finished one (`nbest=1`), nothing is alive, or at the limit.

`margin` is the smallest score gap at any decision the search took: between the k-th and the
(k+1)-th ranked extensions, between the k-th and (k+1)-th extensions that do not end, between
the two best finished hypotheses, and between the best finished score and the alive bound when
the search stopped or went on. Two implementations whose float arithmetic differs by less than
`margin` take the same decisions; where they differ, `margin` is that small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

PAD, EOS = 0, 1


class Result(NamedTuple):
  tokens: list[int]  # the best hypothesis, EOS included when it ended so
  score: float
  margin: float


def _penalty(length: int, alpha: float) -> float:
  return ((5.0 + length) / 6.0) ** alpha


def beam_search(next_log_probs: Callable[[Sequence[tuple[int, ...]]], np.ndarray], *, k: int,
                max_new_tokens: int, min_new_tokens: int = 1, alpha: float = 0.0) -> Result:
  """`next_log_probs(prefixes)` -> `[len(prefixes), vocab]` log-probabilities of each prefix's
  next token (over every token but pad)."""
  alive: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
  finished: list[tuple[float, tuple[int, ...]]] = []
  margins = [np.inf]
  for g in range(max_new_tokens):
    rows = np.asarray(next_log_probs([seq for seq, _ in alive]), np.float64)
    candidates = []  # (log-prob, beam, token)
    for beam, ((_, lp), row) in enumerate(zip(alive, rows, strict=True)):
      for tok in range(row.shape[0]):
        if tok == PAD or (tok == EOS and g < min_new_tokens) or not np.isfinite(row[tok]):
          continue
        candidates.append((lp + row[tok], beam, tok))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    last = g == max_new_tokens - 1
    ends = [last or c[2] == EOS for c in candidates]
    if len(candidates) > k:
      margins.append(candidates[k - 1][0] - candidates[k][0])
    for c, end in zip(candidates[:k], ends[:k], strict=True):
      if end:
        finished.append((c[0] / _penalty(g + 1, alpha), alive[c[1]][0] + (c[2],)))
    going = [c for c, end in zip(candidates, ends, strict=True) if not end]
    if len(going) > k:
      margins.append(going[k - 1][0] - going[k][0])
    alive = [(alive[c[1]][0] + (c[2],), c[0]) for c in going[:k]]
    if last or not alive:
      break
    if finished:
      best = max(s for s, _ in finished)
      reach = max(alive[0][1] / _penalty(g + 1, alpha),
                  alive[0][1] / _penalty(max_new_tokens, alpha))
      margins.append(abs(best - reach))
      if best >= reach:
        break
  finished.sort(key=lambda f: -f[0])
  if len(finished) > 1:
    margins.append(finished[0][0] - finished[1][0])
  score, tokens = finished[0]
  return Result(list(tokens), float(score), float(min(margins)))


def model_next_log_probs(model, source, width: int, rows: int):
  """`next_log_probs` of our `model` (an NNX module holding its parameters) for one source
  `[src_len]` (None: a decoder-only model, the prefixes holding the prompt) (teacher-forced
  full forward passes of `rows` prefixes padded to `width`: one compile), pad left out."""
  import jax  # pylint: disable=import-outside-toplevel

  from model import bind, params_of  # pylint: disable=import-outside-toplevel
  from model.kinds import adapter_of  # pylint: disable=import-outside-toplevel

  adapter, config = adapter_of(model), model.config
  inputs = None if source is None else np.repeat(np.asarray(source, np.int32)[None], rows, axis=0)

  @jax.jit
  def log_probs(params, targets):
    logits = adapter.teacher_forced(bind(config, params), inputs, targets)
    return jax.nn.log_softmax(logits.at[..., PAD].set(-np.inf))
  params = params_of(model)

  def next_log_probs(prefixes):
    # A pad target would mask its own query: the positions after a prefix hold any other id.
    targets = np.full((rows, width), EOS + 2, np.int32)
    for row, prefix in enumerate(prefixes):
      targets[row, :len(prefix)] = prefix
    out = np.asarray(log_probs(params, targets))
    return np.stack([out[row, len(prefix)] for row, prefix in enumerate(prefixes)])
  return next_log_probs


def differences_are_ties(ours, theirs, reference: Callable[[int], Result], *, tie: float = 1e-3
                         ) -> int:
  """Checks that two searches' outputs (token lists per sentence, EOS optional) agree, or where
  they do not, that the reference search of that sentence (`reference(i)`) came within `tie`
  of choosing otherwise and found one of the two -> the number of such sentences."""
  def strip(ids):
    return [t for t in ids if t != EOS]
  ties = 0
  for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
    if strip(a) == strip(b):
      continue
    found = reference(i)
    assert found.margin < tie, (f'sentence {i}: ours {a} and theirs {b} differ with no tie '
                                f'(smallest decision margin {found.margin:.2e})')
    assert strip(found.tokens) in (strip(a), strip(b)), f'sentence {i}: {found.tokens}'
    ties += 1
  return ties


def greedy_difference_is_a_tie(ours, theirs, next_log_probs, *, tie: float = 1e-3) -> int:
  """Checks that two greedy continuations (token lists) agree, or that where they first
  differ, our model (`next_log_probs`, as `beam_search` takes it) puts both tokens within `tie`
  of the best one (another CPU's rounding may break such a tie the other way; the rest then
  differs too) -> 1 for a tie, 0 when they agree."""
  ours, theirs = list(ours), list(theirs)
  if ours == theirs:
    return 0
  at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
            None)
  assert at is not None, f'one output is a prefix of the other: {ours} and {theirs}'
  logits = next_log_probs([ours[:at]])[0]
  best = float(logits.max())
  gaps = best - float(logits[ours[at]]), best - float(logits[theirs[at]])
  assert max(gaps) < tie, (f'ours {ours} and theirs {theirs} differ at {at} with no tie '
                           f'(logits {gaps[0]:.2e} and {gaps[1]:.2e} below the best)')
  return 1
