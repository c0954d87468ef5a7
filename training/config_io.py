"""The resolved config in `DIR/config.json`, config validation, and workdir compatibility.

`save_config(config, workdir)` writes `DIR/config.json`; `load_config(workdir)` reads it back as
an `ml_collections.ConfigDict`. `check_compatible(config, workdir)` refuses (with
`IncompatibleWorkdirError`) a workdir holding a run whose model shape or data/tokenizer setup
differs. `validate_config(config)` checks the train/optimizer/decode fields (and the model via
`model.ModelConfig`) so a bad value fails with one line before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
from typing import Any

import ml_collections

from model.config import ConfigError, ModelConfig
from model.kinds import KINDS, kind_of
from training import mesh as mesh_lib
from training.atomic_file import atomic_write
from training.accelerator import MATMUL_PRECISIONS
from training.optim import OPTIMIZERS, SCHEDULES, WEIGHT_DECAY_MASKS
from training.telemetry import parse_profile_steps

CONFIG_FILE = 'config.json'

# Fields that fix the parameter shapes (or what the parameters and token ids mean): a run in a
# workdir may be resumed with other values of every other field (steps, learning rate, dropout, ...).
SHAPE_FIELDS = (
    'model.kind', 'model.vocab_size', 'model.num_encoder_layers', 'model.num_decoder_layers',
    'model.d_model', 'model.num_heads', 'model.d_ff', 'model.max_len',
    'model.share_embeddings', 'model.logits_via_embedding', 'model.positional_encoding',
    'model.norm_position', 'model.scan_layers', 'model.scale_embeddings', 'data.dataset',
    'data.tokenizer', 'data.vocab_size', 'data.source_lang', 'data.target_lang',
)

MIN_MAX_LENGTH = 2  # a token and its EOS
TRAINABLE_KINDS = tuple(name for name, kind in KINDS.items() if kind.has_decoder)


class IncompatibleWorkdirError(ConfigError):
  """The workdir holds a run with a different model shape; nothing was overwritten."""


def config_path(workdir: str) -> str:
  return os.path.join(workdir, CONFIG_FILE)


def to_dict(config) -> dict[str, Any]:
  return config.to_dict() if hasattr(config, 'to_dict') else dict(config)


def save_config(config, workdir: str) -> str:
  """Writes the resolved config to `DIR/config.json` (atomically); returns the path."""
  os.makedirs(workdir, exist_ok=True)
  path = config_path(workdir)
  text = json.dumps(to_dict(config), indent=2, sort_keys=True, allow_nan=False) + '\n'
  try:
    atomic_write(path, text.encode())
  except OSError as e:
    what = 'no space left on device' if e.errno == errno.ENOSPC else e.strerror or str(e)
    raise ConfigError(f'cannot write {path}: {what}') from None
  return path


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """`DIR/config.json` -> ConfigDict. Raises `ConfigError` (one line) when missing or unreadable."""
  path = config_path(workdir)
  if not os.path.exists(path):
    raise ConfigError(f'{path} not found: is {workdir!r} a training workdir?')
  try:
    with open(path) as f:
      values = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f'{path} is not a readable config: {e}') from None
  return ml_collections.ConfigDict(values)


def _get(values: dict[str, Any], dotted: str):
  for key in dotted.split('.'):
    if not isinstance(values, dict) or key not in values:
      return '<unset>'
    values = values[key]
  return values


def check_compatible(config, workdir: str) -> list[str]:
  """Raises `IncompatibleWorkdirError` if DIR/config.json has a different model shape.

  Returns the (allowed) differences in other fields as 'field: old -> new' strings, empty for
  a new workdir.
  """
  path = config_path(workdir)
  if not os.path.exists(path):
    return []
  old = to_dict(load_config(workdir))
  if isinstance(old.get('model'), dict):  # a field newer than the run had its default then
    for field in dataclasses.fields(ModelConfig):
      old['model'].setdefault(field.name, field.default)
  new = to_dict(config)
  clashes = [f'{f}={_get(old, f)!r} (new {_get(new, f)!r})' for f in SHAPE_FIELDS
             if _get(old, f) != _get(new, f)]
  if clashes:
    raise IncompatibleWorkdirError(
        f'{workdir} holds a run with a different model/data setup: {", ".join(clashes)}; '
        'use another --workdir (nothing was overwritten)')
  changed = []

  def walk(a, b, prefix):
    for key in sorted(set(a) | set(b)):
      name = f'{prefix}{key}'
      va, vb = a.get(key, '<unset>'), b.get(key, '<unset>')
      if isinstance(va, dict) and isinstance(vb, dict):
        walk(va, vb, name + '.')
      elif va != vb:
        changed.append(f'{name}: {va!r} -> {vb!r}')

  walk(old, new, '')
  return changed


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_finite(values: dict[str, Any], prefix: str = 'config') -> None:
  """Every float in the config is finite: `learning_rate=inf` or `alpha=nan` stop here, not at
  step 2 on a NaN loss (or as empty translations)."""
  for key, value in values.items():
    if isinstance(value, dict):
      _check_finite(value, f'{prefix}.{key}')
    elif isinstance(value, float) and not math.isfinite(value):
      raise ConfigError(f'{prefix}.{key}={value!r} must be a finite number')


def validate_config(config, *, num_devices: int = 1, process_count: int = 1) -> ModelConfig:
  """Checks every field train.py uses; raises `ConfigError` naming the field. Returns the model config."""
  for section in ('model', 'data', 'optimizer', 'train', 'decode'):  # 'mesh' may be absent
    _require(section in config, f'config has no {section!r} section (start from configs/base.py)')
  _check_finite(to_dict(config))
  model_config = ModelConfig.from_config(config.model)
  _require(model_config.kind in TRAINABLE_KINDS,
           f'config.model.kind={model_config.kind!r}: train.py trains {list(TRAINABLE_KINDS)}')
  _check_optimizer(config.optimizer)
  _check_train(config.train, process_count)
  mesh_lib.check(config.get('mesh'), model_config, config.train.batch_size,
                 config.train.grad_accum_steps, num_devices)
  _check_data(config.data, model_config)
  _check_decode(config.decode)
  return model_config


def _check_optimizer(o) -> None:
  _require(o.name in OPTIMIZERS, f'config.optimizer.name={o.name!r} is not one of {list(OPTIMIZERS)}')
  _require(o.schedule in SCHEDULES,
           f'config.optimizer.schedule={o.schedule!r} is not one of {list(SCHEDULES)}')
  _require(_is_number(o.learning_rate) and o.learning_rate > 0,
           f'config.optimizer.learning_rate={o.learning_rate!r} must be a positive number')
  _require(_is_int(o.warmup_steps) and o.warmup_steps >= 0,
           f'config.optimizer.warmup_steps={o.warmup_steps!r} must be an integer >= 0')
  _require(o.schedule != 'rsqrt' or o.warmup_steps > 0,
           'config.optimizer.warmup_steps must be > 0 for schedule=rsqrt')
  for field in ('b1', 'b2'):
    value = o[field]
    _require(_is_number(value) and 0 <= value < 1,
             f'config.optimizer.{field}={value!r} must be in [0, 1)')
  _require(_is_number(o.eps) and o.eps > 0, f'config.optimizer.eps={o.eps!r} must be > 0')
  for field in ('weight_decay', 'grad_clip_norm'):
    _require(_is_number(o[field]) and o[field] >= 0,
             f'config.optimizer.{field}={o[field]!r} must be a number >= 0')
  _require(o.get('weight_decay_mask', 'ndim') in WEIGHT_DECAY_MASKS,
           f'config.optimizer.weight_decay_mask={o.get("weight_decay_mask")!r} is not one of '
           f'{list(WEIGHT_DECAY_MASKS)}')
  _require(o.name == 'adamw' or not o.weight_decay,
           f'config.optimizer.weight_decay={o.weight_decay!r} needs config.optimizer.name=adamw')
  _require(_is_number(o.min_learning_rate_ratio) and 0 <= o.min_learning_rate_ratio <= 1,
           f'config.optimizer.min_learning_rate_ratio={o.min_learning_rate_ratio!r} '
           'must be in [0, 1]')


def _check_train(t, process_count: int) -> None:
  for field in ('num_steps', 'batch_size', 'grad_accum_steps', 'eval_every_steps',
                'checkpoint_every_steps', 'max_checkpoints', 'log_every_steps'):
    _require(_is_int(t[field]) and t[field] > 0,
             f'config.train.{field}={t[field]!r} must be a positive integer')
  _require(_is_int(t.seed), f'config.train.seed={t.seed!r} must be an integer')
  _require(t.num_eval_batches is None or (_is_int(t.num_eval_batches) and t.num_eval_batches > 0),
           f'config.train.num_eval_batches={t.num_eval_batches!r} must be a positive integer '
           'or None (the whole split)')
  _require(t.get('matmul_precision', 'default') in MATMUL_PRECISIONS,
           f'config.train.matmul_precision={t.get("matmul_precision")!r} is not one of '
           f'{list(MATMUL_PRECISIONS)}')
  _require(isinstance(t.get('deterministic', False), bool),
           f'config.train.deterministic={t.get("deterministic")!r} must be True or False')
  try:
    parse_profile_steps(t.get('profile_steps', ''))
  except ValueError as e:
    raise ConfigError(f'config.train.profile_steps: {e}') from None
  _require(_is_number(t.label_smoothing) and 0 <= t.label_smoothing < 1,
           f'config.train.label_smoothing={t.label_smoothing!r} must be in [0, 1)')
  _require(t.batch_size % process_count == 0,
           f'config.train.batch_size={t.batch_size} must be divisible by the number of '
           f'processes ({process_count})')


def _check_data(d, model_config: ModelConfig) -> None:
  _require(_is_int(d.max_length) and d.max_length >= MIN_MAX_LENGTH,
           f'config.data.max_length={d.max_length!r} must be an integer >= {MIN_MAX_LENGTH}')
  target_len = kind_of(model_config).target_length(d.max_length)
  _require(model_config.positional_encoding == 'rope' or target_len <= model_config.max_len,
           f'config.data.max_length={d.max_length} needs config.model.max_len >= {target_len} '
           f'(positional_encoding={model_config.positional_encoding!r})')
  _require(_is_int(d.vocab_size) and 0 < d.vocab_size <= model_config.vocab_size,
           f'config.data.vocab_size={d.vocab_size!r} must be in [1, config.model.vocab_size='
           f'{model_config.vocab_size}]')


def _check_decode(dec) -> None:
  for field in ('beam_size', 'max_len', 'batch_size'):
    _require(_is_int(dec[field]) and dec[field] > 0,
             f'config.decode.{field}={dec[field]!r} must be a positive integer')
  _require(_is_int(dec.num_eval_sentences) and dec.num_eval_sentences >= 0,
           f'config.decode.num_eval_sentences={dec.num_eval_sentences!r} must be an integer >= 0')
  _require(_is_number(dec.alpha) and dec.alpha >= 0,
           f'config.decode.alpha={dec.alpha!r} must be a number >= 0')
