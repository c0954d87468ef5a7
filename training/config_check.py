"""What a run's config must satisfy before anything starts: every field through its schema,
the rules between sections and the devices (`validate_config`), and, where the workdir already
holds a run, the same model and data setup (`check_compatible`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from configs import schema
from model.config import ConfigError, ModelConfig
from model.kinds import ADAPTERS
from training import mesh as mesh_lib
from workdir import config_io

# Fields that fix the parameter shapes (or what the parameters and token ids mean): a run in a
# workdir may be resumed with other values of every other field (steps, learning rate, ...).
SHAPE_FIELDS = (
    'model.kind', 'model.vocab_size', 'model.num_encoder_layers', 'model.num_decoder_layers',
    'model.d_model', 'model.num_heads', 'model.d_ff', 'model.max_len',
    'model.share_embeddings', 'model.logits_via_embedding', 'model.positional_encoding',
    'model.norm_position', 'model.scan_layers', 'model.scale_embeddings', 'model.norm',
    'model.qk_norm', 'model.activation', 'train.ema_decay', 'data.dataset',
    'data.tokenizer', 'data.vocab_size', 'data.source_lang', 'data.target_lang',
)

TRAINABLE_KINDS = tuple(kind for kind, adapter in ADAPTERS.items() if adapter.has_decoder)


class IncompatibleWorkdirError(ConfigError):
  """The workdir holds a run with a different model shape; nothing was overwritten."""


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
  if not os.path.exists(config_io.config_path(workdir)):
    return []
  old = config_io.to_dict(config_io.load_config(workdir))
  if isinstance(old.get('model'), dict):  # a field newer than the run had its default then
    for field in dataclasses.fields(ModelConfig):
      old['model'].setdefault(field.name, field.default)
  new = config_io.to_dict(config)
  clashes = [f'{f}={_get(old, f)!r} (new {_get(new, f)!r})' for f in SHAPE_FIELDS
             if _get(old, f) != _get(new, f)]
  if not clashes:
    clashes = _layout_changes(old, new)
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


def _layout_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """The fields whose change alters the train state's tree (a parameter's shape, a parameter
  more or less, another optimizer state), found by building both abstractly rather than from a
  list kept by hand: `final_logits_bias` adds a bias, `optimizer.name` another state."""
  import jax  # pylint: disable=import-outside-toplevel

  import optim  # pylint: disable=import-outside-toplevel
  from model import build  # pylint: disable=import-outside-toplevel

  def layout(values):
    config = ml_collections.ConfigDict(values)
    try:
      params = build.param_shapes(ModelConfig.from_config(config.model))
      opt = jax.eval_shape(optim.make_optimizer(config).init, params)
    except (ConfigError, ValueError, KeyError, TypeError):
      return None  # a config this version cannot build: validate_config names its field
    return jax.tree.map(lambda x: (x.shape, x.dtype), (params, opt))

  before, after = layout(old), layout(new)
  if before is None or after is None or before == after:
    return []
  changed = [(section, k) for section in ('model', 'optimizer', 'train')
             for k in sorted(set(old.get(section, {})) | set(new.get(section, {})))
             if old.get(section, {}).get(k) != new.get(section, {}).get(k)]

  def alone(section, key):  # the old config with only this field changed
    return {**old, section: {**old[section], key: new[section][key]}}
  named = [(s, k) for s, k in changed if k in new.get(s, {}) and layout(alone(s, k)) != before]
  return [f'{s}.{k}={old[s].get(k)!r} (new {new[s].get(k)!r})' for s, k in named or changed]


def validate_config(config, *, num_devices: int = 1, process_count: int = 1) -> ModelConfig:
  """Checks every field train.py uses; raises `ConfigError` naming the field. Returns the
  model config. Each section's fields are its schema's to check (configs/schema.py); the rules
  between sections that need the devices or processes are here, the others are
  `schema.check_across`'s (called last)."""
  sections = schema.validate_sections(config)
  model_config = sections['model']
  if model_config.kind not in TRAINABLE_KINDS:
    raise ConfigError(f'config.model.kind={model_config.kind!r}: train.py trains '
                      f'{list(TRAINABLE_KINDS)}')
  train = sections['train']
  if train.batch_size % process_count:
    raise ConfigError(f'config.train.batch_size={train.batch_size} must be divisible by the '
                      f'number of processes ({process_count})')
  mesh_lib.check(sections['mesh'], model_config, train.batch_size, train.grad_accum_steps,
                 num_devices)
  schema.check_across(sections)
  return model_config
