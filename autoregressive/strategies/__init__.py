"""The decoding strategies, one row each: a settings dataclass (fields with defaults, bounds
and help; `base.setting`) and its `search` over a batch of sources.

config.decode's fields, decode.py's flags, `Session`'s arguments and the trainer's validation
BLEU are all read from these rows and `base.Limits` (what every strategy takes), so a default
or a bound exists once. To add a strategy: a file here with its `Strategy` subclass (`NAME`,
`HELP`, fields, `search`; see greedy.py), a row in `TABLE`, and its tests (tests/
test_strategies.py checks every row is reachable from decode.py and from a `Session`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autoregressive.strategies.base import (
  IN_CONFIG,
  NUM_TOKENS_MAX,
  Hypothesis,
  Limits,
  Settings,
  Strategy,
  check,
  fit_to_positions,
)
from autoregressive.strategies.beam import BeamSearch
from autoregressive.strategies.greedy import Greedy
from autoregressive.strategies.sampling import Sampling

TABLE: dict[str, type[Strategy]] = {s.NAME: s for s in (BeamSearch, Greedy, Sampling)}

__all__ = ['TABLE', 'BeamSearch', 'Greedy', 'Sampling', 'Limits', 'Strategy', 'Settings',
           'Hypothesis', 'NUM_TOKENS_MAX', 'check', 'fit_to_positions', 'fields', 'config_fields',
           'choose', 'from_config']


def fields() -> dict[str, tuple[type[Settings], dataclasses.Field]]:
  """Every setting by name -> (the dataclass that owns it, its field): Limits' then the rows'.
  A name is owned once (a test checks it)."""
  out = {}
  for owner in (Limits, *TABLE.values()):
    for field in dataclasses.fields(owner):
      out.setdefault(field.name, (owner, field))
  return out


def config_fields() -> dict[str, tuple[type[Settings], dataclasses.Field]]:
  """The settings config.decode holds (the others are per call: nbest, seed, top_p)."""
  return {name: of for name, of in fields().items() if of[1].metadata[IN_CONFIG]}


def choose(strategy: str | None, beam_size: int | None) -> str:
  """The row to run: `strategy` when given (a name of `TABLE`), else beam search, or greedy
  decoding at beam size 1."""
  if strategy is None:
    return Greedy.NAME if beam_size == 1 else BeamSearch.NAME
  if strategy not in TABLE:
    raise ValueError(f'strategy {strategy!r} is not one of {sorted(TABLE)}')
  return strategy


def from_config(decode: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, *,
                strategy: str | None = None, where=lambda name: name
                ) -> tuple[Strategy, Limits]:
  """(strategy, limits) from config.decode's values with `overrides` (None = not given) on
  top, each checked: a bad override is named `where(name)` ('--alpha'), a bad config value
  'config.decode.NAME'. An override the chosen strategy does not take is refused."""
  overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
  values = {name: decode[name] for name in config_fields() if name in decode} | overrides
  owned = fields()
  unknown = sorted(set(overrides) - set(owned))
  if unknown:
    raise ValueError(f'unknown decoding setting(s) {unknown}; known: {sorted(owned)}')
  for name, value in overrides.items():  # its type and bounds first: beam_size=True is no 1
    check(owned[name][1], value, where(name))
  row = TABLE[choose(strategy, values.get('beam_size'))]
  for name in overrides:
    owner = owned[name][0]
    greedy_beam = row is Greedy and name == 'beam_size' and overrides[name] == 1
    if not (owner is Limits or issubclass(row, owner)) and not greedy_beam:  # a row's base's
      raise ValueError(f'{where(name)} applies to {owner.NAME}, not to {row.NAME} '
                       f'(choose it with {where("strategy")}={owner.NAME})')
  named = lambda name: where(name) if name in overrides else f'config.decode.{name}'  # noqa: E731
  limits = Limits.built(values, named)
  chosen = row.built(values, named)
  chosen.check_nbest(limits.nbest, named('nbest'))
  chosen.check_given(set(overrides), where)
  return chosen, limits
