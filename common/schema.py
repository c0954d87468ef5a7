"""What every config section's schema shares (`model.ModelConfig` and configs/schema.py).

A section is a frozen dataclass whose fields carry their default and a one-line doc
(`documented`), and optionally their choices. `Schema.from_config` builds one from a ConfigDict
or dict: a field name it does not know is refused with the closest known ones ('did you
mean'), then `validate()` refuses a value outside its field's choices and checks the section's
own bounds. `did_you_mean` is the one hint for a field name nothing has (the resolver's, for
an override: configs/resolve.py).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from common.errors import ConfigError

DOC, CHOICES = 'doc', 'choices'


def documented(default: Any = dataclasses.MISSING, doc: str = '', *,
               factory: Any = dataclasses.MISSING, choices: Sequence[Any] | None = None,
               **metadata) -> Any:
  """A dataclass field with its default (or `factory`), its one-line doc and, when given, the
  values it may take (checked by `Schema.from_config`, listed by --show_config)."""
  metadata[DOC] = doc
  if choices is not None:  # kept as given: a registry (a dict) may gain rows after import
    metadata[CHOICES] = choices
  return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


def default_of(field: dataclasses.Field) -> Any:
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


class Schema:
  """The base of a section's dataclass: `SECTION` names it in messages ('config.SECTION.x')."""
  SECTION: ClassVar[str] = ''

  @classmethod
  def from_config(cls, values: Mapping[str, Any] | None):
    """Builds from a ConfigDict/dict (a missing field takes its default; an unknown one is an
    error naming the closest known ones) and validates."""
    values = dict((values or {}).items())
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
      hint = (did_you_mean(f'{cls.SECTION}.{unknown[0]}', [(cls.SECTION, k) for k in known])
              or f'known: {sorted(known)}')
      raise ConfigError(f'config.{cls.SECTION} has unknown field(s) {unknown}; {hint}')
    config = cls(**values)
    config.validate()
    return config

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    return {f.name: default_of(f) for f in dataclasses.fields(cls)}

  def dotted(self, field: str) -> str:
    return f'config.{self.SECTION}.{field}'

  def validate(self) -> None:
    """Raises `ConfigError` for a value outside its field's choices (in field order); a
    section adds its bounds and the rules between its fields after calling this."""
    for field in dataclasses.fields(self):
      choices = field.metadata.get(CHOICES)
      value = getattr(self, field.name)
      if choices is not None and value not in choices:
        raise ConfigError(f'{self.dotted(field.name)}={value!r} is not one of {list(choices)}')


# ---------------------------------------------------------------------------- value tests

def require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_float32(value) -> float:
  """`value` as it is in float32 (b2=0.99999999 is 1.0 there)."""
  return float(np.float32(value))


def in_unit(value, *, closed: bool = False) -> bool:
  """A number in [0, 1) (or [0, 1] when `closed`), also after rounding to float32."""
  return (is_number(value) and 0 <= value and 0 <= as_float32(value)
          and (as_float32(value) <= 1 if closed else as_float32(value) < 1))


# ---------------------------------------------------------------------------- did you mean

def leaf_paths(node, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
  """Every leaf field of a nested config (ConfigDict or dict), as key paths."""
  out = []
  for key in node.keys():
    value = node[key]
    out += leaf_paths(value, prefix + (key,)) if hasattr(value, 'keys') else [prefix + (key,)]
  return out


def _similarity(typed: str, field: str) -> tuple[float, float]:
  """How alike two field names are -> (score, difflib's ratio). The score is the ratio, or
  the share of `typed`'s words (split at '_') found in `field` when higher, so that num_layers
  is closest to num_encoder_layers and num_decoder_layers rather than to scan_layers."""
  words = typed.split('_')
  shared = sum(w in field.split('_') for w in words) / len(words)
  ratio = difflib.SequenceMatcher(None, typed, field).ratio()
  return max(ratio, shared), ratio


def close_fields(name: str, paths: Iterable[Sequence[str]]) -> list[str]:
  """The field paths most like the unknown dotted `name`, ranked by the similarity of the last
  component (on ties: same section first, then difflib's ratio): every one within 0.1 of the
  best, if the best reaches 0.6; at most 4, as 'config.section.field'."""
  *section, last = name.split('.')
  ranked = []
  for path in paths:
    score, ratio = _similarity(last, path[-1])
    ranked.append((-score, list(path[:-1]) != section, -ratio, tuple(path)))
  ranked.sort()
  if not ranked or -ranked[0][0] < 0.6:
    return []
  return ['.'.join(('config',) + r[-1]) for r in ranked[:4] if -r[0] >= -ranked[0][0] - 0.1]


def did_you_mean(name: str, paths: Iterable[Sequence[str]]) -> str:
  """'did you mean config.a.b or config.c.d?' for the unknown dotted `name` (`close_fields`),
  '' when no field is close."""
  close = close_fields(name, paths)
  return f'did you mean {" or ".join(close)}?' if close else ''
