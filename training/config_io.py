"""The resolved config in `DIR/config.json`, config validation, and workdir compatibility.

`save_config(config, workdir)` writes `DIR/config.json`; `load_config(workdir)` reads it back as
an `ml_collections.ConfigDict`.
`check_compatible(config, workdir)` refuses (with `IncompatibleWorkdirError`) a workdir holding a
run whose model shape or data/tokenizer setup differs. `validate_config(config)` checks the
train/optimizer/decode fields (and the model via `model.ModelConfig`) so a bad value fails with
one line before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
from typing import Any

import ml_collections
import numpy as np

from common.atomic_file import atomic_write
from common.decode_limits import (
  ALPHA_MAX,
  BEAM_SIZE_MAX,
  DECODE_BATCH_MAX,
  TEMPERATURE_MAX,
  TEMPERATURE_MIN,
)
from common.tokens import DEFAULT_MIN_NEW_TOKENS
from model.config import ConfigError, ModelConfig
from model.kinds import ADAPTERS, adapter_of
from training import mesh as mesh_lib
from training.accelerator import MATMUL_PRECISIONS
from training.cli import FLOAT32_MAX, INT32_MAX, UINT32_MAX
from training.optim import OPTIMIZERS, SCHEDULES, WEIGHT_DECAY_MASKS
from training.telemetry import parse_profile_steps

CONFIG_FILE = 'config.json'

# Fields that fix the parameter shapes (or what the parameters and token ids mean): a run in a
# workdir may be resumed with other values of every other field (steps, learning rate, ...).
SHAPE_FIELDS = (
    'model.kind', 'model.vocab_size', 'model.num_encoder_layers', 'model.num_decoder_layers',
    'model.d_model', 'model.num_heads', 'model.d_ff', 'model.max_len',
    'model.share_embeddings', 'model.logits_via_embedding', 'model.positional_encoding',
    'model.norm_position', 'model.scan_layers', 'model.scale_embeddings', 'data.dataset',
    'data.tokenizer', 'data.vocab_size', 'data.source_lang', 'data.target_lang',
)

MIN_MAX_LENGTH = 2  # a token and its EOS
# Floats are used as float32 (the schedule, the optimizer, decoding): a value must be finite
# there, and a positive one must not underflow to 0 (nor to a subnormal, which XLA may flush
# to 0 on CPU/GPU): eps=1e-50 would divide 0 by 0 at a zero gradient.
FLOAT32_TINY = 1.1754944e-38  # the smallest normal float32
TRAINABLE_KINDS = tuple(kind for kind, adapter in ADAPTERS.items() if adapter.has_decoder)


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


def _check_numbers(values: dict[str, Any], prefix: str = 'config') -> None:
  """Every number in the config fits the type it is used in: floats finite as a float32
  (`1e308` is finite in Python, inf there: `learning_rate=1e308` would stop at step 2 on a
  NaN loss), ints within int32 (steps, sizes and indices are int32 arrays; the seed, a uint32,
  is checked with the train fields)."""
  for key, value in values.items():
    name = f'{prefix}.{key}'
    if isinstance(value, dict):
      _check_numbers(value, name)
    elif isinstance(value, float) and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
      raise ConfigError(f'{name}={value!r} must be a finite number (as a float32: at most '
                        f'{FLOAT32_MAX:.4g} in magnitude)')
    elif _is_int(value) and name != 'config.train.seed' and abs(value) > INT32_MAX:
      raise ConfigError(f'{name}={value} is out of range: at most {INT32_MAX} (an int32)')


def _float32(value) -> float:
  """`value` as it is in float32 (b2=0.99999999 is 1.0 there)."""
  return float(np.float32(value))


def _in_unit(value, *, closed: bool = False) -> bool:
  """A number in [0, 1) (or [0, 1] when `closed`), also after rounding to float32."""
  return (_is_number(value) and 0 <= value and 0 <= _float32(value)
          and (_float32(value) <= 1 if closed else _float32(value) < 1))


def validate_config(config, *, num_devices: int = 1, process_count: int = 1) -> ModelConfig:
  """Checks every field train.py uses; raises `ConfigError` naming the field. Returns the
  model config."""
  for section in ('model', 'data', 'optimizer', 'train', 'decode'):  # 'mesh' may be absent
    _require(section in config, f'config has no {section!r} section (start from configs/base.py)')
  _check_numbers(to_dict(config))
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
  _require(o.name in OPTIMIZERS,
           f'config.optimizer.name={o.name!r} is not one of {list(OPTIMIZERS)}')
  _require(o.schedule in SCHEDULES,
           f'config.optimizer.schedule={o.schedule!r} is not one of {list(SCHEDULES)}')
  _require(_is_number(o.learning_rate) and o.learning_rate >= FLOAT32_TINY,
           f'config.optimizer.learning_rate={o.learning_rate!r} must be a positive number '
           f'(at least {FLOAT32_TINY:.4g}, the smallest normal float32)')
  _require(_is_int(o.warmup_steps) and o.warmup_steps >= 0,
           f'config.optimizer.warmup_steps={o.warmup_steps!r} must be an integer >= 0')
  _require(o.schedule != 'rsqrt' or o.warmup_steps > 0,
           'config.optimizer.warmup_steps must be > 0 for schedule=rsqrt')
  for field in ('b1', 'b2'):
    value = o[field]
    _require(_in_unit(value), f'config.optimizer.{field}={value!r} must be in [0, 1) (also as a '
                              'float32, where 1 - 1e-9 is 1)')
  _require(_is_number(o.eps) and o.eps >= FLOAT32_TINY,
           f'config.optimizer.eps={o.eps!r} must be at least {FLOAT32_TINY:.4g} (the smallest '
           'normal float32; a smaller one is 0 there)')
  for field in ('weight_decay', 'grad_clip_norm'):
    _require(_is_number(o[field]) and o[field] >= 0,
             f'config.optimizer.{field}={o[field]!r} must be a number >= 0')
  _require(o.get('weight_decay_mask', 'ndim') in WEIGHT_DECAY_MASKS,
           f'config.optimizer.weight_decay_mask={o.get("weight_decay_mask")!r} is not one of '
           f'{list(WEIGHT_DECAY_MASKS)}')
  _require(o.name == 'adamw' or not o.weight_decay,
           f'config.optimizer.weight_decay={o.weight_decay!r} needs config.optimizer.name=adamw')
  _require(_in_unit(o.min_learning_rate_ratio, closed=True),
           f'config.optimizer.min_learning_rate_ratio={o.min_learning_rate_ratio!r} '
           'must be in [0, 1]')


def _check_train(t, process_count: int) -> None:
  for field in ('num_steps', 'batch_size', 'grad_accum_steps', 'eval_every_steps',
                'checkpoint_every_steps', 'max_checkpoints', 'log_every_steps'):
    _require(_is_int(t[field]) and t[field] > 0,
             f'config.train.{field}={t[field]!r} must be a positive integer')
  _require(_is_int(t.seed) and 0 <= t.seed <= UINT32_MAX,
           f'config.train.seed={t.seed!r} must be an integer in [0, {UINT32_MAX}] (a 32-bit PRNG '
           'seed)')
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
  _require(_in_unit(t.label_smoothing),
           f'config.train.label_smoothing={t.label_smoothing!r} must be in [0, 1) (also as a '
           'float32)')
  _require(t.batch_size % process_count == 0,
           f'config.train.batch_size={t.batch_size} must be divisible by the number of '
           f'processes ({process_count})')


def _check_data(d, model_config: ModelConfig) -> None:
  _require(_is_int(d.max_length) and d.max_length >= MIN_MAX_LENGTH,
           f'config.data.max_length={d.max_length!r} must be an integer >= {MIN_MAX_LENGTH}')
  target_len = adapter_of(model_config).target_length(d.max_length)
  _require(model_config.positional_encoding == 'rope' or target_len <= model_config.max_len,
           f'config.data.max_length={d.max_length} needs config.model.max_len >= {target_len} '
           f'(positional_encoding={model_config.positional_encoding!r})')
  _require(_is_int(d.vocab_size) and 0 < d.vocab_size <= model_config.vocab_size,
           f'config.data.vocab_size={d.vocab_size!r} must be in [1, config.model.vocab_size='
           f'{model_config.vocab_size}]')


def _check_decode(dec) -> None:
  """The validation BLEU's decoding settings, and decode.py's defaults: decode.py's bounds."""
  bounds = {'beam_size': BEAM_SIZE_MAX, 'max_new_tokens': INT32_MAX,
            'batch_size': DECODE_BATCH_MAX}
  for field, most in bounds.items():
    _require(_is_int(dec[field]) and 0 < dec[field] <= most,
             f'config.decode.{field}={dec[field]!r} must be an integer in [1, {most}]')
  _require(_is_int(dec.num_eval_sentences) and dec.num_eval_sentences >= 0,
           f'config.decode.num_eval_sentences={dec.num_eval_sentences!r} must be an integer >= 0')
  _require(_is_number(dec.alpha) and 0 <= dec.alpha <= ALPHA_MAX,
           f'config.decode.alpha={dec.alpha!r} must be a number in [0, {ALPHA_MAX:g}] (the '
           'length penalty ((5 + len) / 6) ** alpha must stay finite in float32)')
  temperature = dec.get('temperature', 1.0)
  _require(_is_number(temperature) and (
      temperature == 0 or TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX),
           f'config.decode.temperature={temperature!r} must be 0 (greedy) or in '
           f'[{TEMPERATURE_MIN:g}, {TEMPERATURE_MAX:g}] (logits / temperature in float32)')
  top_k = dec.get('top_k', 0)
  _require(_is_int(top_k) and top_k >= 0,
           f'config.decode.top_k={top_k!r} must be an integer >= 0 (0 = no top-k)')
  least = dec.get('min_new_tokens', DEFAULT_MIN_NEW_TOKENS)
  _require(_is_int(least) and 0 <= least <= dec.max_new_tokens,
           f'config.decode.min_new_tokens={least!r} must be an integer in [0, '
           f'config.decode.max_new_tokens={dec.max_new_tokens}] (tokens before EOS may end an '
           'output)')
