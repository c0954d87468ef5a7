"""What the command lines (train.py, decode.py, export.py) share: one-line usage errors.

Every bad flag ends in one `PROG: error: ...` line on stderr and exit status 2, never a
traceback or absl's two-line `FATAL Flags parsing error`. Numbers are range-checked in the
type they are used in: an int flag becomes an int32/int64 array index or a PRNG seed, a
float flag a float32 scalar on the device, so `1e308` (finite in Python, inf in float32) or
`99999999999999999999` (an OverflowError deep inside NumPy) are refused up front.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from absl import flags

from common.dtype_limits import INT32_MAX
from workdir import orbax_noise

# The most checkpoints a restore averages (decode.py's --average_last, `inference.load`'s).
AVERAGE_LAST_MAX = 10_000


class UsageError(ValueError):
  """A bad flag value: printed as one line, exit status 2."""


def fail(prog: str, message, code: int = 2) -> None:
  """Prints `PROG: error: MESSAGE` (whitespace folded to one line) and exits."""
  print(f'{prog}: error: {" ".join(str(message).split())}', file=sys.stderr, flush=True)
  if orbax_noise.abandoned_work():  # no shutdown for Orbax's leftovers to print in
    sys.stdout.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def check_int(name: str, value: int | None, *, lo: int, hi: int = INT32_MAX) -> None:
  """`--NAME=VALUE` must be an integer in [lo, hi] (None = not given, accepted)."""
  if value is None:
    return
  if not lo <= value <= hi:
    raise UsageError(f'--{name}={value} must be an integer in [{lo}, {hi}]')


def parse_absl_flags(prog: str, argv: Sequence[str]) -> list[str]:
  """absl's flag parsing with `PROG: error: ...` and exit 2 for a bad value (`--beam_size=abc`),
  an unknown flag or a missing value, instead of absl's `FATAL Flags parsing error` and exit 1.
  Use as `app.run(main, flags_parser=lambda argv: parse_absl_flags('decode.py', argv))`."""
  try:
    with help_exits_zero(argv):
      return flags.FLAGS(list(argv))
  except flags.Error as e:
    fail(prog, e)
  return []  # not reached


# absl's help flags (`app.define_help_flags`): each prints and exits 1 (absl's convention).
HELP_FLAGS = ('help', 'helpshort', 'helpfull', 'helpxml', '?')


@contextlib.contextmanager
def help_exits_zero(argv: Sequence[str]):
  """Around absl's flag parsing: `--help` (`--helpshort`, `--helpfull`, `--helpxml`, `-?`),
  which prints the usage and exits 1 in absl, exits 0 as any command's help does (1 is a
  failure under a valid command line here)."""
  try:
    yield
  except SystemExit as e:
    if e.code == 1 and _asks_for_help(argv):
      sys.stdout.flush()
      raise SystemExit(0) from None
    raise


def _asks_for_help(argv: Sequence[str]) -> bool:
  for arg in list(argv)[1:]:
    if arg == '--':
      break
    if arg.startswith('-') and arg.lstrip('-').split('=', 1)[0] in HELP_FLAGS:
      return True
  return False


def absl_flags_parser(prog: str) -> Callable[[Sequence[str]], list[str]]:
  """The `flags_parser` for `absl.app.run` that reports bad flags as one line."""
  return lambda argv: parse_absl_flags(prog, argv)
