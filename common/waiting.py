"""Blocking waits that leave the main thread's signal handlers free to run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar('T')


def wait_interruptibly(fn: Callable[[], T], poll_seconds: float = 0.1) -> T:
  """`fn()`, run in a helper thread while the main thread waits for it in short slices.

  Python runs signal handlers only in the main thread, between bytecodes. A signal that the
  kernel delivers to another thread (XLA and Orbax start many) does not interrupt a main
  thread blocked in C (a join, a lock), so a second Ctrl-C during a long checkpoint write
  would wait for the write. Here the main thread returns to Python every `poll_seconds`.
  Off the main thread this is just `fn()`.
  """
  if threading.current_thread() is not threading.main_thread():
    return fn()
  outcome: dict[str, object] = {}
  done = threading.Event()

  def run() -> None:
    try:
      outcome['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except  # re-raised in the caller
      outcome['error'] = e
    finally:
      done.set()

  threading.Thread(target=run, name=f'wait:{getattr(fn, "__name__", "fn")}', daemon=True).start()
  while not done.wait(poll_seconds):
    pass
  if 'error' in outcome:
    raise outcome['error']  # type: ignore[misc]
  return outcome['value']  # type: ignore[return-value]
