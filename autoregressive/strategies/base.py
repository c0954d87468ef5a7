"""What every decoding strategy shares: its settings as a frozen dataclass whose fields carry
a default, bounds and a one-line help (`setting`), the checks they get, the `Limits` every
strategy takes (lengths, batch size, hypotheses per sentence), the `Hypothesis` a search
returns, and how a strategy runs over a list of sentences in batches (`search_in_batches`).

The checks are the only ones: config.decode (configs/schema.py), decode.py's flags
(inference/decode_cli.py) and `Session`'s arguments all call `check` with their own name for
the value ('config.decode.alpha', '--alpha', 'alpha'), so a bound exists once.

`search_in_batches` runs a strategy over a list of sources (what every `Session` decodes
with): the batches' padded length (a few shapes, so a few programs), and running them on a
few worker threads, results in order (on a CPU a batch's program is a chain of small ops that
mostly keep one core busy, so two batches at once use two cores; test2016, batch 64, 2 cores:
1.5x the sentences per second at beam 4, 1.4x greedy). Sources are token ids (EOS-terminated,
as the tokenizer gives them); a source longer than the model's positions is cut by
`common.tokens.truncate`, the training pipeline's rule. Batches hold sentences of similar
length, padded to a multiple of `LENGTH_MULTIPLE` tokens and to a fixed number of rows (a
whole file: the batch size; a stream: the next power of two), so a whole test set, or a stream
of any rhythm, compiles only a few shapes. A sentence's random draws depend on its index
(`line_ids`), so it gets the same samples whatever batch, bucket or stream rhythm it comes in.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from common.dtype_limits import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX
from common.schema import documented, is_int, is_number
from common.tokens import DEFAULT_MIN_NEW_TOKENS, EOS_ID, PAD_ID, truncate

LOW, HIGH, LOW_OPEN, RULE, IN_CONFIG = 'low', 'high', 'low_open', 'rule', 'in_config'
NBEST_MAX = 1024  # an n-best list is at most a beam (beam.py's BEAM_SIZE_MAX); as many samples
DECODE_BATCH_MAX = 65_536  # sentences per batch
# A language model's generation (`Session.generate`'s num_tokens, decode.py's --num_tokens):
# it continues in windows past the model's positions, so only this bounds it.
NUM_TOKENS_MAX = 1_000_000


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
  (missing fields take their defaults) and checks it, naming a bad value `where(field)`.
  Made directly (`BeamSearch(beam_size=0)`), one is checked the same way, each value named by
  its field: a bad one is a ValueError (one line), never a search that fails later or
  silently does something else."""
  NAME: ClassVar[str] = ''
  HELP: ClassVar[str] = ''

  def __post_init__(self) -> None:
    self._check(lambda name: name)

  def _check(self, where) -> None:
    for field in dataclasses.fields(self):
      check(field, getattr(self, field.name), where(field.name))
    self.check_more(where)

  @classmethod
  def built(cls, values: dict[str, Any], where=lambda name: name):
    known = {f.name: f for f in dataclasses.fields(cls)}
    chosen = {k: v for k, v in values.items() if k in known and v is not None}
    unchecked = object.__new__(cls)  # checked first with `where`'s names, then made
    for field in dataclasses.fields(cls):
      object.__setattr__(unchecked, field.name, chosen.get(field.name, field.default))
    unchecked._check(where)
    return cls(**chosen)

  def check_more(self, where) -> None:
    """The rules between fields (a subclass adds them); `where(field)` names a value."""


@dataclasses.dataclass(frozen=True)
class Strategy(Settings):
  """A row of the strategy table: settings plus `search`, over a batch of sources."""

  def check_nbest(self, nbest: int, where: str) -> None:
    """Refuses more hypotheses per sentence than the strategy finds (default: any number)."""

  def check_given(self, given: Iterable[str], where) -> None:
    """Refuses settings given explicitly (`given`: their names) that these settings would
    ignore, e.g. sampling's top_k at temperature 0 (default: none); `where(name)` names one.
    A value that only comes from config.decode is not refused: it is the config's default."""

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


def stopped_at_limit(tokens, max_new_tokens: int, eos_id: int | None) -> bool:
  """Whether an output stopped at the token limit (`Limits.max_new_tokens`), not at EOS: likely
  a repetition loop. decode.py's and a sweep's evaluation count these "cut" lines."""
  return len(tokens) >= max_new_tokens and (eos_id is None or tokens[-1] != eos_id)


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



def check_token_ids(ids: Any, name: str, vocab_size: int) -> np.ndarray:
  """`ids` (a sequence or a concrete array of token ids) as a NumPy array, else ValueError (one
  line): every id an integer in [0, vocab_size) (an id the model has no row for decoded to
  nothing, silently; a float was truncated, a negative one wrapped around)."""
  if isinstance(ids, (str, bytes)) or not hasattr(ids, '__len__'):
    raise ValueError(f'{name} must be token ids (a sequence of integers), got '
                     f'{type(ids).__name__}')
  try:
    array = np.asarray(ids)
  except (ValueError, TypeError, OverflowError) as e:  # ragged rows, huge ints
    raise ValueError(f'{name} must be token ids (integers in [0, {vocab_size})): '
                     f'{" ".join(str(e).split())}') from None
  if array.size and array.dtype.kind not in 'iu':
    raise ValueError(f'{name} must be token ids (integers in [0, {vocab_size})), got '
                     f'{array.dtype} values' + (f' such as {array.flat[0]!r}' if array.dtype.kind
                                                in 'fcbO' else ''))
  if array.size and (array.min() < 0 or array.max() >= vocab_size):
    bad = array.min() if array.min() < 0 else array.max()
    raise ValueError(f'{name} has token id {int(bad)}, outside the model\'s vocabulary '
                     f'[0, {vocab_size})')
  return array


def check_sources(sources: Any, vocab_size: int) -> list:
  """`search_in_batches`' sources checked: a list of token-id sequences (or None), each id an
  integer in [0, vocab_size) -> the list (ValueError naming the source otherwise)."""
  if isinstance(sources, (str, bytes)) or not isinstance(sources, Iterable):
    raise ValueError('sources must be a list of token-id sequences (one per sentence; None for '
                     f'an empty line), got {type(sources).__name__}')
  sources = list(sources)
  for i, source in enumerate(sources):
    if source is not None:
      array = check_token_ids(source, f'sources[{i}]', vocab_size)
      if array.ndim != 1:
        raise ValueError(f'sources[{i}] must be one sequence of token ids, got shape '
                         f'{array.shape}')
  return sources


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


# Batches are padded to a multiple of this many positions: a whole test set compiles a few
# shapes.
LENGTH_MULTIPLE = 16


def padded_length(rows: Iterable[Sequence[int]], limit: int) -> int:
  """The padded length of a batch of `rows`: the longest, rounded up to LENGTH_MULTIPLE, at
  most `limit` (the model's positions)."""
  return min(limit, -(-max(1, *map(len, rows)) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)


def default_workers() -> int:
  """Batches decoded at once by default: 2 on a CPU with 2 cores or more (XLA's own threads
  split only the larger ops), else 1 (an accelerator runs one program at a time anyway)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return 2 if jax.default_backend() == 'cpu' and (cores or 1) >= 2 else 1


def in_order(fn: Callable, batches: Iterable, workers: int, ready: set,
             shape: Callable[[object], Hashable] = lambda batch: batch[1].shape) -> Iterator:
  """`fn(batch)` for each of `batches`, yielded in order; with `workers` > 1 that many run at
  once. The first batch of a shape (`shape(batch)`: default, that of the batch's second item)
  not in `ready` (the shapes that have run) runs before the others of its shape start, so
  that each shape compiles once; the first batches of the new shapes are taken up before all
  others, so that their programs load (or compile) side by side rather than one worker
  waiting idle for another's (batches sorted by length put each shape's batches together).
  `ready` gains each shape that has run."""
  def run(batch, first):
    if first is not None:
      first.result()  # compiled (or failed: then this batch fails the same way)
    found = fn(batch)
    ready.add(shape(batch))
    return found

  if workers <= 1:
    yield from (run(batch, None) for batch in batches)
    return
  batches, pending = list(batches), collections.deque()
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    firsts, early = {}, {}  # a new shape -> its first batch's future; that batch's index -> it
    for i, batch in enumerate(batches):
      key = shape(batch)
      if key not in ready and key not in firsts:
        firsts[key] = early[i] = pool.submit(run, batch, None)
    for i, batch in enumerate(batches):
      # FIFO: every first-of-shape was taken up before this batch, so waiting on it is safe.
      pending.append(early[i] if i in early else pool.submit(run, batch, firsts.get(shape(batch))))
      while len(pending) > workers:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()


# A search's settings -> the batch shapes it has run (compiled) in this process.
_RAN_SHAPES: dict[tuple, set[tuple[int, ...]]] = {}


def _bucket_rows(n: int, batch_size: int) -> int:
  """The next power of two >= n, at most `batch_size`: few shapes for batches of any size."""
  return min(batch_size, 1 << max(0, n - 1).bit_length())


def search_in_batches(model, strategy, limits, sources: Sequence[Sequence[int] | None], *,
                      eos_id: int | None = EOS_ID, progress: Callable[[int], None] | None = None,
                      line_ids: Sequence[int] | None = None, scores: bool = True,
                      fixed_rows: bool = True, drop_finished: bool | int = True,
                      workers: int | None = None) -> list:
  """`strategy`'s hypotheses (`limits.nbest` per source, best first) of every source under
  `model` (an NNX model; a `Session` passes the split it keeps), None where the source is None.

  Sources are decoded sorted by length (longest first) in batches of `limits.batch_size`;
  `fixed_rows` pads every batch to that many rows (one shape for a whole file), else to the
  next power of two (a stream's few waiting lines). `line_ids` (default: the positions) seed
  the samples; `scores=False` skips the forced-decoding pass that scores greedy and sampled
  outputs (their scores are then NaN). `progress(n)` hears after each batch how many
  sentences it held. `workers` batches run at once (None: `default_workers()`); any number,
  and `drop_finished`, give the same outputs.
  """
  sources = check_sources(sources, model.config.vocab_size)
  line_ids = range(len(sources)) if line_ids is None else line_ids
  model_len = model.config.max_len
  # Longest first: the slowest batches start first, so that a pass does not end with one
  # worker on the longest batch while the others wait (test2016, 2 workers: warm passes
  # 3-4% shorter than shortest first). Any order gives the same outputs.
  order = sorted((i for i, s in enumerate(sources) if s is not None),
                 key=lambda i: len(sources[i]), reverse=True)
  batches, size = [], limits.batch_size
  for first in range(0, len(order), size):
    chunk = order[first:first + size]
    cut = [truncate(sources[i], model_len, eos_id) for i in chunk]
    rows = size if fixed_rows else _bucket_rows(len(chunk), size)
    inputs = np.zeros((rows, padded_length(cut, model_len)), np.int32)
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
    tokens, found = strategy.search(model, inputs, limits=limits, eos_id=eos_id,
                                    line_ids=[line_ids[i] for i in chunk], scores=scores,
                                    drop_finished=drop_finished)
    return chunk, strategy.hypotheses(tokens, found, eos_id=eos_id, rows=len(chunk))

  # The key is the settings that shape the search's programs; a key too coarse would only let
  # two batches compile one shape at once.
  ran = _RAN_SHAPES.setdefault((model.config, strategy.NAME, strategy.program_key(),
                                limits.max_new_tokens, eos_id, limits.nbest, str(drop_finished)),
                               set())
  workers = default_workers() if workers is None else max(1, int(workers))
  outputs: list = [None] * len(sources)
  for chunk, found in in_order(run, batches, workers, ran):
    for row, i in enumerate(chunk):
      outputs[i] = found[row]
    if progress is not None:
      progress(len(chunk))
  return outputs
