"""The resolved config as one table (`python train.py [--config=...] --show_config`): every
field of every section with its value, where the value came from and the field's doc."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from common.schema import CHOICES, DOC, default_of, leaf_paths
from configs.schema import SECTIONS

# Where a value came from. A preset that sets a field to its default is not told apart from
# one that leaves it: both read 'default' (the config file is code; its assignments leave no
# trace in the ConfigDict).
ORIGINS = {
    'default': "the schema's default",
    'preset': 'the config file changed it',
    'override': '--config.FIELD=VALUE',
}
_MISSING = object()


def rows(config, preset, overrides: Collection[str]) -> list[list[tuple[str, str, str, str]]]:
  """Per section: (field, value, origin, doc) for each field of `config`. `preset` is the
  config the file gave before any override; `overrides` the dotted fields given on the command
  line ('train.num_steps')."""
  out = []
  for section, schema in SECTIONS.items():
    if section not in config:
      continue
    fields = {f.name: f for f in dataclasses.fields(schema)}
    lines = []
    for path in _in_schema_order(leaf_paths(config[section]), list(fields)):
      name = '.'.join((section, *path))
      field = fields.get(path[0])
      default = _default(field, path[1:])
      if name in overrides:
        origin = 'override'
      elif default is _MISSING or _get(preset, name) != default:
        origin = 'preset'
      else:
        origin = 'default'
      lines.append((name, repr(_get(config, name)), origin, _doc(field)))
    out.append(lines)
  return out


def table(config, preset, overrides: Collection[str], name: str) -> str:
  """`rows` as aligned columns, a blank line between sections, under a header naming the
  config and the origins."""
  sections = rows(config, preset, overrides)
  every = [('field', 'value', 'origin', 'doc')] + [r for lines in sections for r in lines]
  widths = [max(len(r[i]) for r in every) for i in range(3)]

  def line(r) -> str:
    return '  '.join(r[i].ljust(widths[i]) for i in range(3)) + '  ' + r[3]

  origins = '; '.join(f'{k}: {v}' for k, v in ORIGINS.items())
  out = [f'config: {name}', f'origin: {origins}', '', line(every[0])]
  for i, lines in enumerate(sections):
    out += [''] * bool(i) + [line(r) for r in lines]
  return '\n'.join(out)


def _in_schema_order(paths: list[tuple[str, ...]], names: list[str]) -> list[tuple[str, ...]]:
  """The schema's field order (a ConfigDict lists its keys sorted); unknown fields last."""
  rank = {name: i for i, name in enumerate(names)}
  return sorted(paths, key=lambda path: rank.get(path[0], len(rank)))


def _default(field: dataclasses.Field | None, subpath: tuple[str, ...]) -> Any:
  """The schema's default of a field (of a key inside a dict field), or _MISSING."""
  if field is None:
    return _MISSING
  value = default_of(field)
  for key in subpath:
    if not isinstance(value, dict) or key not in value:
      return _MISSING
    value = value[key]
  return value


def _doc(field: dataclasses.Field | None) -> str:
  if field is None:
    return '(not in the schema)'
  choices = field.metadata.get(CHOICES)
  text = field.metadata.get(DOC, '')
  return f'{text} [{" | ".join(map(str, choices))}]' if choices is not None else text


def _get(config, dotted: str) -> Any:
  node = config
  for key in dotted.split('.'):
    if not hasattr(node, 'keys') or key not in node:
      return _MISSING
    node = node[key]
  return node
