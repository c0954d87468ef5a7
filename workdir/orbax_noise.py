"""Orbax's noise around our checkpoint calls, kept to what those calls cause.

  quiet_orbax_logs()   context manager around our Orbax calls (a restore, a Checkpointer's
                       life): Orbax/TensorStore/asyncio warnings and errors are not printed
                       (each failure reaches our code as an exception, reported in one line)

What comes later is dropped only when it is about work that Orbax abandoned inside such a
call: Orbax runs each read on a fresh event loop and closes it at the first error (a damaged
checkpoint without checksums), abandoning the other reads' tasks and TensorStore futures. They
can fail or be destroyed long after the call (even at interpreter exit); asyncio then logs each
("Task/Future exception was never retrieved", hundreds of lines of TensorStore spec), and
TensorStore's wake-ups of the closed loop are reported as unraisable `RuntimeError: Event
loop is closed`. The event loops that Orbax creates inside our calls are recorded (weakly);
asyncio's reports from those loops once they are closed are dropped, and so are closed-loop
wake-ups once Orbax failed in one of our calls (`note_failure`) or one of its loops closed
with work pending, and wake-ups of a closed loop of those at any time (a background save that
failed on a full disk closes its loop before our code hears of it); so are Orbax's warnings and
errors from its own threads once it abandoned work (a failed save's other threads report the
same failure late). Everything else is shown as usual. Checksums (verified before Orbax
reads) keep a damaged checkpoint from being read at all, so reads that fail are those of
checkpoints without them (older versions, several processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import threading
import weakref

_ORBAX_DIR = f'{os.sep}orbax{os.sep}'  # in the file names of Orbax's code
_orbax_loops: weakref.WeakSet = weakref.WeakSet()  # loops Orbax created inside our calls
_state = {'active': 0, 'abandoned': False}
_lock = threading.Lock()


class _Hide(logging.Filter):
  """Orbax's, TensorStore's and asyncio's warnings and errors, while one of our calls runs."""

  def filter(self, record: logging.LogRecord) -> bool:
    path = record.pathname or ''
    theirs = '/orbax/' in path or '/tensorstore/' in path or path.endswith('asyncio/base_events.py')
    return not (theirs and record.levelno >= logging.WARNING)


def _called_from_orbax(frame, depth: int = 6) -> bool:
  while frame is not None and depth:
    if _ORBAX_DIR in frame.f_code.co_filename:
      return True
    frame, depth = frame.f_back, depth - 1
  return False


def _record_orbax_loops() -> None:
  """Wraps the event loop policy's `new_event_loop` (once) to record the loops Orbax creates
  while one of our calls is active."""
  policy = asyncio.get_event_loop_policy()
  if getattr(policy.new_event_loop, 'records_orbax_loops', False):
    return
  create = policy.new_event_loop

  def new_event_loop():
    loop = create()
    if _state['active'] and _called_from_orbax(sys._getframe(1)):  # pylint: disable=protected-access
      _orbax_loops.add(loop)
    return loop

  new_event_loop.records_orbax_loops = True
  policy.new_event_loop = new_event_loop


def _wakes_a_closed_orbax_loop(error, tb) -> bool:
  """`Event loop is closed` raised in a wake-up (`call_soon_threadsafe`, from a TensorStore
  thread) of a loop that Orbax created in our calls and closed: a background save that failed
  closes its loop at once, before our code hears of the failure (its wait raises it later)."""
  while tb is not None:
    loop = tb.tb_frame.f_locals.get('self')
    if isinstance(loop, asyncio.AbstractEventLoop) and loop in _orbax_loops:
      return loop.is_closed()
    tb = tb.tb_next
  return False


def _is_orbax_leftover(unraisable) -> bool:
  """A wake-up of a closed loop after Orbax abandoned work (or of a closed loop of Orbax's),
  or an abandoned Orbax coroutine finalised by the garbage collector (its error is the damage
  already reported)."""
  error = unraisable.exc_value
  if isinstance(error, RuntimeError) and str(error) == 'Event loop is closed' and (
      _state['abandoned'] or _wakes_a_closed_orbax_loop(error, unraisable.exc_traceback)):
    return True
  code = getattr(getattr(unraisable, 'object', None), 'cr_code', None)  # a coroutine's
  return code is not None and _ORBAX_DIR in code.co_filename


def _install_unraisable_hook() -> None:
  """Also for threads: a thread of Orbax's that wakes a closed loop dies the same way."""
  previous, previous_thread = sys.unraisablehook, threading.excepthook
  if getattr(previous, 'drops_orbax_leftovers', False):
    return

  def hook(unraisable):
    if not _is_orbax_leftover(unraisable):
      previous(unraisable)

  def thread_hook(args):
    if not _is_orbax_leftover(args):  # .exc_value as an unraisable's; no .object
      previous_thread(args)

  hook.drops_orbax_leftovers = True
  sys.unraisablehook, threading.excepthook = hook, thread_hook


def abandoned_work() -> bool:
  """Did Orbax give up work in one of our calls? Then a program that stops should leave with
  os._exit: TensorStore's late wake-ups of the closed loop can come during the interpreter's
  shutdown, after the hooks above are gone, and print a traceback after the error line."""
  return _state['abandoned']


def _reporting_loop():
  """The event loop whose `default_exception_handler` is logging the current record, or None
  (asyncio logs a future's or task's lost error through its own loop's handler)."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    if (frame.f_code.co_name == 'default_exception_handler'
        and frame.f_code.co_filename.endswith(os.path.join('asyncio', 'base_events.py'))):
      return frame.f_locals.get('self')
    frame = frame.f_back
  return None


def _not_from_a_closed_orbax_loop(record: logging.LogRecord) -> bool:
  """False for asyncio's report of a future or task of a closed loop Orbax created in our
  calls (nobody can wait on its work any more)."""
  del record  # the loop is on the stack, not in the record
  loop = _reporting_loop()
  return loop is None or not loop.is_closed() or loop not in _orbax_loops


def _not_a_late_report_of_abandoned_work(record: logging.LogRecord) -> bool:
  """False for an Orbax warning or error logged in a thread of its own once Orbax abandoned
  work in our calls: the other threads of a failed save report the failure again, late, after
  our code has reported it (`_SignalingThread.run() raised an exception` and its traceback)."""
  return not (_state['abandoned'] and record.levelno >= logging.WARNING
              and _ORBAX_DIR in (record.pathname or '')
              and record.thread != threading.main_thread().ident)


def _install_log_filters() -> None:
  for name, keep in (('asyncio', _not_from_a_closed_orbax_loop),
                     ('absl', _not_a_late_report_of_abandoned_work)):  # Orbax logs through absl
    logger = logging.getLogger(name)
    if keep not in logger.filters:
      logger.addFilter(keep)


def note_failure() -> None:
  """Our code caught an Orbax failure: reads or writes it started may still be in flight, and
  wake its closed loop later."""
  _state['abandoned'] = True


def _note_abandoned_work() -> None:
  """Before the garbage collector finalises them: did an Orbax loop of ours close with tasks
  still pending? Their TensorStore reads may wake it up later."""
  for loop in list(_orbax_loops):
    if loop.is_closed() and any(not t.done() for t in asyncio.all_tasks(loop)):
      _state['abandoned'] = True


@contextlib.contextmanager
def quiet_orbax_logs():
  """Within: Orbax/TensorStore/asyncio warnings and errors are not printed, and the event
  loops Orbax creates are recorded, so that their later reports can be told apart."""
  with _lock:
    _record_orbax_loops()
    _install_unraisable_hook()
    _install_log_filters()
    _state['active'] += 1
  hide = _Hide()
  handlers = [h for name in ('', 'absl') for h in logging.getLogger(name).handlers]
  for handler in handlers:
    handler.addFilter(hide)
  try:
    yield
  finally:
    _note_abandoned_work()
    gc.collect()  # finish abandoned coroutines now, not at interpreter exit
    for handler in handlers:
      handler.removeFilter(hide)
    with _lock:
      _state['active'] -= 1
