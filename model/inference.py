"""Translating token ids with a trained encoder-decoder: the one path used by the trainer's
BLEU evaluation and by `decode.py`.

Sources are token ids (EOS-terminated, as the tokenizer gives them); a source longer than the
model's positions is cut by `truncate`, the same rule as the training pipeline's. Batches
hold sentences of similar length, padded to a fixed batch size and a multiple of
`LENGTH_MULTIPLE` tokens, so a whole test set compiles only a few shapes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from model import decoding, transformer

LENGTH_MULTIPLE = 16


def truncate(ids: Sequence[int], max_len: int, eos_id: int | None) -> list[int]:
  """At most `max_len` ids; a cut sequence keeps its EOS at the end (when there is one)."""
  ids = list(ids)
  if len(ids) <= max_len:
    return ids
  return ids[:max_len - 1] + [eos_id] if eos_id is not None else ids[:max_len]


def until_eos(ids: Sequence[int], eos_id: int | None) -> list[int]:
  """Generated ids up to and including EOS, without the trailing padding."""
  out = []
  for i in ids:
    if i == decoding.PAD_ID:
      break
    out.append(int(i))
    if eos_id is not None and i == eos_id:
      break
  return out


class Translator:
  """`translator(sources)` -> output ids per source (None where the source is None).

  `module`/`params` as restored (a `scan_layers` model is unrolled here, once); beam search
  with `beam_size > 1`, else greedy; `max_len` generated tokens at most.
  """

  def __init__(self, module, params, *, beam_size: int, alpha: float, max_len: int,
               batch_size: int, eos_id: int | None = decoding.EOS_ID):
    self.module, self.params = transformer.unrolled(module, params)
    self.beam_size, self.alpha, self.max_len = beam_size, alpha, max_len
    self.batch_size, self.eos_id = batch_size, eos_id

  def _decode(self, inputs: np.ndarray) -> np.ndarray:
    if self.beam_size > 1:
      tokens, _ = decoding.beam_search_decode(self.module, self.params, inputs,
                                              beam_size=self.beam_size, alpha=self.alpha,
                                              max_len=self.max_len, eos_id=self.eos_id)
      return np.asarray(tokens[:, 0])
    return np.asarray(decoding.greedy_decode(self.module, self.params, inputs,
                                             max_len=self.max_len, eos_id=self.eos_id))

  def __call__(self, sources: Sequence[Sequence[int] | None],
               progress: Callable[[int], None] | None = None) -> list[list[int] | None]:
    """`progress(n)` is called after each batch with the number of sentences it held."""
    model_len = self.module.config.max_len
    order = sorted((i for i, s in enumerate(sources) if s is not None),
                   key=lambda i: len(sources[i]))
    outputs: list[list[int] | None] = [None] * len(sources)
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      longest = max(len(sources[i]) for i in chunk)
      length = min(model_len, max(1, -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE))
      inputs = np.zeros((self.batch_size, length), np.int32)
      for row, i in enumerate(chunk):
        ids = truncate(sources[i], model_len, self.eos_id)
        inputs[row, :len(ids)] = ids
      tokens = self._decode(inputs)
      for row, i in enumerate(chunk):
        outputs[i] = until_eos(tokens[row], self.eos_id)
      if progress is not None:
        progress(len(chunk))
    return outputs


def generate(module, params, prompt_ids: Sequence[int], *, num_tokens: int, temperature: float,
             top_k: int | None, top_p: float | None, seed: int, eos_id: int | None,
             warn: Callable[[str], None] | None = None) -> list[int]:
  """Continues `prompt_ids` with a language model -> up to `num_tokens` generated ids.

  The model sees at most `max_len` positions (the start token, the context and the new
  tokens); longer generations continue in windows whose context is the last half of the
  model's span. `warn` hears about a prompt longer than the span (it is cut to its end).
  """
  import jax  # pylint: disable=import-outside-toplevel
  span = module.config.max_len
  half = max(1, span // 2)
  rng = jax.random.PRNGKey(seed)
  context = list(prompt_ids)
  if len(context) >= span:
    if warn is not None:
      warn(f'the prompt has {len(context)} tokens, more than the model\'s context '
           f'{span - 1}; it continues from the last {half}')
    context = context[-half:]
  generated: list[int] = []
  while True:
    n = span - len(context)  # always fill the span: the same shapes for every window
    prompt = np.array(context, np.int32).reshape(1, len(context))
    rng, key = jax.random.split(rng)
    out = decoding.sample(module, params, prompt, rng=key, max_len=n, temperature=temperature,
                          top_k=top_k or None, top_p=top_p, eos_id=eos_id)
    new = until_eos(np.asarray(out)[0].tolist(), eos_id)
    generated += new
    if len(generated) >= num_tokens or len(new) < n or (eos_id is not None and new[-1] == eos_id):
      return generated[:num_tokens]
    context = (list(prompt_ids) + generated)[-half:]
