"""`inference.load(workdir)`: a trained workdir ready to translate, generate and score text.

    import inference
    session = inference.load('runs/default')               # newest checkpoint, one device
    session.translate(['A man is riding a bike.'])          # -> ['Ein Mann fährt Fahrrad.']
    session.hypotheses(['A dog.'], nbest=4, beam_size=4)    # -> [[Hypothesis(text, score, ...)]]
    session.hypotheses(['A dog.'], nbest=3, sample=True, temperature=0.7, seed=1)
    session.score(['A dog.'], ['Ein Hund.'])                # -> [log P(reference | source)]
    lm = inference.load('runs/shakespeare')
    lm.generate('ROMEO:', num_tokens=50)                    # -> 'ROMEO:' + 50 characters

Search settings default to the workdir's `config.decode` (beam size, alpha, max_new_tokens,
min_new_tokens, batch size, temperature, top_k). Bad arguments raise `ValueError`; a workdir
that cannot be restored raises `inference.RestoreError` (one line).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence

import jax

from autoregressive.scoring import score_references
from autoregressive.translator import (
  Hypothesis,
  Sampling,
  Translator,
  generate as generate_ids,
)
from common.tokens import DEFAULT_MIN_NEW_TOKENS, truncate
from inference import restore as restore_lib
from model.kinds import adapter_of


def load(workdir: str, *, step: int | None = None, average_last: int = 1,
         mesh: jax.sharding.Mesh | None = None) -> Session:
  """Restores `workdir`'s parameters (the newest checkpoint, or `step`; the average of the
  last `average_last`) onto one device, or sharded over `mesh` -> a `Session`."""
  return Session(restore_lib.Restored(workdir, step, average_last, mesh))


class Session:
  """A restored model with its tokenizer: `translate`, `hypotheses`, `score` (a model with a
  source) or `generate` (a language model). `restored` is the `inference.restore.Restored`
  (config, module, params, tokenizer, step); `warn(message)` hears about truncated inputs
  and capped lengths (default: `warnings.warn`)."""

  def __init__(self, restored, warn: Callable[[str], None] | None = None):
    self.restored = restored
    self.config, self.module, self.params = restored.config, restored.module, restored.params
    self.tokenizer, self.step, self.kind = restored.tokenizer, restored.step, restored.kind
    self.warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    self.translates = adapter_of(self.module).has_source
    if not adapter_of(self.module).has_decoder:
      raise ValueError(f'a {self.kind} model has no decoder: there is nothing to decode')

  # -- settings ------------------------------------------------------------------------------
  def _default(self, name: str, value, fallback=None):
    return value if value is not None else self.config.decode.get(name, fallback)

  def max_new_tokens(self, max_new_tokens: int | None = None) -> int:
    """Generated tokens per sentence: `max_new_tokens` or config.decode.max_new_tokens, at
    most the model's positions (capped with a warning)."""
    value = self._default('max_new_tokens', max_new_tokens)
    model_max = self.module.config.max_len
    if value > model_max:
      self.warn(f'max_new_tokens {value} is more than the model\'s max_len {model_max}; '
                f'using {model_max}')
    return min(value, model_max)

  def min_new_tokens(self, min_new_tokens: int | None, max_new_tokens: int) -> int:
    """Tokens an output has at least before EOS: `min_new_tokens` or
    config.decode.min_new_tokens (1 when the config predates it), at most `max_new_tokens`."""
    value = self._default('min_new_tokens', min_new_tokens, DEFAULT_MIN_NEW_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f'min_new_tokens must be an integer >= 0, got {value!r}')
    if value > max_new_tokens:
      raise ValueError(f'min_new_tokens={value} is more than max_new_tokens={max_new_tokens}')
    return value

  def translator(self, *, beam_size: int | None = None, alpha: float | None = None,
                 max_new_tokens: int | None = None, batch_size: int | None = None, nbest: int = 1,
                 sample: bool = False, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0,
                 min_new_tokens: int | None = None) -> Translator:
    """The `Translator` for these settings: beam search (`beam_size > 1`), greedy
    (`beam_size=1`) or sampling (`sample=True`: `nbest` samples, `temperature`, `top_k`,
    `top_p`, `seed`). Every search generates at least `min_new_tokens` tokens before EOS
    (default config.decode.min_new_tokens). Settings that do not apply to the chosen search are
    refused."""
    self._require(True, 'translation')
    if sample:
      if beam_size not in (None, 1) or alpha is not None:
        raise ValueError('sampling draws one token at a time: beam_size and alpha do not apply')
      sampling = Sampling(temperature=self._default('temperature', temperature, 1.0),
                          top_k=self._default('top_k', top_k, 0) or None, top_p=top_p, seed=seed)
      beam_size = 1
    else:
      if temperature is not None or top_k is not None or top_p is not None:
        raise ValueError('temperature, top_k and top_p apply to sampling: pass sample=True')
      sampling, beam_size = None, self._default('beam_size', beam_size)
      if nbest > beam_size:
        raise ValueError(f'nbest={nbest} is more than the beam size {beam_size}')
    max_new_tokens = self.max_new_tokens(max_new_tokens)
    return Translator(self.module, self.params, beam_size=beam_size,
                      alpha=self._default('alpha', alpha), max_new_tokens=max_new_tokens,
                      min_new_tokens=self.min_new_tokens(min_new_tokens, max_new_tokens),
                      batch_size=self._default('batch_size', batch_size, 64),
                      eos_id=self.tokenizer.eos_id, nbest=nbest, sampling=sampling)

  def _require(self, translation: bool, what: str) -> None:
    if self.translates != translation:
      needs = 'a model with a source' if translation else 'a language model'
      raise ValueError(f'{what} needs {needs}; this is a {self.kind} model')

  # -- translation ---------------------------------------------------------------------------
  def encode(self, lines: Sequence[str], first_line: int = 1) -> list[list[int] | None]:
    """Source ids per line (EOS-terminated); empty lines -> None; a line longer than the
    model's positions is truncated (with a warning naming the line: `lines[0]` is line
    `first_line` of the input)."""
    limit, sources = self.module.config.max_len, []
    for number, line in enumerate(lines, start=first_line):
      if not line.strip():
        sources.append(None)
        continue
      ids = list(self.tokenizer.encode(line))
      if len(ids) > limit:
        self.warn(f'input line {number} has {len(ids)} tokens, more than the model\'s max_len '
                  f'{limit}; truncated')
      sources.append(truncate(ids, limit, self.tokenizer.eos_id))
    return sources

  @staticmethod
  def _lines(lines) -> Sequence[str]:
    """`lines` checked: a sequence of strings (a string alone is refused: iterating it would
    translate each character)."""
    if isinstance(lines, (str, bytes)) or not all(isinstance(x, str) for x in lines):
      raise ValueError(f'lines must be a list of strings (one sentence each), got '
                       f'{type(lines).__name__}: pass [text] for one sentence')
    return lines

  def translate(self, lines: Sequence[str], **settings) -> list[str]:
    """The best translation of each line ('' for an empty line). `settings`: as `translator`."""
    return [h[0].text if h else '' for h in self.hypotheses(lines, **settings)]

  def hypotheses(self, lines: Sequence[str], *, nbest: int = 1, **settings
                 ) -> list[list[Hypothesis]]:
    """`nbest` `Hypothesis` (text, score, log_prob, tokens) per line, best first ([] for an
    empty line): the beam's best, or `nbest` samples with `sample=True`."""
    translator = self.translator(nbest=nbest, **settings)
    found = translator.search(self.encode(self._lines(lines)))
    return [self.with_text(h) for h in found]

  def with_text(self, hypotheses: list[Hypothesis] | None) -> list[Hypothesis]:
    """The hypotheses with their detokenized `text` ([] for None: an empty line)."""
    return [dataclasses.replace(h, text=self.tokenizer.decode(h.tokens))
            for h in hypotheses or []]

  def score(self, sources: Sequence[str], references: Sequence[str], *,
            batch_size: int | None = None) -> list[float | None]:
    """log P(reference | source) under the model (forced decoding; EOS included), None for
    an empty source line. A reference longer than the model's positions is a ValueError."""
    self._require(True, 'scoring references')
    sources, references = self._lines(sources), self._lines(references)
    if len(sources) != len(references):
      raise ValueError(f'{len(sources)} sources but {len(references)} references')
    limit, targets = self.module.config.max_len, []
    for number, line in enumerate(references, start=1):
      ids = list(self.tokenizer.encode(line))
      if len(ids) > limit:
        raise ValueError(f'reference line {number} has {len(ids)} tokens, more than the '
                         f'model\'s max_len {limit}: it cannot be scored')
      targets.append(ids)
    return score_references(self.module, self.params, self.encode(sources), targets,
                            batch_size=self._default('batch_size', batch_size, 64))

  # -- language model ------------------------------------------------------------------------
  def generate(self, prompt: str, *, include_prompt: bool = True, **settings) -> str:
    """`prompt` and its continuation (only the continuation with `include_prompt=False`);
    `settings` as `generate_ids`. The same seed gives the same text."""
    _, new = self.generate_ids(prompt, **settings)
    text = self.tokenizer.decode(new)
    return prompt + text if include_prompt else text

  def generate_ids(self, prompt: str, *, num_tokens: int | None = None,
                   temperature: float | None = None, top_k: int | None = None,
                   top_p: float | None = None, seed: int = 0, line: int = 0,
                   min_new_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids): `prompt` continued by up to `num_tokens` tokens (default
    config.decode.max_new_tokens), sampled at `temperature` (0 = greedy; default
    config.decode.temperature) from the `top_k` most likely tokens (0 = all) and/or the nucleus
    `top_p`, at least `min_new_tokens` of them before an EOS (default
    config.decode.min_new_tokens); past the model's context it continues in windows of its
    last half."""
    self._require(False, 'generate')
    tok = self.tokenizer
    try:
      ids = list(tok.encode(prompt))
    except Exception as e:  # noqa: BLE001  # a character outside a character vocabulary
      raise ValueError(str(e)) from None
    if tok.eos_id is not None and ids and ids[-1] == tok.eos_id:
      ids = ids[:-1]  # continue the text, do not start after its end
    num_tokens = self._default('max_new_tokens', num_tokens)
    new = generate_ids(self.module, self.params, ids, num_tokens=num_tokens,
                       min_new_tokens=self.min_new_tokens(min_new_tokens, num_tokens),
                       temperature=self._default('temperature', temperature, 1.0),
                       top_k=self._default('top_k', top_k, 0), top_p=top_p, seed=seed,
                       line=line,
                       eos_id=tok.eos_id, warn=self.warn)
    return ids, new
