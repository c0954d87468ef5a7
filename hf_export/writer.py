"""Export a training workdir as a `transformers` model directory.

  export_workdir(workdir, output_dir, step=None, average_last=1, overwrite=False) -> summary

Everything is checked (config, tokenizer, output directory, checkpoint) before anything is
written; the files are written into a temporary directory beside `output_dir` and renamed
into place at the end, so a failure leaves nothing behind. Writing needs `transformers` and
`safetensors` (the `[hf]` extra), not `torch`.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hf_export import targets
from hf_export.tokenizer import save_tokenizer


class ExportError(Exception):
  """A user-facing error: one line, no traceback."""


def _check_output_dir(output_dir: str, overwrite: bool) -> str:
  if not output_dir:
    raise ExportError('--output_dir is required (a new directory for the transformers model)')
  path = os.path.abspath(output_dir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ExportError(f'--output_dir {output_dir} exists and is not a directory')
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    raise ExportError(f'--output_dir {output_dir} exists and is not empty (give a new '
                      'directory, or --overwrite to replace it)')
  parent = os.path.dirname(path)
  if not os.path.isdir(parent):
    raise ExportError(f'the parent directory of --output_dir {output_dir} does not exist')
  if not os.access(parent, os.W_OK):
    raise ExportError(f'cannot write in {parent} (the parent of --output_dir)')
  return path


def check_workdir(workdir: str):
  """(ModelConfig, tokenizer, config) of `workdir`, or ExportError if it cannot be exported."""
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  from model import ConfigError  # pylint: disable=import-outside-toplevel
  from model.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from training import config_io  # pylint: disable=import-outside-toplevel

  if not workdir:
    raise ExportError('--workdir is required (a directory written by train.py)')
  if not os.path.isdir(workdir):
    raise ExportError(f'--workdir {workdir} does not exist')
  try:
    config = config_io.load_config(workdir)
    model_config = ModelConfig.from_config(config.model)
    tokenizer = tokenizers.load_tokenizer(workdir)
    targets.check_exportable(model_config, tokenizer.kind)
  except (ConfigError, targets.UnsupportedConfig) as e:
    raise ExportError(str(e)) from None
  except Exception as e:  # noqa: BLE001  # DataError/DataFileError/config errors: one line
    raise ExportError(f'{type(e).__name__}: {e}') from None
  if tokenizer.vocab_size > model_config.vocab_size:
    raise ExportError(f'the tokenizer in {workdir} has {tokenizer.vocab_size} tokens, more '
                      f'than config.model.vocab_size={model_config.vocab_size}')
  return model_config, tokenizer, config


def hf_configs(model_config, tokenizer, decode_config):
  """(model config, generation config) as `transformers` objects for our model."""
  import transformers  # pylint: disable=import-outside-toplevel

  target = targets.target(model_config)
  eos = tokenizer.eos_id  # 1 for sentencepiece, None for characters
  config = getattr(transformers, target.config_class)(**target.config(model_config, eos_id=eos))
  generation = transformers.GenerationConfig(
      **target.generation(model_config, eos, decode_config))
  config.architectures = [target.architecture]
  config.dtype = 'float32'
  return config, generation


def write_export(directory: str, params, model_config, tokenizer, decode_config,
                 metadata: dict[str, str] | None = None) -> tuple[str, str]:
  """Writes the `transformers` files for our (unrolled) `params` into the existing `directory`.

  Returns (model class, tokenizer class). `decode_config` (`config.decode`) gives the
  generation defaults. Nothing is checked here that `check_workdir` checks.
  """
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

  config, generation = hf_configs(model_config, tokenizer, decode_config)
  config.save_pretrained(directory)
  generation.save_pretrained(directory)
  save_file(convert_params(params, model_config), os.path.join(directory, 'model.safetensors'),
            metadata={'format': 'pt', **(metadata or {})})
  tokenizer_class = save_tokenizer(tokenizer, directory, max_len=model_config.max_len,
                                   start_token=targets.target(model_config).start_token)
  return config.architectures[0], tokenizer_class


def _publish_permissions(directory: str) -> None:
  """mkdtemp makes a private (0700) directory: give it and its files the usual umask modes."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(directory, 0o777 & ~umask)
  for name in os.listdir(directory):
    os.chmod(os.path.join(directory, name), 0o666 & ~umask)


def _move_into_place(staging: str, path: str) -> None:
  """Renames `staging` to `path`; an existing `path` (--overwrite) is removed only after."""
  old = None
  if os.path.exists(path):
    old = tempfile.mkdtemp(prefix='.old-', dir=os.path.dirname(path))
    os.rename(path, os.path.join(old, 'previous'))
  os.rename(staging, path)
  if old:
    shutil.rmtree(old, ignore_errors=True)


def export_workdir(workdir: str, output_dir: str, *, step: int | None = None,
                   average_last: int = 1, overwrite: bool = False) -> str:
  """Writes `output_dir` (config.json, generation_config.json, model.safetensors, tokenizer
  files) from the checkpoint of `workdir`; returns a one-line summary."""
  from training import restore  # pylint: disable=import-outside-toplevel  # as decode.py does

  if average_last < 1:
    raise ExportError(f'--average_last={average_last} must be >= 1')
  path = _check_output_dir(output_dir, overwrite)
  model_config, tokenizer, config = check_workdir(workdir)
  hf_configs(model_config, tokenizer, config.decode)  # fails now, not after the restore
  try:
    restored = restore.Restored(workdir, step, average_last)
  except restore.RestoreError as e:
    raise ExportError(str(e)) from None
  metadata = {'source_workdir': os.path.abspath(workdir), 'step': str(restored.step),
              'average_last': str(average_last)}
  staging = tempfile.mkdtemp(prefix=f'.{os.path.basename(path)}.tmp-', dir=os.path.dirname(path))
  try:
    arch, tokenizer_class = write_export(staging, restored.params, model_config, tokenizer,
                                         config.decode, metadata)
    _publish_permissions(staging)
    _move_into_place(staging, path)
  except OSError as e:
    raise ExportError(f'cannot write {output_dir}: {e.strerror or e}') from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)  # gone already when it was moved into place
  averaged = f' (average of the last {average_last})' if average_last > 1 else ''
  return (f'wrote {arch} + {tokenizer_class} of step {restored.step}{averaged} to '
          f'{output_dir}')


def convert_params(params, model_config) -> dict:
  """Our (unrolled) params -> the target class's state dict of float32 NumPy arrays."""
  import jax  # pylint: disable=import-outside-toplevel

  return targets.target(model_config).state_dict(jax.device_get(params), model_config)
