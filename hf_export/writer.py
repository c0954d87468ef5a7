"""Export a training workdir as a `transformers` or a CTranslate2 model directory.

  export_workdir(workdir, output_dir, step=None, average_last=1, overwrite=False,
                 format='transformers') -> summary

Everything is checked (output directory, config, tokenizer, checkpoint) before anything is
written; the files are written into a temporary directory beside `output_dir` and renamed
into place at the end, so a failure leaves nothing behind (`hf_export.output_dir` has the
rules: never into or over the workdir, `--overwrite` replaces only a previous export).
Writing needs `transformers` and `safetensors` (the `[hf]` extra, not `torch`) for the
transformers format, `ctranslate2` (the `[ct2]` extra) for the CTranslate2 one.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil

from common import interrupts
from common.atomic_file import OutputError, OutputLock
from common.errors import carried
from hf_export import output_dir as out_lib, targets
from hf_export.output_dir import ExportError
from hf_export.tokenizer import save_tokenizer

FORMATS = ('transformers', 'ctranslate2')


def check_workdir(workdir: str, check=None):
  """(ModelConfig, tokenizer, config) of `workdir`, or ExportError if it cannot be exported.

  `check(model_config, tokenizer_name)` raises `UnsupportedConfig` for a model the format
  cannot express (default: the transformers targets' check).
  """
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  from model import ConfigError  # pylint: disable=import-outside-toplevel
  from model.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from workdir import config_io  # pylint: disable=import-outside-toplevel

  check = check or targets.check_exportable
  if not workdir:
    raise ExportError('--workdir is required (a directory written by train.py)')
  if not os.path.isdir(workdir):
    raise ExportError(f'--workdir {workdir} ' + ('is not a directory' if os.path.lexists(workdir)
                                          else 'does not exist'))
  try:
    config = config_io.load_config(workdir)
    model_config = ModelConfig.from_config(config.model)
    tokenizer = tokenizers.load_tokenizer(workdir)
    check(model_config, tokenizer.name)
  except (ConfigError, targets.UnsupportedConfig) as e:
    raise ExportError(str(e)) from None
  except ImportError:
    raise  # a missing extra: export.py names it
  except Exception as e:  # noqa: BLE001  # DataError/DataFileError/config errors: one line
    raise ExportError(f'{type(e).__name__}: {e}') from None
  try:  # before the format prepares anything from it: as `workdir.restore` checks it
    tokenizers.check_vocabulary(tokenizer, config.data, model_config.vocab_size, workdir,
                                tokenizers.NOT_THE_MODELS)
  except tokenizers.DataError as e:
    raise ExportError(str(e)) from None
  return model_config, tokenizer, config


def hf_configs(model_config, tokenizer, decode_config):
  """(model config, generation config) as `transformers` objects for our model; the
  generation config is None for a target without a generation head (BertModel)."""
  import transformers  # pylint: disable=import-outside-toplevel

  target = targets.target(model_config)
  eos = tokenizer.eos_id  # 1 for sentencepiece, None for characters
  config = getattr(transformers, target.config_class)(**target.config(model_config, eos_id=eos))
  generation = None if target.generation is None else transformers.GenerationConfig(
      **target.generation(model_config, eos, decode_config))
  config.architectures = [target.architecture]
  config.dtype = 'float32'
  return config, generation


def write_export(directory: str, params, model_config, tokenizer, decode_config,
                 metadata: dict[str, str] | None = None) -> tuple[str, str]:
  """Writes the `transformers` files for our `params` (`model.params_of`'s pure dict) into the
  existing `directory`.

  Returns (model class, tokenizer class). `decode_config` (`config.decode`) gives the
  generation defaults. Nothing is checked here that `check_workdir` checks.
  """
  config, generation = hf_configs(model_config, tokenizer, decode_config)
  config.save_pretrained(directory)
  if generation is not None:  # BertModel generates nothing: no generation_config.json
    generation.save_pretrained(directory)
  save_safetensors(convert_params(params, model_config),
                   os.path.join(directory, 'model.safetensors'),
                   {'format': 'pt', **(metadata or {})})
  tokenizer_class = save_tokenizer(tokenizer, directory, max_len=model_config.max_len,
                                   start_token=targets.target(model_config).start_token)
  return config.architectures[0], tokenizer_class


class _Transformers:
  """The transformers format: what to check up front, and how to write a restored model."""
  name = 'transformers'

  @staticmethod
  def check(model_config, tokenizer_name):
    targets.check_exportable(model_config, tokenizer_name)

  @staticmethod
  def prepare(model_config, tokenizer, config):
    # Writing needs no torch, but loading the export does, and transformers without it
    # prints its own warning: the [hf] extra brings both (export.py names it).
    if importlib.util.find_spec('torch') is None:
      raise ModuleNotFoundError('transformers loads the export with torch', name='torch')
    hf_configs(model_config, tokenizer, config.decode)  # fails now, not after the restore

  @staticmethod
  def write(directory, restored, model_config, tokenizer, config, metadata):
    from hf_export.convert import restored_params  # pylint: disable=import-outside-toplevel
    _, params = restored_params(restored)
    arch, tokenizer_class = write_export(directory, params, model_config, tokenizer,
                                         config.decode, metadata)
    return f'{arch} + {tokenizer_class}', {'model_class': arch, 'tokenizer_class':
                                           tokenizer_class}


def _format(name: str):
  if name == 'transformers':
    return _Transformers
  if name == 'ctranslate2':
    from hf_export import ctranslate2  # pylint: disable=import-outside-toplevel
    return ctranslate2.FORMAT
  raise ExportError(f'--format={name} is not one of {list(FORMATS)}')


def export_workdir(workdir: str, output_dir: str, *, step: int | None = None,
                   average_last: int = 1, overwrite: bool = False,
                   format: str = 'transformers') -> str:  # noqa: A002  # the flag's name
  """Writes `output_dir` from the checkpoint of `workdir` in `format`; returns a one-line
  summary. transformers: config.json, generation_config.json (not for BertModel),
  model.safetensors, tokenizer files; ctranslate2: model.bin, config.json, the vocabulary
  (and the tokenizer model)."""
  fmt = _format(format)
  from workdir import restore  # pylint: disable=import-outside-toplevel
  if average_last < 1:
    raise ExportError(f'--average_last={average_last} must be >= 1')
  path = out_lib.check_output_dir(output_dir, workdir, overwrite)
  model_config, tokenizer, config = check_workdir(workdir, fmt.check)
  fmt.prepare(model_config, tokenizer, config)
  try:
    restored = restore.Restored(workdir, step, average_last)
  except restore.RestoreError as e:
    raise ExportError(str(e)) from None
  metadata = {'source_workdir': os.path.abspath(workdir), 'step': str(restored.step),
              'average_last': str(average_last)}
  try:  # a second export.py to the same directory is refused, not interleaved
    with OutputLock(path, '--output_dir', output_dir):
      what, _ = _write(fmt, path, restored, (model_config, tokenizer, config), metadata)
  except OutputError as e:
    raise carried(ExportError(str(e)), e) from None
  except OSError as e:
    raise carried(ExportError(f'cannot write {output_dir}: {e.strerror or e} (nothing '
                              f'written: {output_dir} is as it was)'), e) from None
  averaged = f' (average of the last {average_last})' if average_last > 1 else ''
  return f'wrote {what} of step {restored.step}{averaged} to {output_dir}'


def _write(fmt, path: str, restored, configs, metadata: dict) -> tuple[str, dict]:
  """The export written into a staging directory beside `path`, then renamed onto it."""
  staging = out_lib.make_staging(path)
  try:
    what, info = fmt.write(staging, restored, *configs, metadata)
    out_lib.write_marker(staging, {'format': fmt.name, **metadata, **info})
    interrupts.check()  # a Ctrl-C that Python dropped (in a gc callback) still stops here
    out_lib.publish(staging, path)
  finally:
    shutil.rmtree(staging, ignore_errors=True)  # gone already when it was moved into place
  return what, info


def save_safetensors(tensors: dict, path: str, metadata: dict[str, str]) -> None:
  """safetensors' `save_file`, whose write errors (a full disk) become an `OSError` with their
  errno: its own `SafetensorError` is no OSError, and ended the export in a traceback."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  try:
    save_file(tensors, path, metadata=metadata)
  except Exception as e:
    if type(e).__name__ != 'SafetensorError':
      raise
    full = 'No space left' in str(e) or 'StorageFull' in str(e)
    raise OSError(errno.ENOSPC if full else errno.EIO,
                  'No space left on device' if full else str(e), path) from None


def convert_params(params, model_config) -> dict:
  """Our params (`model.params_of`) -> the target class's state dict of float32 NumPy arrays."""
  import jax  # pylint: disable=import-outside-toplevel

  return targets.target(model_config).state_dict(jax.device_get(params), model_config)
