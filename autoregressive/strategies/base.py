"""What every decoding strategy shares: its settings as a frozen dataclass whose fields carry
a default, bounds and a one-line help (`setting`), the checks they get, the `Limits` every
strategy takes (lengths, batch size, hypotheses per sentence), and the `Hypothesis` a search
returns.

The checks are the only ones: config.decode (configs/schema.py), decode.py's flags
(inference/decode_cli.py) and `Session`'s arguments all call `check` with their own name for
the value ('config.decode.alpha', '--alpha', 'alpha'), so a bound exists once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from common.dtype_limits import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX
from common.schema import documented, is_int, is_number
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, PAD_ID

LOW, HIGH, LOW_OPEN, RULE, IN_CONFIG = 'low', 'high', 'low_open', 'rule', 'in_config'
NBEST_MAX = 1024  # an n-best list is at most a beam (beam.py's BEAM_SIZE_MAX); as many samples
DECODE_BATCH_MAX = 65_536  # sentences per batch


def setting(default: Any, help: str, *, low: float, high: float, low_open: bool = False,
            rule: str | None = None, in_config: bool = True) -> Any:
  """A settings field: its default, one-line `help`, bounds [low, high] ((low, high] with
  `low_open`; `rule` words them when a subclass's `check_more` narrows them) and whether
  config.decode has it (else it is per call: a seed, an n-best size)."""
  return documented(default, help, **{LOW: low, HIGH: high, LOW_OPEN: low_open, RULE: rule,
                                      IN_CONFIG: in_config})


def _field_type(field: dataclasses.Field) -> str:
  return field.type if isinstance(field.type, str) else field.type.__name__


def check(field: dataclasses.Field, value: Any, where: str) -> None:
  """`value` of `field` within its type and bounds, else ValueError('WHERE=VALUE must be ...')."""
  low, high, low_open = field.metadata[LOW], field.metadata[HIGH], field.metadata[LOW_OPEN]
  if _field_type(field) == 'int':
    if not (is_int(value) and low <= value <= high):
      raise ValueError(f'{where}={value!r} must be {rule_of(field)}')
    return
  ok = (is_number(value) and math.isfinite(value) and abs(value) <= FLOAT32_MAX
        and (value == 0 or abs(value) >= FLOAT32_TINY)  # a subnormal flushes to 0 on devices
        and (value > low if low_open else value >= low) and value <= high)
  if not ok:
    raise ValueError(f'{where}={value!r} must be {rule_of(field)}')


def rule_of(field: dataclasses.Field) -> str:
  """What a value of `field` must be, in words ('a number in (0, 1]')."""
  low, high, low_open = field.metadata[LOW], field.metadata[HIGH], field.metadata[LOW_OPEN]
  if field.metadata[RULE]:
    return field.metadata[RULE]
  if _field_type(field) == 'int':
    return f'an integer in [{low}, {high}]'
  return f'a number in {"(" if low_open else "["}{low:g}, {high:g}] (a normal float32)'


@dataclasses.dataclass(frozen=True)
class Settings:
  """The base of a settings dataclass. `built(values, where)` makes one from a mapping
  (missing fields take their defaults) and checks it, naming a bad value `where(field)`."""
  NAME: ClassVar[str] = ''
  HELP: ClassVar[str] = ''

  @classmethod
  def built(cls, values: dict[str, Any], where=lambda name: name):
    known = {f.name: f for f in dataclasses.fields(cls)}
    chosen = {k: v for k, v in values.items() if k in known and v is not None}
    for name, value in chosen.items():
      check(known[name], value, where(name))
    made = cls(**chosen)
    made.check_more(where)
    return made

  def check_more(self, where) -> None:
    """The rules between fields (a subclass adds them); `where(field)` names a value."""


@dataclasses.dataclass(frozen=True)
class Strategy(Settings):
  """A row of the strategy table: settings plus `search`, over a batch of sources."""

  def check_nbest(self, nbest: int, where: str) -> None:
    """Refuses more hypotheses per sentence than the strategy finds (default: any number)."""

  def describe(self) -> str:
    """A few words for decode.py's summary line ('beam 4, alpha 0.6')."""
    return self.NAME

  def program_key(self) -> tuple:
    """The settings that shape the search's compiled programs (not runtime scalars)."""
    return ()

  def search(self, module, inputs=None, *, prompt=None, limits: Limits | None = None,
             eos_id: int | None = EOS_ID, line_ids: Sequence[int] | None = None,
             scores: bool = True, drop_finished: bool | int = True
             ) -> tuple[np.ndarray, np.ndarray]:
    """The search over one batch -> (tokens `[batch, n, max_new_tokens]`, scores `[batch, n]`),
    best first: n = `limits.nbest` hypotheses per row, EOS kept and zeros after it.

    `module`: an NNX model (it holds its parameters). `inputs` `[batch, src_len]`: an
    encoder-decoder's sources; `prompt` `[batch, len]`: a decoder-only model's prompt (or an
    encoder-decoder's forced target prefix), both right-padded with 0. `limits` (default
    `Limits()`): lengths and `nbest`. `line_ids` (default: the row numbers) seed a row's
    random draws. `scores` are the strategy's own (beam search's length-normalised score,
    else log P under the model by forced decoding; `scores=False` may leave them NaN; a
    missing hypothesis, as when a tiny vocabulary has fewer than n, scores -inf).
    `drop_finished`: `loop.compact_sizes` (same outputs; False runs every row to the end)."""
    raise NotImplementedError

  def log_probs(self, scores: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """log P of hypotheses of `lengths` tokens from their `scores` (the same by default)."""
    del lengths
    return scores

  def hypotheses(self, tokens: np.ndarray, scores: np.ndarray, *, eos_id: int | None,
                 rows: int | None = None) -> list[list[Hypothesis]]:
    """`search`'s arrays as `Hypothesis` lists for the first `rows` rows (default: all),
    without the missing ones (score -inf)."""
    tokens, scores = np.asarray(tokens)[:rows], np.asarray(scores, np.float32)[:rows]
    ids = [[until_eos(t, eos_id) for t in row] for row in tokens]
    lengths = np.array([[len(i) for i in row] for row in ids], np.int32).reshape(scores.shape)
    log_probs = np.asarray(self.log_probs(scores.astype(np.float64), lengths))  # exact product
    return [[Hypothesis(i, float(s), float(p))
             for i, s, p in zip(ids[r], scores[r], log_probs[r], strict=True)
             if not np.isneginf(s)]
            for r in range(len(ids))]


@dataclasses.dataclass(frozen=True)
class Limits(Settings):
  """What every strategy takes: how long an output is, how many sentences share a batch and
  how many hypotheses each sentence gets."""
  NAME = 'limits'
  max_new_tokens: int = setting(128, 'generated tokens per sentence at most (capped at the '
                                "model's max_len)", low=1, high=INT32_MAX)
  min_new_tokens: int = setting(DEFAULT_MIN_NEW_TOKENS, 'generated tokens before EOS may end '
                                'an output (1: no empty output; 0: EOS may come first)',
                                low=0, high=INT32_MAX)
  batch_size: int = setting(64, 'sentences per decoding batch', low=1, high=DECODE_BATCH_MAX)
  nbest: int = setting(1, 'hypotheses per sentence, best first (beam search: at most the beam '
                       'size; sampling: the number of samples)', low=1, high=NBEST_MAX,
                       in_config=False)

  def check_more(self, where) -> None:
    if self.min_new_tokens > self.max_new_tokens:
      raise ValueError(f'{where("min_new_tokens")}={self.min_new_tokens} is more than '
                       f'{where("max_new_tokens")}={self.max_new_tokens}: no output could end '
                       'before the limit')


def fit_to_positions(max_new_tokens, max_len: int) -> tuple[Any, bool]:
  """`max_new_tokens` capped at a model's `max_len` positions (no output can be longer) ->
  (the value to use, whether it was capped). A value that is not an integer is left as it is,
  for the settings' checks to name."""
  if is_int(max_new_tokens) and max_new_tokens > max_len:
    return max_len, True
  return max_new_tokens, False


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One output: `tokens` (ids, EOS included when generated), `score` (the search's score:
  beam search's length-normalised `log_prob / ((5 + len) / 6) ** alpha`; greedy and sampling
  do not normalise, so it is `log_prob`) and `log_prob` (the sum of the tokens'
  log-probabilities under the model, untempered)."""
  tokens: list[int]
  score: float
  log_prob: float
  text: str | None = None  # the detokenized tokens (a `Session` fills it in)

  def as_dict(self) -> dict:
    """{'text', 'score', 'log_prob', 'tokens'}: one hypothesis of `decode.py`'s jsonl."""
    return {'text': self.text, 'score': self.score, 'log_prob': self.log_prob,
            'tokens': list(self.tokens)}



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


def forced_scores(module, inputs, prompt, tokens, *, scores: bool) -> tuple[np.ndarray, np.ndarray]:
  """Outputs `tokens` `[batch, n, len]` of a search that draws one token at a time, with their
  log P under the model (forced decoding; NaN without `scores`), best first when scored."""
  tokens = np.asarray(tokens)
  batch, n, _ = tokens.shape
  if not scores:
    return tokens, np.full((batch, n), np.nan, np.float32)
  # Here, not at the top: scoring imports strategies.loop, whose package imports this module.
  from autoregressive import scoring  # pylint: disable=import-outside-toplevel
  from model.kinds import adapter_of  # pylint: disable=import-outside-toplevel
  if not adapter_of(module).has_source and prompt is None:
    inputs, prompt = None, inputs  # a language model takes a positional array as its prompt
  if prompt is None and inputs is not None:  # one jitted pass over the flattened rows
    flat = scoring.forced_log_probs(module, np.repeat(np.asarray(inputs), n, axis=0),
                                    tokens.reshape(batch * n, -1))
    log_p = flat.reshape(batch, n)
  else:
    log_p = np.asarray(scoring.sequence_log_probs(module, inputs, prompt=prompt, tokens=tokens))
  order = np.argsort(-log_p, axis=1, kind='stable')
  return (np.take_along_axis(tokens, order[..., None], axis=1),
          np.take_along_axis(log_p, order, axis=1))
