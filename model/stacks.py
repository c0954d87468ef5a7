"""Stacks of layers: an `nnx.List` of N layers, or (`scan_layers`) one layer module whose
parameters carry a leading `[N]` axis (logical name 'layers') run under `jax.lax.scan`, so XLA
compiles one layer instead of N; `remat` wraps each layer's call in `jax.checkpoint`.

The two layouts convert both ways (`stack_layer_params`, `unstack_layer_params` on the pure
parameter dict; `model.build.unrolled` on a model): decoding and attention plots run unrolled,
since their KV caches and kept weights are per layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from model.dropout import layer_key

if TYPE_CHECKING:
  from model.config import ModelConfig

Array = jax.Array
STACKS = ('encoder', 'decoder')  # the model attributes that hold a stack of `layers`


def stack_modules(modules: list[nnx.Module]) -> nnx.Module:
  """Modules of one structure -> one module whose parameters are theirs stacked on a new
  leading axis (logical name 'layers')."""
  graphdef, first = nnx.split(modules[0])
  states = [first] + [nnx.split(m)[1] for m in modules[1:]]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  for _, variable in nnx.to_flat_state(stacked):
    variable.set_metadata('axes', ('layers', *variable.get_metadata().get('axes', ())))
  return nnx.merge(graphdef, stacked)


def make_layers(config: ModelConfig, make, num_layers: int):
  """`num_layers` layers from `make()`: an `nnx.List`, or with `scan_layers` one stacked
  module (`stack_modules`)."""
  layers = [make() for _ in range(num_layers)]
  return stack_modules(layers) if config.scan_layers else nnx.List(layers)


def run_layers(config: ModelConfig, layers, x: Array, call, dropout_rng: Array | None):
  """`x` through the stack: `call(layer, x, layer_dropout_rng)` -> x per layer. Layer i's
  dropout key is `layer_key(dropout_rng, i)` either way."""
  if not config.scan_layers and not config.remat:  # the layers themselves (plots keep weights)
    for i, layer in enumerate(layers):
      x = call(layer, x, layer_key(dropout_rng, i))
    return x
  graphdef = nnx.graphdef(layers if config.scan_layers else layers[0])  # one per stack

  def body(state, x, rng):  # a pure function of the layer's arrays, for checkpoint and scan
    return call(nnx.merge(graphdef, state), x, rng)
  if config.remat:  # trades compute for activation memory in the backward pass
    body = jax.checkpoint(body)
  if not config.scan_layers:
    for i, layer in enumerate(layers):
      x = body(nnx.state(layer), x, layer_key(dropout_rng, i))
    return x
  stacked = nnx.state(layers)
  count = jax.tree.leaves(stacked)[0].shape[0]
  rngs = None if dropout_rng is None else jax.vmap(
      lambda i: layer_key(dropout_rng, i))(jnp.arange(count))
  return jax.lax.scan(lambda x, xs: (body(xs[0], x, xs[1]), None), x, (stacked, rngs))[0]


def _stacks(pure: dict) -> list[dict]:
  return [pure[name] for name in STACKS if name in pure and 'layers' in pure[name]]


def stack_layer_params(pure: dict) -> dict:
  """Unrolled layout (`layers/0`, `layers/1`, ...) -> the `scan_layers` layout (`layers`,
  every leaf `[num_layers, ...]`). Other parameters are shared, not copied."""
  pure = jax.tree.map(lambda x: x, pure)  # new dicts, same leaves
  for stack in _stacks(pure):
    layers = stack['layers']
    if set(layers) == set(range(len(layers))):
      stack['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs),
                                     *[layers[i] for i in range(len(layers))])
  return pure


def unstack_layer_params(pure: dict) -> dict:
  """The `scan_layers` layout -> the unrolled layout (the inverse of `stack_layer_params`)."""
  pure = jax.tree.map(lambda x: x, pure)
  for stack in _stacks(pure):
    layers = stack['layers']
    if set(layers) != set(range(len(layers))):
      count = jax.tree.leaves(layers)[0].shape[0]
      stack['layers'] = {i: jax.tree.map(lambda x, i=i: x[i], layers) for i in range(count)}
  return pure
