"""The resolved config as one table (`python train.py [--config=...] --show_config`): every
field of every section with its value, where the value came from and the field's doc."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common.schema import CHOICES, DOC, leaf_paths
from configs.resolve import ORIGINS
from configs.schema import SECTIONS


def rows(config, origins: Mapping[str, str]) -> list[list[tuple[str, str, str, str]]]:
  """Per section: (field, value, origin, doc) for each field of `config`; `origins` is
  `configs.resolve`'s (dotted field -> a key of ORIGINS)."""
  out = []
  for section, schema in SECTIONS.items():
    if section not in config:
      continue
    fields = {f.name: f for f in dataclasses.fields(schema)}
    lines = []
    for path in _in_schema_order(leaf_paths(config[section]), list(fields)):
      name = '.'.join((section, *path))
      lines.append((name, repr(_get(config, name)), origins[name], _doc(fields.get(path[0]))))
    out.append(lines)
  return out


def table(config, origins: Mapping[str, str], name: str) -> str:
  """`rows` as aligned columns, a blank line between sections, under a header naming the
  config and the origins."""
  sections = rows(config, origins)
  every = [('field', 'value', 'origin', 'doc')] + [r for lines in sections for r in lines]
  widths = [max(len(r[i]) for r in every) for i in range(3)]

  def line(r) -> str:
    return '  '.join(r[i].ljust(widths[i]) for i in range(3)) + '  ' + r[3]

  legend = '; '.join(f'{k}: {v}' for k, v in ORIGINS.items())
  out = [f'config: {name}', f'origin: {legend}', '', line(every[0])]
  for i, lines in enumerate(sections):
    out += [''] * bool(i) + [line(r) for r in lines]
  return '\n'.join(out)


def _in_schema_order(paths: list[tuple[str, ...]], names: list[str]) -> list[tuple[str, ...]]:
  """The schema's field order (a ConfigDict lists its keys sorted); unknown fields last."""
  rank = {name: i for i, name in enumerate(names)}
  return sorted(paths, key=lambda path: rank.get(path[0], len(rank)))


def _doc(field: dataclasses.Field | None) -> str:
  if field is None:
    return '(not in the schema)'
  choices = field.metadata.get(CHOICES)
  text = field.metadata.get(DOC, '')
  return f'{text} [{" | ".join(map(str, choices))}]' if choices is not None else text


def _get(config, dotted: str) -> Any:
  node = config
  for key in dotted.split('.'):
    node = node[key]
  return node
