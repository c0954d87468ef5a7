"""Renamed names keep working for one release, with a `DeprecationWarning` that names the new one.

  warn_renamed(old, new)                  the one warning text, for any renamed name
  renamed_keywords(old='new', ...)        a decorator: old keyword arguments are passed under
                                          their new names (functions, Linen module methods)
  rename_keys(values, renames, where)     a config section (dict, ConfigDict): old keys moved
  renamed_field(obj, old, new)            in a dataclass' __post_init__ (a Linen module's): a
                                          value given to the deprecated field moves to the new

The old names are listed where they were renamed, so each release can drop them in one place.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, MutableMapping


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
  """DeprecationWarning "`old` is deprecated: use `new`" attributed to the caller's caller
  (`stacklevel=3`: the code that used the old name, when called from the renaming function)."""
  warnings.warn(f'{old} is deprecated: use {new} (the old form goes in the next release)',
                DeprecationWarning, stacklevel=stacklevel)


def renamed_keywords(**renames: str):
  """Decorator: a call passing an old keyword (`old=value`) runs as `new=value`, and warns.

  `renamed_keywords(max_len='max_new_tokens')`. Giving both names is a TypeError, as any
  duplicated argument is. `functools.wraps` keeps the new signature visible to `inspect` and
  the attributes Flax reads (`nn.compact`), so it also wraps Linen module methods.
  """
  def decorate(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      for old, new in renames.items():
        if old in kwargs:
          if new in kwargs:
            raise TypeError(f'{fn.__qualname__}() got both {old}= and {new}= (the same '
                            f'argument; {old}= is its deprecated name)')
          warn_renamed(f'{fn.__qualname__}({old}=...)', f'{new}=')
          kwargs[new] = kwargs.pop(old)
      return fn(*args, **kwargs)
    return wrapper
  return decorate


def rename_keys(values: MutableMapping, renames: Mapping[str, str], where: str,
                *, stacklevel: int = 4) -> MutableMapping:
  """Moves each old key of `values` (a dict or an unlocked ConfigDict) to its new name, warning
  once per key (`where` is the section's dotted name, e.g. 'config.decode'). The old key's
  value replaces the new key's: a preset built on configs/base.py has the new key at its default,
  and the old one only where someone set it. Returns `values`."""
  for old, new in renames.items():
    if old in values:
      value = values[old]
      del values[old]
      warn_renamed(f'{where}.{old}', f'{where}.{new}', stacklevel=stacklevel)
      values[new] = value
  return values


def renamed_field(obj, old: str, new: str) -> None:
  """For `__post_init__` of a frozen dataclass (a Linen module) that keeps the deprecated field
  `old` (default None, keyword-only): a value given to it moves to the field `new`, with a
  warning, and `old` is None again."""
  value = getattr(obj, old)
  if value is not None:
    warn_renamed(f'{type(obj).__name__}({old}=...)', f'{new}=', stacklevel=4)
    object.__setattr__(obj, new, value)
    object.__setattr__(obj, old, None)
