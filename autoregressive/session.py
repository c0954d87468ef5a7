"""`Session`: a model, its parameters and tokenizer, ready to translate, generate and score
text. The one way to decode from Python: `inference.load(workdir)` returns one (decode.py runs
on it), and the trainer's validation BLEU builds one around the parameters it trains.

    import inference
    session = inference.load('runs/default')               # newest checkpoint, one device
    session.translate(['A man is riding a bike.'])          # -> ['Ein Mann fährt Fahrrad.']
    session.hypotheses(['A dog.'], nbest=4, beam_size=4)    # -> [[Hypothesis(text, score, ...)]]
    session.hypotheses(['A dog.'], nbest=3, strategy='sampling', temperature=0.7, seed=1)
    session.score(['A dog.'], ['Ein Hund.'])                # -> [log P(reference | source)]
    lm = inference.load('runs/shakespeare')
    lm.generate('ROMEO:', num_tokens=50)                    # -> 'ROMEO:' + 50 characters

`session.search(ids)` is the same search over token ids (no text). One batch of token ids, for
research on the search itself, is a strategy row's `search` (`autoregressive.strategies`).

Settings are those of `autoregressive.strategies` (`strategy`: a row of its TABLE; by default
beam search, greedy at beam size 1), defaulting to the config's `decode` section. Bad
arguments raise `ValueError` (one line).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Sequence

import jax
import numpy as np

from autoregressive import strategies
from autoregressive.decodable import Decodable, decoding_model
from autoregressive.scoring import score_references
from autoregressive.strategies import Hypothesis
from autoregressive.strategies.base import search_in_batches, until_eos
from autoregressive.strategies.sampling import sample
from common.dtype_limits import UINT32_MAX
from common.schema import is_int
from common.tokens import DEFAULT_MIN_NEW_TOKENS, truncate
from model.kinds import adapter_of


class Session:
  """`module` (an NNX model with a decoder, holding its parameters), its `tokenizer` and
  `config` (whose `decode` section gives the default settings): `translate`, `hypotheses`,
  `score` (a model with a source) or `generate` (a language model). `warn(message)` hears
  about truncated inputs and capped lengths (default: `warnings.warn`); `step` is the
  checkpoint's."""

  def __init__(self, module, tokenizer, config, *, step: int | None = None,
               warn: Callable[[str], None] | None = None):
    self.module, self.tokenizer, self.config = module, tokenizer, config
    self.step, self.kind = step, module.config.kind
    self.warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    self.translates = adapter_of(module).has_source
    if not adapter_of(module).has_decoder:
      raise ValueError(f'a {self.kind} model has no decoder: there is nothing to decode')

  @functools.cached_property
  def _split(self) -> Decodable:
    """The module split once (unrolled) for every batch: (config, params), the jitted
    programs' form (a split per batch would cost ~10 ms each). On first use, so that a session
    that only encodes text needs no parameters (an abstract module will do)."""
    return decoding_model(self.module)

  # -- settings ------------------------------------------------------------------------------
  def settings(self, strategy: str | None = None, **given
               ) -> tuple[strategies.Strategy, strategies.Limits]:
    """(strategy, limits) of these settings (names of `strategies.fields()`; None = the
    config's), max_new_tokens capped at the model's positions (with a warning)."""
    decode = dict(self.config.get('decode', {}))
    most = given.get('max_new_tokens')
    if most is None:
      most = decode.get('max_new_tokens', strategies.Limits.max_new_tokens)
    fitted, capped = strategies.fit_to_positions(most, self.module.config.max_len)
    if capped:
      self.warn(f'max_new_tokens {most} is more than the model\'s max_len {fitted}; '
                f'using {fitted}')
      given['max_new_tokens'] = fitted
    return strategies.from_config(decode, given, strategy=strategy)

  def search(self, sources: Sequence[Sequence[int] | None], *,
             progress: Callable[[int], None] | None = None,
             line_ids: Sequence[int] | None = None, scores: bool = True,
             fixed_rows: bool = True, **settings) -> list[list[Hypothesis] | None]:
    """The ids under `hypotheses`: `nbest` `Hypothesis` per source (token ids, EOS-terminated;
    None -> None), best first, without text. `settings` as `settings`; the others as
    `base.search_in_batches` (a progress callback, the lines that seed the samples, no
    forced-scoring pass, a stream's few rows)."""
    self._require(True, 'translation')
    chosen, limits = self.settings(**settings)
    return search_in_batches(self._split, chosen, limits, sources, eos_id=self.tokenizer.eos_id,
                             progress=progress, line_ids=line_ids, scores=scores,
                             fixed_rows=fixed_rows)

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
    if isinstance(lines, (str, bytes)):
      raise ValueError(f'lines must be a list of strings (one sentence each), got '
                       f'{type(lines).__name__}: pass [text] for one sentence')
    if not isinstance(lines, Iterable):
      raise ValueError(f'lines must be a list of strings (one sentence each), got '
                       f'{type(lines).__name__}')
    lines = list(lines)  # once: a generator checked, then read, would be empty
    for number, line in enumerate(lines, start=1):
      if not isinstance(line, str):
        raise ValueError(f'lines must be strings (one sentence each); line {number} is a '
                         f'{type(line).__name__}')
      try:
        line.encode('utf-8')
      except UnicodeEncodeError as e:  # a lone surrogate: the tokenizer's C++ would fail
        raise ValueError(f'line {number} is not valid text: {e.reason} at character '
                         f'{e.start}') from None
    return lines

  def translate(self, lines: Sequence[str], **settings) -> list[str]:
    """The best translation of each line ('' for an empty line). `settings`: as `settings`."""
    return [h[0].text if h else '' for h in self.hypotheses(lines, **settings)]

  def hypotheses(self, lines: Sequence[str], *, first_line: int = 1,
                 progress: Callable[[int], None] | None = None, scores: bool = True,
                 fixed_rows: bool = True, **settings) -> list[list[Hypothesis]]:
    """`nbest` `Hypothesis` (text, score, log_prob, tokens) per line, best first ([] for an
    empty line): the beam's best, or `nbest` samples with `strategy='sampling'`. `lines[0]`
    is line `first_line` of the input (warnings name it; a line's samples depend on it);
    the other arguments as `search`."""
    lines = self._lines(lines)
    most = UINT32_MAX + 2 - max(1, len(lines))  # line ids first_line - 1 ... seed uint32 keys
    if not (is_int(first_line) and 1 <= first_line <= most):
      raise ValueError(f'first_line={first_line!r} must be an integer in [1, {most}] (the '
                       'number of the first line, from 1)')
    found = self.search(self.encode(lines, first_line), progress=progress, scores=scores,
                        line_ids=range(first_line - 1, first_line - 1 + len(lines)),
                        fixed_rows=fixed_rows, **settings)
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
      ids = list(self.tokenizer.encode(line, target=True))
      if len(ids) > limit:
        raise ValueError(f'reference line {number} has {len(ids)} tokens, more than the '
                         f'model\'s max_len {limit}: it cannot be scored')
      targets.append(ids)
    _, limits = self.settings(batch_size=batch_size)
    return score_references(self._split, self.encode(sources), targets,
                            batch_size=limits.batch_size)

  # -- language model ------------------------------------------------------------------------
  def generate(self, prompt: str, *, include_prompt: bool = True, **settings) -> str:
    """`prompt` and its continuation (only the continuation with `include_prompt=False`);
    `settings` as `generate_ids`. The same seed gives the same text."""
    _, new = self.generate_ids(prompt, **settings)
    text = self.tokenizer.decode(new)
    return prompt + text if include_prompt else text

  def generate_ids(self, prompt: str, *, num_tokens: int | None = None, line: int = 0,
                   **settings) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids): `prompt` continued by up to `num_tokens` tokens (default
    config.decode.max_new_tokens) drawn with `strategies.Sampling`'s settings (temperature 0 =
    greedy; defaults from config.decode), at least `min_new_tokens` of them before an EOS;
    past the model's context it continues in windows of its last half."""
    self._require(False, 'generate')
    if not isinstance(prompt, str):
      raise ValueError(f'prompt must be a string, got {type(prompt).__name__}')
    if num_tokens is not None and not (is_int(num_tokens) and
                                       1 <= num_tokens <= strategies.NUM_TOKENS_MAX):
      raise ValueError(f'num_tokens={num_tokens!r} must be an integer in '
                       f'[1, {strategies.NUM_TOKENS_MAX}]')
    if not (is_int(line) and 0 <= line <= UINT32_MAX):
      raise ValueError(f'line={line!r} must be an integer in [0, {UINT32_MAX}] (it seeds the '
                       'random stream with the seed)')
    for name, instead in (('max_new_tokens', 'num_tokens'), ('strategy', None)):
      if name in settings:
        raise ValueError(f'generate takes no {name}' + (
            f': {instead} sets the length' if instead else ': it samples (temperature 0 = '
            'greedy)'))
    tok = self.tokenizer
    try:
      ids = list(tok.encode(prompt))
    except Exception as e:  # noqa: BLE001  # a character outside a character vocabulary
      raise ValueError(str(e)) from None
    if tok.eos_id is not None and ids and ids[-1] == tok.eos_id:
      ids = ids[:-1]  # continue the text, do not start after its end
    sampling, limits = strategies.from_config(
        dict(self.config.get('decode', {})), dict(settings, max_new_tokens=num_tokens),
        strategy=strategies.Sampling.NAME,
        where=lambda name: 'num_tokens' if name == 'max_new_tokens' else name)
    new = _continued(self._split, ids, num_tokens=limits.max_new_tokens,
                     min_new_tokens=limits.min_new_tokens, sampling=sampling, line=line,
                     eos_id=tok.eos_id, warn=self.warn)
    return ids, new


def _continued(model: Decodable, prompt_ids: Sequence[int], *, num_tokens: int,
               sampling: strategies.Sampling, eos_id: int | None,
               min_new_tokens: int = DEFAULT_MIN_NEW_TOKENS, line: int = 0,
               warn: Callable[[str], None] | None = None) -> list[int]:
  """Continues `prompt_ids` with a language model -> up to `num_tokens` generated ids drawn
  with `sampling`'s settings, at least `min_new_tokens` of them before an EOS. The random
  stream is fold_in(PRNGKey(seed), line): each (seed, input line) pair has its own, as
  `Session.search`'s samples (seed + line would give line 2 at seed 0 line 1's stream at seed 1).

  The model sees at most `max_len` positions (the start token, the context and the new
  tokens); longer generations continue in windows whose context is the last half of the
  model's span. `warn` hears about a prompt longer than the span (it is cut to its end).
  """
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
