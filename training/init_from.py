"""`config.train.init_from=DIR`: a run that starts from another workdir's model.

DIR is an imported checkpoint (import.py) or any trained workdir. The new run takes DIR's
model section (the fields not set on the command line: dropout, dtype, attention_impl, remat
and the like may be; the shape fields may not), its tokenizer (copied into the new workdir)
and, at step 0, its newest parameters; the optimizer, schedule, data and steps are the run's
own. Once the new workdir has a checkpoint, a rerun resumes from it as any run does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from common.errors import ConfigError
from model.config import ModelConfig
from optim import ema
from training import config_check
from workdir import config_io

# The data fields that belong to the tokenizer, so to DIR.
TOKENIZER_FIELDS = ('tokenizer', 'vocab_size')


def source(config) -> str | None:
  return config.train.get('init_from') or None


def configure(config, overridden: frozenset[str] = frozenset(),
              workdir: str | None = None) -> None:
  """DIR's model section and tokenizer fields into `config` (in place), but the model fields
  named in `overridden` (dotted, e.g. 'model.dropout_rate'); refuses a shape field there.
  A `workdir` that has started from DIR (its config.json and a checkpoint) resumes from its
  own config.json: DIR is no longer needed, and may be gone."""
  directory = source(config)
  if directory is None:
    return
  if workdir is not None and _started(workdir):
    directory = workdir
  elif not os.path.isfile(config_io.config_path(directory)):
    raise ConfigError(f'config.train.init_from={directory!r} is not a workdir (no config.json '
                      'there): give import.py\'s or a trained run\'s workdir')
  else:  # checked before anything is written into the new workdir
    from workdir import checkpoint  # pylint: disable=import-outside-toplevel
    if not checkpoint.list_steps(directory):
      raise ConfigError(f'config.train.init_from={directory!r} has no checkpoint to start from '
                        f'({checkpoint.checkpoint_dir(directory)})')
    if workdir is not None:
      _check_same_tokenizer(directory, workdir)
  start = config_io.load_config(directory)
  clashes = sorted(f for f in overridden if f in config_check.SHAPE_FIELDS and
                   f.startswith('model.'))
  if clashes:
    raise ConfigError(f'--config.{clashes[0]} cannot be set with config.train.init_from: the '
                      f'parameters of {directory} fix it ({start.model.get(clashes[0][6:])!r})')
  theirs = {field.name: start.model.get(field.name, field.default)
            for field in dataclasses.fields(ModelConfig)}
  for field in dataclasses.fields(ModelConfig):
    if f'model.{field.name}' not in overridden:
      config.model[field.name] = theirs[field.name]
  if directory != workdir:  # a resume's own config.json: check_compatible compares layouts
    _check_same_parameters(theirs, {field.name: config.model.get(field.name, field.default)
                                    for field in dataclasses.fields(ModelConfig)}, directory)
  for field in TOKENIZER_FIELDS:  # the tokenizer is DIR's: a value given for it is refused
    if f'data.{field}' in overridden and config.data[field] != start.data[field]:
      raise ConfigError(f'--config.data.{field}={config.data[field]!r} cannot be set with '
                        f'config.train.init_from: the tokenizer of {directory} fixes it '
                        f'({start.data[field]!r})')
    config.data[field] = start.data[field]


def _check_same_parameters(theirs: dict, mine: dict, directory: str) -> None:
  """Every parameter of the new model starts from DIR's: a model field set on the command line
  that adds a parameter DIR lacks (`final_logits_bias`, `embedding_norm`) or drops one it has
  is refused in one line naming the field, before anything is written into the new workdir
  (it was a JAX traceback on the trees' key sets once config.json, the tokenizer and an event
  file were written). Both models are built abstractly: no list of such fields is kept."""
  from flax import traverse_util  # pylint: disable=import-outside-toplevel

  from model import build  # pylint: disable=import-outside-toplevel

  def layout(values):
    try:
      shapes = build.param_shapes(ModelConfig.from_config(values))
    except (ConfigError, ValueError, KeyError, TypeError):
      return None  # a value this model cannot take: validate_config names its field
    return {'/'.join(map(str, path)): tuple(x.shape)
            for path, x in traverse_util.flatten_dict(shapes).items()}

  before = layout(theirs)
  after = layout(mine) if before is not None else None
  if after is None or after == before:
    return
  changed = [k for k in sorted(mine) if mine[k] != theirs.get(k)]
  named = [k for k in changed if layout({**theirs, k: mine[k]}) != before] or changed

  def some(paths):
    paths = sorted(paths)
    return ', '.join(paths[:3]) + (f' and {len(paths) - 3} more' if len(paths) > 3 else '')
  added = set(after) - set(before)
  dropped = set(before) - set(after)
  reshaped = {k for k in set(after) & set(before) if after[k] != before[k]}
  what = '; '.join(
      text for text in (f'adds {some(added)}, which the parameters of {directory} lack'
                        if added else '',
                        f'drops {some(dropped)}, which the parameters of {directory} have'
                        if dropped else '',
                        f'reshapes {some(reshaped)}' if reshaped else '') if text)
  fields = ' '.join(f'--config.model.{k}={mine[k]!r}' for k in named)
  raise ConfigError(f'{fields} cannot be set with config.train.init_from={directory!r}: the run '
                    f'starts every parameter from its checkpoint, and this {what}; leave '
                    + ', '.join(f'model.{k} as {directory} has it ({theirs[k]!r})'
                                for k in named) + ' (nothing was written)')


def _check_same_tokenizer(directory: str, workdir: str) -> None:
  """A workdir that already holds a tokenizer (a refused or killed start) must hold DIR's:
  another one would train DIR's parameters on other token ids."""
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  if not tokenizers.has_tokenizer(workdir):
    return
  mine, theirs = (_tokenizer_files(d) for d in (workdir, directory))
  if mine != theirs:
    raise ConfigError(f'{workdir} holds another tokenizer than config.train.init_from='
                      f'{directory!r}: use another --workdir (nothing was changed)')


def _tokenizer_files(workdir: str) -> dict[str, bytes]:
  from common.files import read_regular  # pylint: disable=import-outside-toplevel
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  directory = os.path.join(workdir, tokenizers.TOKENIZER_DIR)
  return {name: read_regular(os.path.join(directory, name)) for name in sorted(os.listdir(
      directory)) if not name.startswith('.') and os.path.isfile(os.path.join(directory, name))}


def _started(workdir: str) -> bool:
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  return os.path.isfile(config_io.config_path(workdir)) and bool(checkpoint.list_steps(workdir))


def copy_tokenizer(config, workdir: str) -> None:
  """DIR's tokenizer into `workdir`, unless it has one (a resumed run)."""
  from input_pipeline import tokenizers  # pylint: disable=import-outside-toplevel
  directory = source(config)
  if directory is None or tokenizers.has_tokenizer(workdir):
    return
  if not tokenizers.has_tokenizer(directory):
    raise ConfigError(f'config.train.init_from={directory!r} has no tokenizer '
                      f'({os.path.join(directory, tokenizers.TOKENIZER_DIR)})')
  tokenizers.load_tokenizer(directory)  # its checksums: a damaged one is not copied
  target = os.path.join(workdir, tokenizers.TOKENIZER_DIR)
  partial = target + '.copying'
  shutil.rmtree(partial, ignore_errors=True)
  shutil.copytree(os.path.join(directory, tokenizers.TOKENIZER_DIR), partial,
                  ignore=shutil.ignore_patterns('.lock'))
  os.replace(partial, target)


def params(config):
  """DIR's newest parameters (a pure dict on the first local device), or None without DIR."""
  from training.metrics import log  # pylint: disable=import-outside-toplevel
  from workdir import checkpoint  # pylint: disable=import-outside-toplevel
  if source(config) is None:
    return None
  theirs = config_io.load_config(source(config))
  found, step = checkpoint.restore_params(source(config), config=theirs)
  averaged = ' (their moving average)' if ema.decay(theirs) else ''
  log(f'starting from the parameters{averaged} of {source(config)} (its step {step})')
  return found
