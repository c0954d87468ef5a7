"""Console lines and TensorBoard scalars. Only process 0 writes anything."""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, Mapping

import jax


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


class MetricsWriter:
  """TensorBoard scalars (tensorboardX) in `workdir` on process 0; a no-op elsewhere."""

  def __init__(self, workdir: str):
    self._writer = None
    if is_main_process():
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._writer = SummaryWriter(logdir=workdir, flush_secs=30)

  def scalars(self, step: int, prefix: str, metrics: Mapping[str, Any]) -> None:
    if self._writer is None:
      return
    for name, value in metrics.items():
      self._writer.add_scalar(f'{prefix}/{name}', float(value), step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


class Throughput:
  """Tokens/s and seconds/step between `mark`s, and an ETA from the steps after the first
  (compiling) one."""

  def __init__(self, start_step: int):
    self.start_time = self.last_time = self.rate_time = time.time()
    self.rate_step = self.last_step = start_step
    self.tokens = 0.0

  def restart(self, step: int) -> None:
    """Call once the first step (compilation) is done: rates then exclude compile time."""
    self.last_time = self.rate_time = time.time()
    self.rate_step = self.last_step = step
    self.tokens = 0.0

  def add_tokens(self, n: float) -> None:
    self.tokens += n

  def mark(self, step: int, num_steps: int) -> tuple[float, float, float, float | None]:
    """-> (tokens/s since the last mark, elapsed seconds of this run, ETA seconds, seconds per
    step since the last mark or None when no step ran since)."""
    now = time.time()
    interval = max(now - self.last_time, 1e-9)
    rate = self.tokens / interval
    step_s = interval / (step - self.last_step) if step > self.last_step else None
    self.tokens, self.last_time, self.last_step = 0.0, now, step
    done = step - self.rate_step
    eta = (now - self.rate_time) / done * (num_steps - step) if done > 0 else 0.0
    return rate, now - self.start_time, eta, step_s
