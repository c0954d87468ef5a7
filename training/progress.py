"""What a run reports as it goes: the train metrics and honest step times, and its best
evaluations, kept across resumes.

`Progress` brings each step's metrics to the host (one step stays in flight, so the host waits
for the device only at log, eval and save steps) and logs loss, tokens/s, step time, MFU, peak
memory and ETA. Time spent outside train steps (evaluation, checkpoints, compilation) is run
inside `outside(...)`, which takes it out of the step time, tokens/s and MFU, and feeds the ETA
with the evaluations and checkpoints still to come.

`BestMetrics` keeps the best validation loss and BLEU with their steps in
`DIR/best_metrics.json` (written atomically at each improvement), so that the summary of a
resumed run counts the evaluations made before the resume.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import math
import os
from typing import Any

import jax
import numpy as np

from common.atomic_file import atomic_write
from common.files import read_regular
from training import metrics as metrics_lib, steps, telemetry
from training.metrics import log

BEST_FILE = 'best_metrics.json'


class Progress:
  """The train metrics on the host. A non-finite loss raises `run.non_finite(...)`."""

  def __init__(self, run, start_step: int):
    self.run, self.start_step = run, start_step
    self.throughput = metrics_lib.Throughput(start_step)
    self.window: list[dict[str, float]] = []
    self.losses: dict[int, float] = {}  # step -> train loss, for this run's steps
    self.pending: list[tuple[int, Any]] = []  # (step, device metrics) not yet on the host
    self.flops_per_step = None
    # 'eval' / 'checkpoint' / 'compile' -> seconds in all ('compile' also counts compilation
    # inside evaluations), and each block's time without compilation (for the ETA).
    self.spent: dict[str, float] = collections.defaultdict(float)
    self.typical: dict[str, list[float]] = collections.defaultdict(list)

  @contextlib.contextmanager
  def outside(self, what: str):
    """Times a block that is not a train step (`what`: 'eval', 'checkpoint', 'compile'): its
    time leaves the step time, and its compile-free time predicts the next ones' for the ETA."""
    start = metrics_lib.now()
    with telemetry.CompileTimer() as compiling:
      yield
    seconds = max(metrics_lib.now() - start, 0.0)
    self.throughput.exclude(seconds)
    self.spent[what] += seconds
    if what != 'compile':
      self.spent['compile'] += compiling.seconds
    self.typical[what].append(max(seconds - compiling.seconds, 0.0))

  def add(self, step: int, device_metrics, batch) -> None:
    if self.pending:
      self.drain()  # the previous step's metrics
    self.pending.append((step, device_metrics))
    if self.flops_per_step is None:
      self.flops_per_step = telemetry.train_step_flops(
          self.run.model_config, {k: v.shape for k, v in batch.items()})

  def drain(self) -> None:
    while self.pending:
      done_step, device_metrics = self.pending.pop(0)
      values = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
      if not values.pop('finite'):
        raise self.run.non_finite(done_step, values)
      self.throughput.add_tokens(values['num_tokens'])
      self.window.append(values)
      self.losses[done_step] = values['loss']

  def _seconds_left_outside(self, step: int) -> float:
    """Expected seconds of the evaluations and checkpoints after `step` (at the mean of those
    done so far, compilation left out)."""
    t = self.run.config.train
    total = 0.0
    for what, every in (('eval', t.eval_every_steps), ('checkpoint', t.checkpoint_every_steps)):
      done = self.typical.get(what)
      if done:
        count = t.num_steps // every - step // every + (t.num_steps % every != 0)
        total += max(count, 0) * float(np.mean(done))
    return total

  def log(self, step: int, state) -> None:
    self.drain()
    num_steps = self.run.config.train.num_steps
    tokens_per_sec, elapsed, eta, step_s = self.throughput.mark(
        step, num_steps, self._seconds_left_outside(step))
    with self.outside('log'):  # the norm's first call compiles
      self._write(step, num_steps, state, tokens_per_sec, elapsed, eta, step_s)

  def _write(self, step, num_steps, state, tokens_per_sec, elapsed, eta, step_s) -> None:
    mean = {k: float(np.mean([w[k] for w in self.window])) for k in self.window[0]}
    mean['learning_rate'] = self.window[-1]['learning_rate']
    mean['param_norm'] = float(steps.parameter_norm(state.params))
    self.window.clear()
    perf = {'tokens_per_sec': tokens_per_sec}
    if step_s is not None:
      perf['step_ms'] = 1000 * step_s
      util = telemetry.mfu(self.flops_per_step or 0, step_s, self.run.model_config.dtype)
      if util is not None:
        perf['mfu'] = util
    peak = telemetry.peak_memory_bytes()
    if peak is not None:
      perf['peak_memory_gib'] = peak / 2**30
    log(metrics_lib.progress_line(step, num_steps, mean, tokens_per_sec=tokens_per_sec,
                                  elapsed=elapsed, eta=eta, perf=perf))
    self.run.writer.scalars(step, 'train', {**mean, **perf})


class BestMetrics:
  """The best 'loss' (lowest) and 'bleu' (highest) validation figures of a run, as
  {name: (value, step)}, persisted in `DIR/best_metrics.json` by process 0."""

  HIGHER_IS_BETTER = {'loss': False, 'bleu': True}

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, BEST_FILE)
    self.best: dict[str, tuple[float, int]] = {}
    self.unsaved: str | None = None  # why the last save failed

  def load(self, resumed_step: int) -> None:
    """Reads the file of the run being resumed from a checkpoint at `resumed_step` (0: a fresh
    start). Figures from steps after it are dropped: those evaluations will be made again. A
    damaged file is ignored with a warning (it is only a summary)."""
    self.best = {}
    if resumed_step <= 0 or not os.path.exists(self.path):
      return
    try:
      values = json.loads(read_regular(self.path))
      for name, entry in values.items():
        value, step = float(entry['value']), entry['step']
        if name in self.HIGHER_IS_BETTER and math.isfinite(value) and isinstance(step, int):
          if step <= resumed_step:
            self.best[name] = (value, step)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
      metrics_lib.warn(f'ignoring {self.path} ({type(e).__name__}: {e}); the best figures '
                       'count from this run only')

  def update(self, name: str, value: float, step: int) -> bool:
    """Records `value` at `step` if it beats the best `name`; -> whether it did."""
    if not math.isfinite(value):
      return False
    old = self.best.get(name)
    better = old is None or (value > old[0] if self.HIGHER_IS_BETTER[name] else value < old[0])
    if better:
      self.best[name] = (value, step)
      self._save()
    return better

  def get(self, name: str) -> tuple[float | None, int | None]:
    return self.best.get(name, (None, None))

  def _save(self) -> None:
    if not metrics_lib.is_main_process():
      return
    values = {k: {'value': v, 'step': s} for k, (v, s) in sorted(self.best.items())}
    try:
      atomic_write(self.path, (json.dumps(values, indent=2) + '\n').encode())
      self.unsaved = None
    except OSError as e:  # a summary only: training goes on
      self.unsaved = f'cannot write {self.path}: {e.strerror or e}'
      if e.errno != errno.ENOSPC:
        metrics_lib.warn(self.unsaved)
      # A full disk is said once, by the checkpoint that meets it next (the run's one error
      # line), or by the run's end (`warn_unsaved`) if it finishes anyway.

  def warn_unsaved(self) -> None:
    """Warns if the last save of the file failed on a full disk (not yet said)."""
    if self.unsaved is not None and metrics_lib.is_main_process():
      metrics_lib.warn(self.unsaved)
      self.unsaved = None
