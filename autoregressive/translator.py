"""Translating token ids with a trained encoder-decoder: the one path used by the trainer's
BLEU evaluation, `decode.py` and `inference.Session`; and a language model's generation.

Sources are token ids (EOS-terminated, as the tokenizer gives them); a source longer than the
model's positions is cut by `common.tokens.truncate`, the training pipeline's rule. Batches
hold sentences of similar length, padded to a multiple of `batches.LENGTH_MULTIPLE` tokens and to a
fixed number of rows (a whole file: the batch size; a stream: the next power of two), so a
whole test set, or a stream of any rhythm, compiles only a few shapes.

Searches: beam search (`beam_size > 1`; the `nbest` best finished hypotheses), greedy
(`beam_size == 1`), or sampling (`sampling=Sampling(...)`: `nbest` independent samples per
source). A sample's random key is derived from the seed and the source's index (`line_ids`),
so a sentence gets the same samples whatever batch, bucket or stream rhythm it comes in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from autoregressive import decoding
from autoregressive.batches import default_workers, in_order, padded_length
from autoregressive.decode_loop import decoding_model
from autoregressive.scoring import forced_log_probs
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, PAD_ID, truncate

# One program for the penalties (as eager jnp ops, each op compiled in every new process).
_length_penalty = jax.jit(decoding.length_penalty, static_argnums=1)


def until_eos(ids: Sequence[int], eos_id: int | None) -> list[int]:
  """Generated ids up to and including EOS, without the trailing padding."""
  out = []
  for i in ids:
    if i == PAD_ID:
      break
    out.append(int(i))
    if eos_id is not None and i == eos_id:
      break
  return out


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Ancestral sampling settings: `logits / temperature` (0 = greedy), restricted to the
  `top_k` most likely tokens (None/0 = all) and/or the nucleus of mass `top_p` (None = off)."""
  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One output: `tokens` (ids, EOS included when generated), `score` (the search's score:
  beam search's length-normalised `log_prob / ((5 + len) / 6) ** alpha`; greedy and sampling
  do not normalise, so it is `log_prob`) and `log_prob` (the sum of the tokens'
  log-probabilities under the model, untempered)."""
  tokens: list[int]
  score: float
  log_prob: float
  text: str | None = None  # the detokenized tokens (`inference.Session` fills it in)

  def as_dict(self) -> dict:
    """{'text', 'score', 'log_prob', 'tokens'}: one hypothesis of `decode.py`'s jsonl."""
    return {'text': self.text, 'score': self.score, 'log_prob': self.log_prob,
            'tokens': list(self.tokens)}


def _sample_keys(seed: int, line_ids: Sequence[int], n: int, rows: int):
  """One key per decoder row `[rows * n, 2]`: sample j of source `line_ids[r]` uses
  fold_in(fold_in(PRNGKey(seed), line_id), j); padding rows get a fixed key."""
  ids = np.zeros((rows, n), np.uint32)
  ids[:len(line_ids)] = np.asarray(line_ids, np.uint32)[:, None]
  sample = np.broadcast_to(np.arange(n, dtype=np.uint32), (rows, n))
  base = jax.random.PRNGKey(seed)
  fold = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(base, i), j))
  return fold(jnp.asarray(ids.reshape(-1)), jnp.asarray(sample.reshape(-1)))


def _bucket_rows(n: int, batch_size: int) -> int:
  """The next power of two >= n, at most `batch_size`: few shapes for batches of any size."""
  return min(batch_size, 1 << max(0, n - 1).bit_length())


_RAN_SHAPES: dict[tuple, set[tuple[int, ...]]] = {}  # a search's settings -> shapes it has run


class Translator:
  """`translator(sources)` -> best output ids per source (None where the source is None);
  `translator.search(sources)` -> `nbest` `Hypothesis` per source, best first.

  `module`/`params` as restored (a `scan_layers` model is unrolled here, once); beam search
  with `beam_size > 1`, else greedy, or sampling with `sampling`; `max_new_tokens` generated
  tokens at most, and at least `min_new_tokens` before EOS (1: an empty output only for an
  empty source); `batch_size` sentences per decoder call. `drop_finished=False` decodes every
  sentence of a batch until the batch's last one ends (the plain path, same outputs).
  `workers` > 1 decodes that many batches at once (threads; same outputs): on a CPU a
  batch's decoder step is a chain of small ops that mostly keep one core busy (test2016,
  batch 64, 2 cores: 1.5x the sentences per second at beam 4, 1.4x greedy). None:
  `default_workers()`.
  """

  def __init__(self, module, params, *, beam_size: int, alpha: float, max_new_tokens: int,
               batch_size: int, min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS,
               eos_id: int | None = EOS_ID, nbest: int = 1,
               sampling: Sampling | None = None, drop_finished: bool | int = True,
               workers: int | None = None):
    self.module, self.params = decoding_model(module, params)
    if sampling is None and nbest > beam_size:
      raise ValueError(f'nbest={nbest} is more than the beam size {beam_size}')
    if sampling is not None and beam_size != 1:
      raise ValueError(f'sampling draws one token at a time: beam_size must be 1, not {beam_size}')
    self.beam_size, self.alpha, self.max_new_tokens = beam_size, alpha, max_new_tokens
    self.min_new_tokens = min_new_tokens
    self.batch_size, self.eos_id = batch_size, eos_id
    self.nbest, self.sampling = nbest, sampling
    self.drop_finished = drop_finished
    self.workers = default_workers() if workers is None else max(1, int(workers))
    # The batch shapes this search has run (compiled) in this process, by any Translator. The
    # key is the settings that shape its programs; a key too coarse would only let two
    # batches compile one shape at once.
    self._ran_shapes = _RAN_SHAPES.setdefault(
        (self.module, beam_size, max_new_tokens, eos_id, nbest, sampling is None,
         str(drop_finished)), set())

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
    model_len = self.module.config.max_len
    # Longest first: the slowest batches start first, so that a pass does not end with one
    # worker on the longest batch while the others wait (test2016, 2 workers: warm passes
    # 3-4% shorter than shortest first). Any order gives the same outputs.
    order = sorted((i for i, s in enumerate(sources) if s is not None),
                   key=lambda i: len(sources[i]), reverse=True)
    outputs: list[list[Hypothesis] | None] = [None] * len(sources)
    batches = []
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      cut = [truncate(sources[i], model_len, self.eos_id) for i in chunk]
      length = padded_length(cut, model_len)
      rows = self.batch_size if fixed_rows else _bucket_rows(len(chunk), self.batch_size)
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
    n = len(line_ids)
    if self.sampling is None and self.beam_size > 1:
      tokens, found = decoding.beam_search_decode(
          self.module, self.params, inputs, beam_size=self.beam_size, alpha=self.alpha,
          max_new_tokens=self.max_new_tokens, min_new_tokens=self.min_new_tokens,
          eos_id=self.eos_id, drop_finished=self.drop_finished, nbest=self.nbest)
      tokens, found = np.asarray(tokens)[:n, :self.nbest], np.asarray(found)[:n, :self.nbest]
      ids = [[until_eos(t, self.eos_id) for t in row] for row in tokens]
      # log P = score * penalty; one call for the batch (one per sentence took ~5% of a pass).
      lengths = np.array([[len(i) for i in row] for row in ids], np.int32).reshape(n, -1)
      penalty = np.asarray(_length_penalty(lengths, self.alpha))
      return [[Hypothesis(i, float(s), float(s) * float(p))
               for i, s, p in zip(ids[r], found[r], penalty[r], strict=True) if np.isfinite(s)]
              for r in range(n)]
    k = self.nbest if self.sampling is not None else 1
    rows = np.repeat(inputs, k, axis=0)
    if self.sampling is None:
      tokens = decoding.greedy_decode(self.module, self.params, rows,
                                      max_new_tokens=self.max_new_tokens,
                                      min_new_tokens=self.min_new_tokens, eos_id=self.eos_id,
                                      drop_finished=self.drop_finished)
    else:
      s = self.sampling
      tokens = decoding.sample(
          self.module, self.params, rows, max_new_tokens=self.max_new_tokens,
          min_new_tokens=self.min_new_tokens, eos_id=self.eos_id,
          rng=_sample_keys(s.seed, line_ids, k, inputs.shape[0]), temperature=s.temperature,
          top_k=s.top_k or None, top_p=s.top_p, drop_finished=self.drop_finished)
    log_probs = (forced_log_probs(self.module, self.params, rows, tokens) if scores
                 else np.full(rows.shape[0], np.nan, np.float32))
    tokens = np.asarray(tokens)
    hyps = [[Hypothesis(until_eos(tokens[r * k + j], self.eos_id), float(log_probs[r * k + j]),
                        float(log_probs[r * k + j])) for j in range(k)] for r in range(n)]
    return [sorted(h, key=lambda x: -x.score) if scores else h for h in hyps]


def generate(module, params, prompt_ids: Sequence[int], *, num_tokens: int, temperature: float,
             top_k: int | None, top_p: float | None, seed: int, eos_id: int | None,
             min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, line: int = 0,
             warn: Callable[[str], None] | None = None) -> list[int]:
  """Continues `prompt_ids` with a language model -> up to `num_tokens` generated ids, at
  least `min_new_tokens` of them before an EOS. The random stream is
  fold_in(PRNGKey(seed), line): each (seed, input line) pair has its own, as the Translator's
  samples (seed + line would give line 2 at seed 0 line 1's stream at seed 1).

  The model sees at most `max_len` positions (the start token, the context and the new
  tokens); longer generations continue in windows whose context is the last half of the
  model's span. `warn` hears about a prompt longer than the span (it is cut to its end).
  """
  module, params = decoding_model(module, params)
  span = module.config.max_len
  half = max(1, span // 2)
  rng = jax.random.fold_in(jax.random.PRNGKey(seed), line)
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
    out = decoding.sample(module, params, prompt=prompt, rng=key, max_new_tokens=n,
                          min_new_tokens=max(0, min_new_tokens - len(generated)),
                          temperature=temperature, top_k=top_k or None, top_p=top_p,
                          eos_id=eos_id)
    new = until_eos(np.asarray(out)[0].tolist(), eos_id)
    generated += new
    if len(generated) >= num_tokens or len(new) < n or (eos_id is not None and new[-1] == eos_id):
      return generated[:num_tokens]
    context = (list(prompt_ids) + generated)[-half:]
