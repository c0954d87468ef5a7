"""Greedy decoding: the most likely token at every step (`decoding.greedy_decode`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from autoregressive import decoding
from autoregressive.strategies.base import Strategy, one_by_one


@dataclasses.dataclass(frozen=True)
class Greedy(Strategy):
  NAME = 'greedy'
  HELP = 'the most likely token at every step (a beam of 1); one hypothesis per sentence'

  def check_nbest(self, nbest: int, where: str) -> None:
    if nbest > 1:
      raise ValueError(f'{where}={nbest} is more than greedy decoding finds (1): use beam '
                       'search or sampling for more')

  def search(self, model, inputs, limits, *, eos_id, line_ids, scores, drop_finished):
    tokens = decoding.greedy_decode(model, inputs,
                                    max_new_tokens=limits.max_new_tokens,
                                    min_new_tokens=limits.min_new_tokens, eos_id=eos_id,
                                    drop_finished=drop_finished)
    return one_by_one(model, np.asarray(inputs), tokens, k=1, n=len(line_ids),
                      eos_id=eos_id, scores=scores)
