"""Ctrl-C and SIGTERM as one request to stop, that a long command honours at its next safe
point even when the KeyboardInterrupt landed where Python drops it.

A signal handler raises KeyboardInterrupt wherever the main thread is; inside a callback that
Python calls for the interpreter (JAX's garbage-collection hook, `_xla_gc_callback`), the
exception is printed as "Exception ignored in ..." and lost, and the command went on to finish
with exit 0. `stop_on_signals()` makes SIGINT and SIGTERM (whose default kills the process
before any cleanup runs) raise KeyboardInterrupt and remember that they did; `check()` raises
it again at the command's next safe point (before it publishes what it wrote), and such a lost
interrupt is not printed.
"""

from __future__ import annotations

import signal
import sys
import threading

_requested = threading.Event()


def request(signum: int | None = None, frame=None) -> None:
  """The handler: remember the request, and raise KeyboardInterrupt here."""
  del signum, frame
  _requested.set()
  raise KeyboardInterrupt


def check() -> None:
  """KeyboardInterrupt if a stop was requested (a lost one included)."""
  if _requested.is_set():
    raise KeyboardInterrupt


def _quiet_lost_interrupts(unraisable) -> None:
  if not (_requested.is_set() and issubclass(unraisable.exc_type, KeyboardInterrupt)):
    sys.__unraisablehook__(unraisable)


def quiet_lost_interrupts() -> None:
  """A KeyboardInterrupt that `request` raised where Python drops it is not printed (`check()`
  raises it again); for a command whose own handler calls `request`."""
  sys.unraisablehook = _quiet_lost_interrupts


def stop_on_signals() -> None:
  """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (so `finally` blocks run)
  and are remembered for `check()`."""
  signal.signal(signal.SIGINT, request)
  signal.signal(signal.SIGTERM, request)
  quiet_lost_interrupts()
