"""The training loop: `train_and_evaluate(config, workdir)`.

Order of work: validate the config (one-line errors, nothing compiled or written yet), lock
the workdir (one writer), check it, build the data and tokenizer and check every split, only
then write DIR/config.json; build model/optimizer, restore the newest good checkpoint (or
initialise), then train with periodic logging, evaluation and checkpoints.
SIGTERM/SIGINT save a checkpoint and return; a non-finite loss raises `NonFiniteLossError`
without saving.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import optim
from autoregressive import strategies
from autoregressive.session import Session
from common import accelerator, interrupts, scores
from model import bind
from model.build import count_params
from model.kinds import adapter_of
from optim import ema
from training import (
  config_check,
  evaluation,
  init_from,
  memory,
  mesh as mesh_lib,
  metrics as metrics_lib,
  progress as progress_lib,
  state as state_lib,
  steps,
  telemetry,
)
from training.metrics import log
from workdir import checkpoint as ckpt_lib, config_io, train_lock


class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; the message names the step."""


class _StopSignal:
  """Records SIGTERM/SIGINT; a second SIGINT interrupts at once: `on_second()` when given
  (it should end the process), else KeyboardInterrupt. A KeyboardInterrupt raised from a
  handler is lost when the signal lands in a garbage-collection callback (JAX's), so a
  program that must stop calls os._exit from `on_second` instead."""

  def __init__(self, on_second: Callable[[], None] | None = None):
    self.signum = None
    self._previous = {}
    self._on_second = on_second

  def __enter__(self):
    interrupts.check()  # a stop requested during the set-up, and dropped there, stops here
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    if self.signum is not None and signum == signal.SIGINT:
      if self._on_second is not None:
        self._on_second()
      raise KeyboardInterrupt
    self.signum = signum
    metrics_lib.warn(f'received {signal.Signals(signum).name}: saving a checkpoint and stopping '
                     '(press Ctrl-C again to stop at once)')

  def __exit__(self, *exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def should_stop(self, sync: bool) -> bool:
    """True when this process got a signal. With several processes all must stop at the same
    step, so they agree (a collective) only at `sync` steps and report False in between."""
    if jax.process_count() == 1:
      return self.signum is not None
    if not sync:
      return False
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    flags = multihost_utils.process_allgather(np.array([self.signum is not None]))
    return bool(np.any(flags))


def _get_datasets(config, workdir: str):
  import input_pipeline  # pylint: disable=import-outside-toplevel
  return input_pipeline.get_datasets(config, workdir=workdir,
                                     layout=adapter_of(config.model).batch_layout,
                                     process_index=jax.process_index(),
                                     process_count=jax.process_count())


class _Run:
  """State of one call to `train_and_evaluate` (kept small: the loop lives in `run`)."""

  def __init__(self, config, workdir: str, datasets=None, preset=None, on_second_interrupt=None,
               overridden=frozenset()):
    init_from.configure(config, overridden, workdir)
    self.config, self.workdir, self.preset = config, workdir, preset
    self.on_second_interrupt = on_second_interrupt
    self.model_config = config_check.validate_config(
        config, num_devices=jax.device_count(), process_count=jax.process_count())
    self.mesh = mesh_lib.make_mesh(mesh_config=config.get('mesh'))
    self.rules = mesh_lib.rules(config.get('mesh'))
    # One writer per workdir for the run's whole life (an OS lock: it goes with the process).
    # Process 0 holds it for every process of a multi-host run.
    self.lock = train_lock.acquire(workdir) if metrics_lib.is_main_process() else None
    try:
      self._setup(datasets)
    except BaseException:
      if self.lock is not None:
        self.lock.undo()  # a refused run leaves the workdir as it found it
      raise

  def _setup(self, datasets) -> None:
    config, workdir = self.config, self.workdir
    self.config_summary = self._describe_config()
    log(self.config_summary[0])
    changes = config_check.check_compatible(config, workdir)
    self.had_config = os.path.exists(config_io.config_path(workdir))
    if metrics_lib.is_main_process():
      init_from.copy_tokenizer(config, workdir)
    self.datasets = datasets if datasets is not None else _get_datasets(config, workdir)
    vocab = getattr(self.datasets.tokenizer, 'vocab_size', None)
    if vocab is not None and vocab > self.model_config.vocab_size:
      raise config_io.ConfigError(f'the tokenizer has {vocab} ids but '
                                  f'config.model.vocab_size={self.model_config.vocab_size}')
    if datasets is None:  # every split the run reads, found now rather than at the first eval
      self.datasets.num_eval_batches()
    # Written only once the config, data and tokenizer passed: a refused run leaves no
    # config.json behind to refuse the corrected command with.
    if metrics_lib.is_main_process():
      config_io.save_config(config, workdir)
    if changes:
      log(f'config differs from the previous run in this workdir: {"; ".join(changes)}')
    self.schedule = optim.make_schedule(config)
    self.tx = optim.make_optimizer(config, self.schedule)
    self.writer = metrics_lib.MetricsWriter(workdir)
    self.checkpointer = ckpt_lib.Checkpointer(workdir, max_to_keep=config.train.max_checkpoints)
    self.best = progress_lib.BestMetrics(workdir)
    self.progress = None  # set by `run`
    self.compiled_for_eval: set[str] = set()

  def _describe_config(self) -> tuple[str, str]:
    """-> (the console line: the preset and every field that differs from it, the same as
    Markdown for TensorBoard, with the whole resolved config)."""
    if self.preset is None:  # called from Python: compared with the schema's defaults
      from configs import base  # pylint: disable=import-outside-toplevel
      name, preset, label = 'a config from Python', base.base_config(), 'configs/base.py'
    else:
      (name, preset), label = self.preset, 'preset'
    changes = metrics_lib.config_changes(config_io.to_dict(self.config),
                                         config_io.to_dict(preset), label)
    resolved = json.dumps(config_io.to_dict(self.config), indent=2, sort_keys=True, default=str)
    text = '\n'.join([f'**{name}**, {len(changes)} field(s) changed:', ''] +
                     [f'    {c}' for c in changes] + ['', 'Resolved config:', ''] +
                     [f'    {line}' for line in resolved.splitlines()])
    return metrics_lib.config_line(name, changes), text

  def release(self) -> None:
    """Frees the workdir for the next run."""
    if self.lock is not None:
      self.lock.release()

  # -- state --------------------------------------------------------------------------------
  def restore_or_init(self):
    t = self.config.train
    abstract = state_lib.abstract_train_state(self.model_config, self.tx, self.mesh, self.rules)
    restored = self.checkpointer.restore(
        abstract, allow_fresh_data=t.allow_fresh_data_iterator)
    if restored is None:
      if self.had_config:  # checkpoints deleted, or a run stopped before its first one
        metrics_lib.warn(f'{self.workdir} has a config.json but no checkpoint in '
                         f'{ckpt_lib.checkpoint_dir(self.workdir)}: training starts from step 0')
      return state_lib.create_train_state(self.model_config, self.tx, t.seed, self.mesh, self.rules,
                                          params=init_from.params(self.config))
    state, data_state, step = restored
    if isinstance(state, ckpt_lib.ParamsOnly):  # an import's step 0: its optimizer starts here
      log(f'starting from the parameters of checkpoint {step} (parameters only: an import)')
      return state_lib.create_train_state(self.model_config, self.tx, t.seed, self.mesh,
                                          self.rules, params=state.params)
    if data_state is not None:
      self.datasets.train_iter.set_state(data_state)
    log(f'resumed from the checkpoint at step {step}')
    return state

  def save(self, state, step: int) -> None:
    """Starts writing a checkpoint; logs the time the loop waited for it (the writing itself
    goes on in the background)."""
    start = metrics_lib.now()
    with self.progress.outside('checkpoint'):
      self.checkpointer.save(step, state, self.datasets.train_iter.get_state())
    seconds = metrics_lib.now() - start
    log(f'checkpoint step {step} | {seconds:.1f}s')
    self.writer.scalars(step, 'checkpoint', {'seconds': seconds})

  def compile(self, train_step, state, batch, step: int):
    """The train step compiled for these shapes; logs its per-device memory."""
    log('compiling the train step ...')
    start = metrics_lib.now()
    with self.progress.outside('compile'):
      compiled = train_step.lower(state, batch).compile()
    seconds = metrics_lib.now() - start
    log(f'compiled the train step in {seconds:.1f}s')
    self.writer.scalars(step, 'compile', {'train_step_seconds': seconds})
    log(memory.format_table(memory.step_memory(compiled, state), self.mesh))
    return compiled

  def non_finite(self, step: int, values: dict[str, float]) -> NonFiniteLossError:
    """The error for a non-finite loss at `step` (once the checkpoint in flight is written)."""
    self.checkpointer.wait()
    good = self.checkpointer.latest_step()
    return NonFiniteLossError(
        f'non-finite loss ({values["loss"]}) or gradient norm ({values["grad_norm"]}) at '
        f'step {step}; stopping. The last good checkpoint is '
        f'{"step " + str(good) if good is not None else "none"} in '
        f'{ckpt_lib.checkpoint_dir(self.workdir)}')

  # -- evaluation ---------------------------------------------------------------------------
  def _compiling(self, what: str):
    """A CompileTimer around the first use of `what`, announced before it starts."""
    if what not in self.compiled_for_eval:
      log(f'compiling {what} ...')
    return telemetry.CompileTimer()

  def _compiled(self, what: str, timer) -> None:
    if what not in self.compiled_for_eval:
      self.compiled_for_eval.add(what)
      log(f'compiled {what} in {timer.seconds:.1f}s')

  def evaluate(self, eval_step, state, step: int) -> dict[str, float]:
    start = metrics_lib.now()
    cfg = self.config
    with self.progress.outside('eval'), telemetry.CompileTimer() as compiling:
      with self._compiling('the evaluation step') as timer:
        results = evaluation.evaluate(eval_step, ema.weights(state),
                                      self.datasets.eval_batches(),
                                      self.mesh, cfg.train.num_eval_batches)
      self._compiled('the evaluation step', timer)
      results.pop('num_tokens', None)
      self.best.update('loss', results['loss'], step)
      line = (f'eval step {step} | loss {results["loss"]:.4f} | accuracy '
              f'{results["accuracy"]:.4f} | perplexity {results["perplexity"]:.2f}')
      if adapter_of(self.model_config).has_source and cfg.decode.num_eval_sentences > 0:
        score, signature = self.bleu(state)
        if score is not None:
          results['bleu'] = score
          self.best.update('bleu', score, step)
          line += f' | BLEU {score:.2f} ({signature})'
    results['seconds'] = metrics_lib.now() - start
    line += f' | {results["seconds"]:.1f}s'
    if compiling.seconds >= 0.05:
      line += f' (compiling {compiling.seconds:.1f}s)'
      self.writer.scalars(step, 'compile', {'eval_seconds': compiling.seconds})
    log(line)
    self.writer.scalars(step, 'eval', results)
    self.writer.flush()
    return results

  def bleu(self, state) -> tuple[float | None, str]:
    """BLEU of the first `num_eval_sentences` validation sentences, computed on process 0
    (with the parameters as they are laid out on one process, else gathered to it)."""
    params = ema.weights(state)
    params = params if jax.process_count() == 1 else mesh_lib.to_host(params)
    if not metrics_lib.is_main_process():
      return None, ''
    dec = self.config.decode
    examples = list(self.datasets.eval_examples())[:dec.num_eval_sentences]
    if not examples:
      return None, ''
    # The decode.py path on the parameters in training (a scan_layers model is unrolled
    # once); a validation source beyond max_len is truncated as decode.py truncates it.
    session = Session(bind(self.model_config, params), self.datasets.tokenizer, self.config,
                      warn=lambda message: None)
    most, _ = strategies.fit_to_positions(dec.max_new_tokens, self.model_config.max_len)
    settings = dict(batch_size=min(dec.batch_size, len(examples)), max_new_tokens=most,
                    min_new_tokens=min(dec.min_new_tokens, most))
    what = f'{session.settings(**settings)[0].NAME} search for evaluation'
    with self._compiling(what) as timer:
      hypotheses = session.translate([e['source'] for e in examples], **settings)
    self._compiled(what, timer)
    return scores.bleu(hypotheses, [e['target'] for e in examples])

  # -- the loop -----------------------------------------------------------------------------
  def run(self) -> dict[str, Any]:
    t = self.config.train
    start_time = metrics_lib.now()
    state = self.restore_or_init()
    start_step = int(jax.device_get(state.step))
    self.best.load(start_step)
    self.writer.text(start_step, 'config', self.config_summary[1])
    log(f'model: {self.model_config.kind}, {count_params(state.params):,} parameters, '
        f'compute dtype {self.model_config.dtype}, matmul precision '
        f'{t.matmul_precision}')
    log(mesh_lib.describe(self.mesh))
    train_step = steps.jit_train_step(self.model_config, self.tx, self.schedule, self.mesh,
                                      label_smoothing=t.label_smoothing,
                                      grad_accum_steps=t.grad_accum_steps, rules=self.rules,
                                      z_loss=t.z_loss, rdrop_alpha=t.rdrop_alpha)
    eval_step = steps.jit_eval_step(self.model_config, self.mesh, self.rules)
    progress = self.progress = progress_lib.Progress(self, start_step)
    profiler = telemetry.StepProfiler(t.profile_steps, self.workdir)
    last_saved = start_step if start_step > 0 else None
    last_eval = interrupted = None
    if start_step >= t.num_steps:
      log(f'already trained to step {start_step} (config.train.num_steps={t.num_steps})')
    with _StopSignal(self.on_second_interrupt) as stop:
      step = start_step
      while step < t.num_steps:
        batch = mesh_lib.shard_batch(next(self.datasets.train_iter), self.mesh)
        if step == start_step:  # compiled ahead of time, to report its memory first
          train_step = self.compile(train_step, state, batch, step + 1)
        profiler.before_step(step + 1)
        state, device_metrics = train_step(state, batch)
        step += 1
        progress.add(step, device_metrics, batch)
        if profiler.after_step(step, state):
          log(f'profiler trace of steps {profiler.steps[0]}-{step} in {profiler.log_dir}')
        if step % t.log_every_steps == 0 or step == t.num_steps:
          progress.log(step, state)
        if step % t.eval_every_steps == 0 or step == t.num_steps:
          progress.drain()
          self.evaluate(eval_step, state, step)
          last_eval = step
        if step % t.checkpoint_every_steps == 0 or step == t.num_steps:
          progress.drain()
          self.save(state, step)
          last_saved = step
        if stop.should_stop(sync=step % t.log_every_steps == 0):
          progress.drain()
          if last_saved != step:
            self.save(state, step)
            last_saved = step
          interrupted = signal.Signals(stop.signum).name if stop.signum else 'a signal'
          log(f'stopped by {interrupted} at step {step}; checkpoint saved')
          break
      profiler.stop()
      progress.drain()
      if interrupted is None and last_eval != step:
        self.evaluate(eval_step, state, step)
      if last_saved != step and step > 0:
        self.save(state, step)
      self.checkpointer.close()
    self.writer.close()
    return self.summary(step, interrupted, metrics_lib.now() - start_time, progress.losses, state)

  def summary(self, step, interrupted, total_time, losses, state) -> dict[str, Any]:
    """The run's summary dict, and its last log line. The best figures count the evaluations
    of earlier runs in this workdir up to the checkpoint this one resumed from."""
    self.best.warn_unsaved()
    self.writer.warn_unsaved()
    best_loss, best_loss_step = self.best.get('loss')
    best_bleu, best_bleu_step = self.best.get('bleu')
    spent = dict(self.progress.spent)
    summary = {'step': step, 'interrupted': interrupted, 'total_time': total_time,
               'best_eval_loss': best_loss if best_loss_step is not None else float('inf'),
               'best_eval_loss_step': best_loss_step, 'best_bleu': best_bleu,
               'best_bleu_step': best_bleu_step, 'losses': losses, 'state': state,
               'seconds_outside_train_steps': spent}
    fmt = metrics_lib.format_duration
    line = f'done: step {step}/{self.config.train.num_steps} in {fmt(total_time)}'
    parts = [f'{name} {fmt(spent[key])}' for key, name in
             (('eval', 'evaluation'), ('checkpoint', 'checkpoints'), ('compile', 'compilation'))
             if spent.get(key, 0) >= 1]
    if parts:
      line += f' ({", ".join(parts)})'
    if best_loss_step is not None:
      line += f' | best val loss {best_loss:.4f} (step {best_loss_step})'
    if best_bleu_step is not None:
      line += f' | best BLEU {best_bleu:.2f} (step {best_bleu_step})'
    log(line)
    return summary


def train_and_evaluate(config, workdir: str, *, datasets=None, preset=None,
                       on_second_interrupt: Callable[[], None] | None = None,
                       overridden=frozenset()) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming from its newest good checkpoint) -> summary dict
  with 'step', 'interrupted', 'total_time', best eval loss/BLEU and the final 'state'.
  `preset`: (name, the preset's config before overrides), e.g. ('configs/default.py:tiny',
  ...): the run prints the name and every field that differs from it (default: compared with
  `configs/base.py`). `datasets` (tests) replaces `input_pipeline.get_datasets(config,
  workdir=...)`. A second Ctrl-C during the loop (the first saves and stops) calls
  `on_second_interrupt()` from the signal handler, which should end the process (default:
  KeyboardInterrupt, which a signal landing in a gc callback can swallow). With
  `config.train.init_from`, the model fields named in `overridden` ('model.dropout_rate', ...)
  are kept, the others taken from that workdir (training.init_from). Raises
  `model.ConfigError` (bad config, incompatible workdir), `CheckpointError`,
  `NonFiniteLossError`."""
  t = config.train
  accelerator.check_deterministic(t.deterministic)
  with accelerator.matmul_precision(t.matmul_precision):
    run = _Run(config, workdir, datasets, preset, on_second_interrupt, overridden)
    try:
      return run.run()
    finally:
      run.release()
