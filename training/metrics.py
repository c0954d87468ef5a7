"""Console lines and TensorBoard scalars. Only process 0 writes anything."""

from __future__ import annotations

import contextlib
import datetime
import errno
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax


def now() -> float:
  """The clock of every duration a run reports (a function, so tests can move it)."""
  return time.time()


def is_main_process() -> bool:
  return jax.process_index() == 0


def log(message: str) -> None:
  """Prints one line on process 0 (stdout, flushed)."""
  if is_main_process():
    print(message, flush=True)


def warn(message: str) -> None:
  if is_main_process():
    print(f'WARNING: {message}', file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(max(0.0, seconds))))


def format_number(value: float) -> str:
  return f'{value:,.0f}'


def progress_line(step: int, num_steps: int, metrics: Mapping[str, float], *,
                  tokens_per_sec: float, elapsed: float, eta: float,
                  perf: Mapping[str, float] | None = None) -> str:
  """'step 100/4000 | loss 5.1234 | acc 0.123 | lr 3.2e-04 | |g| 1.234 | 12,345 tok/s |
  85.2 ms/step | MFU 41.3% | mem 12.1 GiB | elapsed 0:01:23 | ETA 0:45:10' (the step time,
  MFU and peak device memory where known)."""
  perf = perf or {}
  parts = [f'step {step}/{num_steps}', f'loss {metrics["loss"]:.4f}',
           f'acc {metrics["accuracy"]:.3f}', f'lr {metrics["learning_rate"]:.3e}',
           f'|g| {metrics["grad_norm"]:.3f}', f'{format_number(tokens_per_sec)} tok/s']
  if 'step_ms' in perf:
    parts.append(f'{perf["step_ms"]:.1f} ms/step')
  if 'mfu' in perf:
    parts.append(f'MFU {100 * perf["mfu"]:.1f}%')
  if 'peak_memory_gib' in perf:
    parts.append(f'mem {perf["peak_memory_gib"]:.1f} GiB')
  parts += [f'elapsed {format_duration(elapsed)}', f'ETA {format_duration(eta)}']
  return ' | '.join(parts)


def _flat(values: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in values.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


def config_changes(config: Mapping[str, Any], preset: Mapping[str, Any],
                   label: str = 'preset') -> list[str]:
  """'section.field=value (preset: old)' for each field of `config` (plain nested dicts) that
  differs from `preset`, in field order; a field the preset lacks shows '(new)'."""
  new, old = _flat(config), _flat(preset)
  changes = []
  for name, value in new.items():
    if name not in old:
      changes.append(f'{name}={value!r} (new)')
    elif value != old[name]:
      changes.append(f'{name}={value!r} ({label}: {old[name]!r})')
  return changes


def config_line(name: str, changes: list[str]) -> str:
  """'config: configs/default.py:tiny | train.num_steps=40 (preset: 20) | ...'."""
  return ' | '.join([f'config: {name}'] + (changes or ['as the preset is']))


class MetricsWriter:
  """TensorBoard scalars (tensorboardX) in `workdir` on process 0; a no-op elsewhere.

  The event file is a record of the run, not its state: the first error writing it (a full
  disk) stops the file, not the run. tensorboardX writes it from its own thread too (where an
  error is a traceback) and at exit, so every write goes through `_guard`. The failure is in
  `unsaved`: said at once, except a full disk, which the checkpoint that meets it next says in
  the run's one error line (`warn_unsaved` says it if the run finishes anyway)."""

  def __init__(self, workdir: str):
    self._writer = None
    self.unsaved: str | None = None  # why the file stopped
    self._said = False
    if is_main_process():
      from common.tensorboardx import tensorboardx  # pylint: disable=import-outside-toplevel
      self._writer = tensorboardx().SummaryWriter(logdir=workdir, flush_secs=30)
      self._guard(self._writer.file_writer.event_writer._ev_writer)  # pylint: disable=protected-access

  def _guard(self, events) -> None:
    """Wraps the file's record writer (tensorboardX's EventsWriter._py_recordio_writer)."""
    records, path = events._py_recordio_writer, events._file_name  # pylint: disable=protected-access
    for name in ('write', 'flush', 'close'):
      setattr(records, name, self._guarded(getattr(records, name), path, name == 'close'))

  def _guarded(self, call, path: str, closing: bool):
    def guarded(*args):
      if self.unsaved is not None and not closing:
        return None  # the file stopped at its first error: later events are dropped
      try:
        return call(*args)
      except OSError as e:
        if self.unsaved is None:
          self.unsaved = f'cannot write {path}: {e.strerror or e}; its scalars stop there'
          if e.errno != errno.ENOSPC:
            self.warn_unsaved()
        if closing:  # the file object is closed even when its last flush failed
          with contextlib.suppress(OSError):
            call(*args)
        return None
    return guarded

  def warn_unsaved(self) -> None:
    """Warns (once) if the event file stopped at an error."""
    if self.unsaved is not None and not self._said:
      self._said = True
      warn(self.unsaved)

  def scalars(self, step: int, prefix: str, metrics: Mapping[str, Any]) -> None:
    if self._writer is None:
      return
    for name, value in metrics.items():
      self._writer.add_scalar(f'{prefix}/{name}', float(value), step)

  def text(self, step: int, tag: str, text: str) -> None:
    """Markdown `text` under TensorBoard's Text tab."""
    if self._writer is not None:
      self._writer.add_text(tag, text, step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


class Throughput:
  """Tokens/s and seconds per step between `mark`s, and an ETA, over the time spent in train
  steps only: what runs between them (evaluation, checkpoints, compilation) is `exclude`d, so
  an evaluation never reads as a slow step."""

  def __init__(self, start_step: int):
    self.start_time = now()
    self.restart(start_step)

  def restart(self, step: int) -> None:
    """Rates count from here (`step`)."""
    self.last_time = self.rate_time = now()
    self.rate_step = self.last_step = step
    self.tokens = 0.0
    self.excluded = self.excluded_since_restart = 0.0

  def add_tokens(self, n: float) -> None:
    self.tokens += n

  def exclude(self, seconds: float) -> None:
    """`seconds` of work other than train steps, done since the last mark."""
    self.excluded += seconds
    self.excluded_since_restart += seconds

  def mark(self, step: int, num_steps: int,
           other_seconds_left: float = 0.0) -> tuple[float, float, float, float | None]:
    """-> (tokens/s since the last mark, elapsed seconds of this run, ETA seconds, seconds per
    step since the last mark or None when no step ran since). The ETA is the steps left at the
    mean train-step time since `restart`, plus `other_seconds_left` (evaluations and
    checkpoints still to come)."""
    t = now()
    interval = max(t - self.last_time - self.excluded, 1e-9)
    rate = self.tokens / interval
    step_s = interval / (step - self.last_step) if step > self.last_step else None
    self.tokens, self.last_time, self.last_step, self.excluded = 0.0, t, step, 0.0
    done = step - self.rate_step
    train_time = max(t - self.rate_time - self.excluded_since_restart, 0.0)
    eta = train_time / done * (num_steps - step) + other_seconds_left if done > 0 else 0.0
    return rate, t - self.start_time, eta, step_s
