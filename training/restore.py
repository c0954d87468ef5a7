"""A workdir restored for inference: config, model, tokenizer and parameters, with no training
code path and no dataset (what `decode.py` and `export.py` start from).

Every problem (missing workdir, unreadable config.json or tokenizer, no checkpoint, a
checkpoint that does not fit the model of config.json) raises `RestoreError` with one line.
"""

from __future__ import annotations

import os
import time

from input_pipeline import tokenizers
from model import ConfigError, build_model, transformer
from model.kinds import kind_of
from training import checkpoint, config_io


class RestoreError(ValueError):
  """The workdir cannot be restored; the message says why, in one line."""


def check_params(params, module, workdir: str) -> None:
  """The restored tree must be the model of config.json (a clear error, not a JAX one)."""
  problems = checkpoint.shape_mismatches(kind_of(module).param_shapes(module), params)
  if problems:
    more = f' (+{len(problems) - 3} more)' if len(problems) > 3 else ''
    raise RestoreError(f'the checkpoint in {workdir} does not fit the model in its config.json '
                       f'(kind={module.config.kind}): {"; ".join(problems[:3])}{more}')


class Restored:
  """`config`, `module`, `kind` (name), `tokenizer`, `params` (unrolled: one KV cache per
  layer when decoding), `step` and `seconds` (restore time) of a workdir."""

  def __init__(self, workdir: str, step: int | None = None, average_last: int = 1):
    if not workdir:
      raise RestoreError('--workdir is required (a directory written by train.py)')
    if not os.path.isdir(workdir):
      raise RestoreError(f'--workdir {workdir} does not exist')
    try:
      self.config = config_io.load_config(workdir)
      self.module = build_model(self.config.model)
    except ConfigError as e:
      raise RestoreError(str(e)) from None
    self.kind = self.module.config.kind
    try:
      self.tokenizer = tokenizers.load_tokenizer(workdir)
    except Exception as e:  # noqa: BLE001  # DataError/DataFileError: one line already
      raise RestoreError(str(e)) from None
    if not checkpoint.list_steps(workdir):
      raise RestoreError(f'no checkpoint in {checkpoint.checkpoint_dir(workdir)}: train first '
                         f'(python train.py --workdir={workdir})')
    started = time.time()
    try:
      self.params, self.step = checkpoint.restore_params(workdir, step=step,
                                                         average_last=average_last)
    except checkpoint.CheckpointError as e:
      raise RestoreError(str(e)) from None
    check_params(self.params, self.module, workdir)
    # A `scan_layers` model is unstacked here, once: decoding keeps one KV cache per layer.
    self.module, self.params = transformer.unrolled(self.module, self.params)
    self.seconds = time.time() - started
