"""The one way a config is resolved: a preset (`FILE.py[:preset]`, or config.json's values) and
dotted overrides (Python values) become the config a run trains with, and each field's origin.

    config, origins = resolve('configs/default.py:tiny', {'train.num_steps': 500})
    origins['train.num_steps'] == 'override'

train.py (its run and --show_config), sweep.py's plan (every row goes through `resolve`, the
function train.py runs) and the reading of a workdir's config.json (`workdir.config_io`, which
decode.py and export.py read) all come here. An override naming no field is refused here, with
the 'did you mean' of `common.schema.did_you_mean`; a value is checked by the sections' schemas
and the rules between them (`check`). Turning a command line's text into Python values is
`parse_command_line`'s (ml_collections' config_flags, as train.py's flags parse it).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from common.errors import ConfigError
from common.schema import default_of, did_you_mean, leaf_paths
from configs import schema

# Where a field's value came from (--show_config's origin column). A preset that sets a field
# to its default is not told apart from one that leaves it: both read 'default' (the config
# file is code; its assignments leave no trace in the ConfigDict).
ORIGINS = {
    'default': "the schema's default",
    'preset': 'the config file changed it',
    'override': '--config.FIELD=VALUE',
}
_MISSING = object()


class UnknownField(ConfigError):
  """An override naming no field of the config: `field` as written, `hint` the 'did you mean'
  (or what the config has there). A command line names it its own way (train.py:
  `--config.FIELD`)."""

  def __init__(self, field: str, hint: str):
    super().__init__(f'unknown config field {field!r}{hint}')
    self.field, self.hint = field, hint


def load(spec: str) -> ml_collections.ConfigDict:
  """The config of `FILE.py[:preset]` (its `get_config(preset)`), before any override;
  `ConfigError` (one line, naming the spec) when the file fails."""
  path, _, preset = spec.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'config file {path!r} not found (--config=configs/NAME.py[:preset])')
  try:
    config = call_in_file(path, 'get_config', *([preset] if preset else []))
  except Exception as e:  # noqa: BLE001  (the file is code: any error is its error)
    raise ConfigError(f'{spec}: {" ".join(str(e).split())}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f'{spec}: get_config() returned {type(config).__name__}, not a '
                      'ConfigDict (start from configs/base.py)')
  return config


def call_in_file(path: str, function: str, *args) -> Any:
  """Runs the Python file at `path` (a preset; a sweep file, configs/sweeps/) as a module of its
  own and returns its `function(*args)`; the file's errors propagate."""
  module_spec = importlib.util.spec_from_file_location(f'_{function}_file', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return getattr(module, function)(*args)


def with_defaults(values: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A config's values (config.json's: JSON objects per section) as a ConfigDict, each field
  they lack (a run from before the field existed) at its schema's default."""
  values = {name: dict(section) for name, section in values.items()}
  for name, section in schema.SECTIONS.items():
    values[name] = section.defaults() | values.get(name, {})
  return ml_collections.ConfigDict(values)


def check_fields(config, fields: Sequence[str]) -> None:
  """Each dotted field names a field of `config`; the first that does not raises
  `UnknownField` with the closest fields (or, with none close, the keys where it went wrong)."""
  paths = leaf_paths(config)
  for field in fields:
    node = config
    for i, key in enumerate(str(field).split('.')):
      keys = list(node.keys()) if hasattr(node, 'keys') else []
      if key not in keys:
        where = '.'.join(['config'] + str(field).split('.')[:i])
        hint = did_you_mean(str(field), paths) or f'{where} has {sorted(keys)}'
        raise UnknownField(str(field), f'; {hint}')
      node = node[key]


def resolve(spec: str | Mapping[str, Any], overrides: Mapping[str, Any] | None = None, *,
            validate: bool = True) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """-> (config, origins): the preset `spec` (a `FILE.py[:preset]`, a ConfigDict `load` gave,
  or a config's values such as config.json's, a missing field at its default), `overrides`
  ({'section.field': value}) applied, checked by the schema unless `validate=False` (the
  trainer checks a config once `train.init_from` filled its model section); `origins` maps
  every dotted field to a key of ORIGINS. The preset is not changed. Raises `ConfigError`
  (`UnknownField` for a typo)."""
  overrides = dict(overrides or {})
  if isinstance(spec, str):
    preset = load(spec)
  elif isinstance(spec, ml_collections.ConfigDict):
    preset = spec
  else:
    preset = with_defaults(spec)
  check_fields(preset, list(overrides))
  config = copy.deepcopy(preset)  # a field shared by reference (a FieldReference) stays shared
  for field, value in overrides.items():
    *parents, leaf = field.split('.')
    node = config
    for key in parents:
      node = node[key]
    try:
      node[leaf] = value
    except (TypeError, ValueError) as e:  # ConfigDict's type check (an int field given text)
      raise ConfigError(f'config.{field}={value!r}: {" ".join(str(e).split())}') from None
  if validate:
    check(config)
  return config, origins_of(preset, overrides)


def check(config) -> None:
  """Every section through its schema, then the rules between sections (those that need no
  devices: the devices' are the trainer's). Raises `ConfigError` naming the first bad field."""
  schema.check_across(schema.validate_sections(config))


def origins_of(preset, overridden) -> dict[str, str]:
  """Every dotted field of `preset` -> 'override' (in `overridden`), 'preset' (not the schema's
  default) or 'default'."""
  out = {}
  for path in leaf_paths(preset):
    name = '.'.join(path)
    if name in overridden:
      out[name] = 'override'
    else:
      default = schema_default(path)
      out[name] = 'preset' if default is _MISSING or _get(preset, path) != default else 'default'
  return out


def schema_default(path: Sequence[str]) -> Any:
  """The schema's default of a field (or of a key inside a dict field such as mesh.rules), or
  _MISSING for a field the schema does not have."""
  section = schema.SECTIONS.get(path[0])
  fields = {f.name: f for f in dataclasses.fields(section)} if section else {}
  if len(path) < 2 or path[1] not in fields:
    return _MISSING
  value = default_of(fields[path[1]])
  for key in path[2:]:
    if not isinstance(value, dict) or key not in value:
      return _MISSING
    value = value[key]
  return value


def _get(config, path: Sequence[str]) -> Any:
  node = config
  for key in path:
    node = node[key]
  return node


def parse_command_line(spec: str, args: Sequence[str]) -> dict[str, Any]:
  """`--config.FIELD=TEXT` arguments -> {'FIELD': value}, each text read by ml_collections'
  config_flags as train.py's command line reads it (by the field's type: '500' is 500 for an
  int field). Raises `ConfigError` (one line) for a text the field's type refuses."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  values = flags.FlagValues()
  argv = ['train.py', f'--config={spec}', *args]
  config_flags.DEFINE_config_file('config', None, 'Config file[:preset].', flag_values=values,
                                  lock_config=True, sys_argv=argv)
  try:
    values(argv)
    return config_flags.get_override_values(values['config'])
  except Exception as e:  # noqa: BLE001  (absl/config_flags raise many types)
    raise ConfigError(flag_error_text(e)) from None


def flag_error_text(error: BaseException) -> str:
  """config_flags' error in one line: a config file's own error (which config_flags wraps in
  its traceback) by its last line."""
  raw = str(error)
  if 'Traceback (most recent call last)' in raw:
    found = re.findall(r'^(\w+(?:Error|Exception)): (.*)$', raw, flags=re.M)
    if found:
      raw = found[-1][1]
  return ' '.join(raw.replace('\\n', ' ').replace('\\', '').split())
