"""Translating token ids with a trained encoder-decoder: the batches under every `Session`
(decode.py, `inference.load`, the trainer's validation BLEU); and a language model's generation.

Sources are token ids (EOS-terminated, as the tokenizer gives them); a source longer than the
model's positions is cut by `common.tokens.truncate`, the training pipeline's rule. Batches
hold sentences of similar length, padded to a multiple of `batches.LENGTH_MULTIPLE` tokens and to a
fixed number of rows (a whole file: the batch size; a stream: the next power of two), so a
whole test set, or a stream of any rhythm, compiles only a few shapes.

The search is a row of `autoregressive.strategies.TABLE` (beam search, greedy, sampling);
this module only batches sources for it. A sentence's random draws depend on its index
(`line_ids`), so it gets the same samples whatever batch, bucket or stream rhythm it comes in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from autoregressive.batches import default_workers, in_order, padded_length
from autoregressive.strategies import Hypothesis, Limits, Sampling, Strategy
from autoregressive.strategies.base import until_eos
from autoregressive.strategies.loop import decoding_model
from autoregressive.strategies.sampling import sample
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, truncate


def _bucket_rows(n: int, batch_size: int) -> int:
  """The next power of two >= n, at most `batch_size`: few shapes for batches of any size."""
  return min(batch_size, 1 << max(0, n - 1).bit_length())


_RAN_SHAPES: dict[tuple, set[tuple[int, ...]]] = {}  # a search's settings -> shapes it has run


class Translator:
  """`translator(sources)` -> best output ids per source (None where the source is None);
  `translator.search(sources)` -> `limits.nbest` `Hypothesis` per source, best first.

  `module` an NNX model as restored, or its `decoding_model` form (a `scan_layers` model is
  unrolled and the module split here, once); `strategy` a
  row of `autoregressive.strategies.TABLE` (beam search, greedy, sampling) with its settings;
  `limits` the output lengths, batch size and hypotheses per sentence. `drop_finished=False`
  decodes every sentence of a batch until the batch's last one ends (the plain path, same
  outputs). `workers` > 1 decodes that many batches at once (threads; same outputs): on a
  CPU a batch's decoder step is a chain of small ops that mostly keep one core busy
  (test2016, batch 64, 2 cores: 1.5x the sentences per second at beam 4, 1.4x greedy). None:
  `default_workers()`.
  """

  def __init__(self, module, strategy: Strategy, limits: Limits, *,
               eos_id: int | None = EOS_ID, drop_finished: bool | int = True,
               workers: int | None = None):
    self.model = decoding_model(module)
    strategy.check_nbest(limits.nbest, 'nbest')
    self.strategy, self.limits, self.eos_id = strategy, limits, eos_id
    self.drop_finished = drop_finished
    self.workers = default_workers() if workers is None else max(1, int(workers))
    # The batch shapes this search has run (compiled) in this process, by any Translator. The
    # key is the settings that shape its programs; a key too coarse would only let two
    # batches compile one shape at once.
    self._ran_shapes = _RAN_SHAPES.setdefault(
        (self.model.config, strategy.NAME, strategy.program_key(), limits.max_new_tokens, eos_id,
         limits.nbest, str(drop_finished)), set())

  def __call__(self, sources: Sequence[Sequence[int] | None],
               progress: Callable[[int], None] | None = None) -> list[list[int] | None]:
    """`progress(n)` is called after each batch with the number of sentences it held."""
    results = self.search(sources, progress=progress, scores=False)
    return [None if r is None else (r[0].tokens if r else []) for r in results]

  def search(self, sources: Sequence[Sequence[int] | None], *,
             progress: Callable[[int], None] | None = None,
             line_ids: Sequence[int] | None = None, scores: bool = True,
             fixed_rows: bool = True) -> list[list[Hypothesis] | None]:
    """Hypotheses per source, best first (None where the source is None).

    Sources are decoded sorted by length (longest first) in batches of `batch_size`;
    `fixed_rows` pads every batch to `batch_size` rows (one shape for a whole file), else to
    the next power of two (a stream's few waiting lines). `line_ids` (default: the
    positions) seed the samples. `scores=False` skips the forced-decoding pass that scores
    greedy and sampled outputs (their `score` and `log_prob` are then NaN).
    """
    line_ids = range(len(sources)) if line_ids is None else line_ids
    model_len = self.model.config.max_len
    # Longest first: the slowest batches start first, so that a pass does not end with one
    # worker on the longest batch while the others wait (test2016, 2 workers: warm passes
    # 3-4% shorter than shortest first). Any order gives the same outputs.
    order = sorted((i for i, s in enumerate(sources) if s is not None),
                   key=lambda i: len(sources[i]), reverse=True)
    outputs: list[list[Hypothesis] | None] = [None] * len(sources)
    batches = []
    size = self.limits.batch_size
    for start in range(0, len(order), size):
      chunk = order[start:start + size]
      cut = [truncate(sources[i], model_len, self.eos_id) for i in chunk]
      length = padded_length(cut, model_len)
      rows = size if fixed_rows else _bucket_rows(len(chunk), size)
      inputs = np.zeros((rows, length), np.int32)
      # Padding rows repeat the shortest source, so that they end with it: an empty source
      # decodes to whatever the model makes of nothing, maybe up to the limit, and an
      # unfinished row keeps the whole batch running (their outputs are dropped).
      shortest = min(cut, key=len)
      for row in range(rows):
        ids = cut[row] if row < len(cut) else shortest
        inputs[row, :len(ids)] = ids
      batches.append((chunk, inputs))

    def run(batch):
      chunk, inputs = batch
      return chunk, self._batch(inputs, [line_ids[i] for i in chunk], scores)

    for chunk, found in in_order(run, batches, self.workers, self._ran_shapes):
      for row, i in enumerate(chunk):
        outputs[i] = found[row]
      if progress is not None:
        progress(len(chunk))
    return outputs

  def _batch(self, inputs: np.ndarray, line_ids: Sequence[int], scores: bool
             ) -> list[list[Hypothesis]]:
    """Hypotheses of the first `len(line_ids)` rows of `inputs` `[rows, src_len]`."""
    return self.strategy.search(self.model, inputs, self.limits,
                                eos_id=self.eos_id, line_ids=line_ids, scores=scores,
                                drop_finished=self.drop_finished)


def generate(module, prompt_ids: Sequence[int], *, num_tokens: int, sampling: Sampling,
             eos_id: int | None, min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, line: int = 0,
             warn: Callable[[str], None] | None = None) -> list[int]:
  """Continues `prompt_ids` with a language model -> up to `num_tokens` generated ids drawn
  with `sampling`'s settings, at least `min_new_tokens` of them before an EOS. The random
  stream is fold_in(PRNGKey(seed), line): each (seed, input line) pair has its own, as the
  Translator's samples (seed + line would give line 2 at seed 0 line 1's stream at seed 1).

  The model sees at most `max_len` positions (the start token, the context and the new
  tokens); longer generations continue in windows whose context is the last half of the
  model's span. `warn` hears about a prompt longer than the span (it is cut to its end).
  """
  model = decoding_model(module)  # split once for every window
  span = model.config.max_len
  half = max(1, span // 2)
  rng = jax.random.fold_in(jax.random.PRNGKey(sampling.seed), line)
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
    out = sample(model, prompt=prompt, rng=key, max_new_tokens=n,
                 min_new_tokens=max(0, min_new_tokens - len(generated)),
                 temperature=sampling.temperature, top_k=sampling.top_k or None,
                 top_p=sampling.top_p if sampling.top_p < 1.0 else None,
                 eos_id=eos_id)
    new = until_eos(np.asarray(out)[0].tolist(), eos_id)
    generated += new
    if len(generated) >= num_tokens or len(new) < n or (eos_id is not None and new[-1] == eos_id):
      return generated[:num_tokens]
    context = (list(prompt_ids) + generated)[-half:]
