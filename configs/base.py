"""The full config every preset starts from, built from the section schemas' defaults.

Every preset starts from `base_config()` and overrides fields, so each one has every section
(model, data, optimizer, train, decode, mesh) and every field can be overridden from the
command line (`--config.model.num_heads=4`). The fields, their defaults, docs and bounds are
the schemas' (`model.ModelConfig`, configs/schema.py); `python train.py --show_config` lists
them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping

import ml_collections
from ml_collections import config_dict

from common.schema import default_of
from configs.schema import SECTIONS


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  for name, schema in SECTIONS.items():
    config[name] = section_config(schema)
  return config


def section_config(schema) -> ml_collections.ConfigDict:
  """One section's ConfigDict from its schema's defaults. A None default becomes a typed
  placeholder: ml_collections cannot override a plain None field from the command line."""
  hints = typing.get_type_hints(schema)
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(schema):
    value = default_of(field)
    if value is None:
      kind = next(t for t in typing.get_args(hints[field.name]) if t is not type(None))
      section[field.name] = config_dict.placeholder(kind)
    elif isinstance(value, Mapping):
      section[field.name] = ml_collections.ConfigDict(dict(value))
    else:
      section[field.name] = value
  return section


def set_fields(config: ml_collections.ConfigDict, overrides: Mapping[str, object]) -> None:
  """Sets `config`'s 'section.field' entries of `overrides` (a preset that is a sweep row's
  overrides, e.g. `configs/multi30k.py`'s MODERN), in place."""
  for path, value in overrides.items():
    section, field = path.split('.')
    config[section][field] = value
