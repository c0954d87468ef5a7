"""Pieces of one-line error messages."""

from __future__ import annotations

from collections.abc import Sequence


def first_few(items: Sequence[str], shown: int = 3, sep: str = '; ') -> str:
  """The first `shown` items joined by `sep`, then ' (+N more)' when there are more:
  a long list of problems stays one readable line."""
  more = f' (+{len(items) - shown} more)' if len(items) > shown else ''
  return sep.join(items[:shown]) + more
