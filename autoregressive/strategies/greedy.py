"""Greedy decoding: the most likely token at every step: `greedy_decode` over token ids, and the
strategy table's row `Greedy`."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

# scoring as a module, not its names: scoring imports this package back (base, loop)
from autoregressive import program_cache, scoring
from autoregressive.decodable import decoding_model
from autoregressive.strategies.base import Limits, Strategy
from autoregressive.strategies.loop import (
  checked_min_new_tokens,
  compact_sizes,
  draw_tokens,
  prepare,
)
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Greedy(Strategy):
  NAME = 'greedy'
  HELP = 'the most likely token at every step (a beam of 1); one hypothesis per sentence'

  def check_nbest(self, nbest: int, where: str) -> None:
    if nbest > 1:
      raise ValueError(f'{where}={nbest} is more than greedy decoding finds (1): use beam '
                       'search or sampling for more')

  def search(self, module, inputs=None, *, prompt=None, limits=None, eos_id=EOS_ID,
             line_ids=None, scores=True, drop_finished=True):
    limits = limits or Limits()
    tokens = greedy_decode(module, inputs, prompt=prompt, max_new_tokens=limits.max_new_tokens,
                           min_new_tokens=limits.min_new_tokens, eos_id=eos_id,
                           drop_finished=drop_finished)
    return scoring.forced_scores(module, inputs, prompt, np.asarray(tokens)[:, None], scores=scores)


def greedy_decode(module, inputs=None, *, prompt=None, max_new_tokens: int,
                  min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, eos_id: int | None = EOS_ID,
                  drop_finished: bool | int = True) -> Array:
  """Greedy decoding -> generated tokens `[batch, max_new_tokens]` (EOS kept, zeros after it).

  Args:
    module: an encoder-decoder or decoder-only NNX model (`model.build_model`; it holds its
      parameters).
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
      so on (`loop.compact_sizes`: an int or a tuple sets the stages' rows; same
      tokens). False runs every row to the end of the batch.
  """
  config, params = decoding_model(module)
  inputs, prompt, lengths, prefill_len = prepare(config, inputs, prompt, max_new_tokens)
  return program_cache.call(draw_tokens, config, params, inputs, prompt, lengths,
                            jax.random.PRNGKey(0), np.float32(1.0), np.float32(1.0),
                            checked_min_new_tokens(min_new_tokens), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, greedy=True, top_k=None, use_top_p=False,
                            eos_id=eos_id,
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished))
