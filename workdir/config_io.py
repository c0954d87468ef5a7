"""The resolved config in `DIR/config.json`: `save_config(config, workdir)` writes it (atomically),
`load_config(workdir)` reads it back as an `ml_collections.ConfigDict` through the resolver
(`configs.resolve`), a field the run predates at its schema's default. (What a config must
satisfy to train, and to train in a workdir that holds a run: `training.config_check`.)"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import ml_collections

from common.atomic_file import atomic_write
from common.files import read_regular
from configs import resolve, schema
from model.config import ConfigError

CONFIG_FILE = 'config.json'


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
  """`DIR/config.json` -> ConfigDict, a field it lacks (written before the field existed) set to
  its schema's default. Raises `ConfigError` (one line) when missing, unreadable or not a
  config (a JSON object of sections, each an object)."""
  path = config_path(workdir)
  if not os.path.exists(path):
    raise ConfigError(f'{path} not found: is {workdir!r} a training workdir?')
  try:  # a regular file only: a FIFO planted there would block an open() forever
    values = json.loads(read_regular(path))
  except (OSError, ValueError) as e:
    raise ConfigError(f'{path} is not a readable config: {e}') from None
  if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
    raise ConfigError(f'{path} is not a config: a JSON object of sections '
                      f'({", ".join(schema.SECTIONS)}), each an object, was expected')
  # Not checked here: a workdir's own run passed the checks of its version (the model section
  # is checked where it is built, `ModelConfig.from_config`).
  return resolve.resolve(values, validate=False)[0]
