"""Ancestral sampling (`sample` over token ids; the row `Sampling`): `logits / temperature`,
restricted to the `top_k` most likely tokens and/or the nucleus of mass `top_p`. Sample j of
the sentence on input line i draws from fold_in(fold_in(PRNGKey(seed), i), j), so a sentence
gets the same samples in any batch, bucket or stream rhythm."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# scoring as a module, not its names: scoring imports this package back (base, loop)
from autoregressive import program_cache, scoring
from autoregressive.decodable import decoding_model
from autoregressive.strategies.base import Limits, Strategy, setting
from autoregressive.strategies.loop import (
  checked_min_new_tokens,
  compact_sizes,
  draw_tokens,
  prepare,
  token_batch,
)
from common.dtype_limits import INT32_MAX, UINT32_MAX
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID

Array = jax.Array

# A temperature is 0 (greedy) or within these: below 1e-3, logits / temperature overflow float32.
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-3, 1e3
_TEMPERATURES = f'0 (greedy) or a number in [{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}]'


@dataclasses.dataclass(frozen=True)
class Sampling(Strategy):
  NAME = 'sampling'
  HELP = 'draw each token from the model (nbest = samples per sentence)'
  temperature: float = setting(1.0, 'logits / temperature (0 = greedy)', low=0.0,
                               high=TEMPERATURE_MAX, rule=_TEMPERATURES)
  top_k: int = setting(0, 'sample among the k most likely tokens (0 = all)', low=0,
                       high=INT32_MAX)
  top_p: float = setting(1.0, 'nucleus: the fewest tokens of this mass (1 = off)',
                         low=0.0, high=1.0, low_open=True, in_config=False)
  seed: int = setting(0, "random seed (a sentence's samples depend only on it and the "
                      "sentence's line)", low=0, high=UINT32_MAX, in_config=False)

  def check_more(self, where) -> None:
    t = self.temperature
    if t != 0 and not TEMPERATURE_MIN <= t:  # below it, logits / t overflow float32
      raise ValueError(f'{where("temperature")}={t} must be {_TEMPERATURES}')

  def check_given(self, given, where) -> None:
    if self.temperature == 0:  # greedy: a top_k, top_p or seed would be ignored
      for name in ('top_k', 'top_p', 'seed'):
        if name in given:
          raise ValueError(f'{where(name)} applies to sampling, but the temperature is 0 '
                           '(greedy)')

  def program_key(self) -> tuple:
    return (self.top_k, self.top_p < 1.0, self.temperature == 0)

  def search(self, module, inputs=None, *, prompt=None, limits=None, eos_id=EOS_ID,
             line_ids=None, scores=True, drop_finished=True):
    limits = limits or Limits()
    k = limits.nbest
    batch = token_batch(inputs if prompt is None else prompt,
                        'inputs' if prompt is None else 'prompt', module.config.vocab_size
                        ).shape[0]
    line_ids = range(batch) if line_ids is None else line_ids
    repeat = lambda x: None if x is None else np.repeat(np.asarray(x), k, axis=0)  # noqa: E731
    tokens = sample(
        module, repeat(inputs), prompt=repeat(prompt), max_new_tokens=limits.max_new_tokens,
        min_new_tokens=limits.min_new_tokens, eos_id=eos_id,
        rng=sample_keys(self.seed, line_ids, k, batch),
        temperature=self.temperature, top_k=self.top_k or None,
        top_p=self.top_p if self.top_p < 1.0 else None, drop_finished=drop_finished)
    return scoring.forced_scores(module, inputs, prompt, np.asarray(tokens).reshape(batch, k, -1),
                         scores=scores)


def sample_keys(seed: int, line_ids: Sequence[int], n: int, rows: int):
  """One key per decoder row `[rows * n, 2]`: sample j of source `line_ids[r]` uses
  fold_in(fold_in(PRNGKey(seed), line_id), j); padding rows get a fixed key."""
  ids = np.zeros((rows, n), np.uint32)
  ids[:len(line_ids)] = np.asarray(line_ids, np.uint32)[:, None]
  sample = np.broadcast_to(np.arange(n, dtype=np.uint32), (rows, n))
  base = jax.random.PRNGKey(seed)
  fold = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(base, i), j))
  return fold(jnp.asarray(ids.reshape(-1)), jnp.asarray(sample.reshape(-1)))


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
  return program_cache.call(draw_tokens, config, params, inputs, prompt, lengths, rng,
                            np.float32(temperature if not greedy else 1.0),
                            np.float32(1.0 if top_p is None else top_p),
                            checked_min_new_tokens(min_new_tokens), max_new_tokens=max_new_tokens,
                            prefill_len=prefill_len, greedy=greedy, top_k=top_k,
                            use_top_p=top_p is not None and top_p < 1.0, eos_id=eos_id,
                            compact_rows=compact_sizes(prompt.shape[0], drop_finished))
