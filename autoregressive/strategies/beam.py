"""Beam search (`decoding.beam_search_decode`, the rule in `autoregressive.beam_search`): the
`beam_size` best prefixes at every step, finished hypotheses ranked by the GNMT length penalty
`log P / ((5 + len) / 6) ** alpha` (the paper: beam 4, alpha 0.6)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from autoregressive import decoding
from autoregressive.strategies.base import NBEST_MAX, Hypothesis, Strategy, setting, until_eos

ALPHA_MAX = 10.0  # the length penalty ((5 + len) / 6) ** alpha stays finite in float32
BEAM_SIZE_MAX = NBEST_MAX
# One program for the penalties (as eager jnp ops, each op compiled in every new process).
_length_penalty = jax.jit(decoding.length_penalty, static_argnums=1)


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

  def search(self, model, inputs, limits, *, eos_id, line_ids, scores, drop_finished):
    n, nbest = len(line_ids), limits.nbest
    tokens, found = decoding.beam_search_decode(
        model, inputs, beam_size=self.beam_size, alpha=self.alpha,
        max_new_tokens=limits.max_new_tokens, min_new_tokens=limits.min_new_tokens,
        eos_id=eos_id, drop_finished=drop_finished, nbest=nbest)
    tokens, found = np.asarray(tokens)[:n, :nbest], np.asarray(found)[:n, :nbest]
    ids = [[until_eos(t, eos_id) for t in row] for row in tokens]
    # log P = score * penalty; one call for the batch (one per sentence took ~5% of a pass).
    lengths = np.array([[len(i) for i in row] for row in ids], np.int32).reshape(n, -1)
    penalty = np.asarray(_length_penalty(lengths, self.alpha))
    return [[Hypothesis(i, float(s), float(s) * float(p))
             for i, s, p in zip(ids[r], found[r], penalty[r], strict=True) if np.isfinite(s)]
            for r in range(n)]
