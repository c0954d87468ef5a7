"""Version 0.1's parameter tree (the Linen model) -> the NNX model's, and back.

Same arrays, other paths: a layer `layer_i` of 0.1 is `layers/i` here (a `scan_layers` stack
`layers` stays `layers`), and the norm of a sub-layer block, `<block>/norm/LayerNorm_0/{scale,
bias}`, is the layer's `<sub-layer>_norm/{scale, bias}` (`attention_block` was the encoder's
self-attention block). Everything else keeps its path.
"""

from __future__ import annotations

import re
from typing import Any

# block name in 0.1 -> the norm's name in the NNX layer
_NORMS = {'attention_block': 'self_attention_norm', 'self_attention_block': 'self_attention_norm',
          'cross_attention_block': 'cross_attention_norm', 'ffn_block': 'ffn_norm'}
_LAYER = re.compile(r'layer_(\d+)$')


def _flat(tree: Any, prefix: tuple = ()) -> dict[tuple, Any]:
  if not hasattr(tree, 'items'):
    return {prefix: tree}
  out = {}
  for key, value in tree.items():
    out.update(_flat(value, (*prefix, key)))
  return out


def _nest(flat: dict[tuple, Any]) -> dict:
  out: dict = {}
  for path, value in flat.items():
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return out


def _convert_path(path: tuple) -> tuple:
  out = []
  for i, key in enumerate(path):
    key = str(key)
    if key == 'LayerNorm_0' or (key == 'norm' and i > 0 and str(path[i - 1]) in _NORMS):
      continue
    layer = _LAYER.match(key)
    if layer:
      out += ['layers', int(layer.group(1))]
    else:
      out.append(_NORMS.get(key, key))
  return tuple(out)


def from_linen(params: Any) -> dict:
  """0.1's params tree (nested dicts of arrays) -> the NNX model's pure dict
  (`nnx.state(model, nnx.Param).to_pure_dict()` layout; list indices are ints)."""
  return _nest({_convert_path(path): x for path, x in _flat(params).items()})
