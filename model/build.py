"""Building a model, and the two forms it travels in: an `nnx.Module` holding its parameters,
or (config, params) with `params` the pure dict of its `nnx.Param` values.

Jitted functions take the second form (the config static, the params traced): `bind` rebuilds
the module inside the trace for free, while passing the module itself would flatten its object
graph at every call (~1 ms for a tiny model, more for a large one). Checkpoints, the optimizer
and the exports see the pure dict (`params_of`); list indices (`layers/0`) are ints there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from flax import nnx, traverse_util
from jax.sharding import PartitionSpec as P

from model import stacks
from model.config import ModelConfig
from model.kinds import ADAPTERS

Params = dict[str, Any]


def build_model(model_config, *, rngs: nnx.Rngs | None = None) -> nnx.Module:
  """The `nnx.Module` for `model_config.kind` (a ConfigDict, dict or `ModelConfig`), validated
  (`ConfigError` names a bad field), with parameters initialised from `rngs` (seed 0)."""
  config = as_config(model_config)
  return ADAPTERS[config.kind].module_class(config, rngs=rngs or nnx.Rngs(0))


def as_config(model_config) -> ModelConfig:
  """A validated `ModelConfig` from a ConfigDict, dict or `ModelConfig`."""
  if not isinstance(model_config, ModelConfig):
    return ModelConfig.from_config(model_config)
  model_config.validate()
  return model_config


def abstract_model(config: ModelConfig) -> nnx.Module:
  """The model with `jax.ShapeDtypeStruct`s for parameters (nothing is computed)."""
  return bind(config, param_shapes(config))


@functools.cache
def _abstract_parts(config: ModelConfig) -> tuple[nnx.GraphDef, tuple]:
  """(graphdef, ((path, ShapeDtypeStruct, logical axes), ...)) of `config`'s model, built
  abstractly once per config: building even a tiny model traces every initialiser (~0.2 s),
  and a run asks for its structure, shapes and axes several times (steps, restore, shardings)."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(config)), nnx.Param)
  leaves = tuple((path, variable.get_value(), tuple(variable.get_metadata().get('axes', ())))
                 for path, variable in nnx.to_flat_state(state))
  return graphdef, leaves


def _parts(model_config) -> tuple[nnx.GraphDef, tuple]:
  """`_abstract_parts` of a `ModelConfig` (validated by its first, cached build: not again at
  every `bind`), ConfigDict or dict."""
  if isinstance(model_config, ModelConfig):
    return _abstract_parts(model_config)
  return _abstract_parts(as_config(model_config))


def graphdef_of(config: ModelConfig) -> nnx.GraphDef:
  """The structure of `config`'s model (what `bind` fills with parameters)."""
  return _parts(config)[0]


def bind(config: ModelConfig, params: Params) -> nnx.Module:
  """The model of `config` holding `params` (a pure dict; no copy, no compute)."""
  return nnx.merge(graphdef_of(config), params)


def params_of(model: nnx.Module) -> Params:
  """The pure dict of the model's parameter arrays."""
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def param_shapes(config: ModelConfig) -> Params:
  """`params_of`'s tree as ShapeDtypeStructs (no compute)."""
  return traverse_util.unflatten_dict({path: shape for path, shape, _ in _parts(config)[1]})


def logical_axes(config: ModelConfig) -> Params:
  """`params_of`'s tree with a `PartitionSpec` of logical names per leaf (`P()` for a
  parameter without names: LayerNorm scales and biases, replicated). No arrays."""
  return traverse_util.unflatten_dict({path: P(*axes) for path, _, axes in _parts(config)[1]})


def count_params(params: Params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))


def with_options(model: nnx.Module, **changes) -> nnx.Module:
  """The same parameters in the model of a changed config (e.g. `dtype='bfloat16'`,
  `attention_impl='xla'`, `scan_layers=True`); `model` itself when nothing changes."""
  config = model.config
  if all(getattr(config, name) == value for name, value in changes.items()):
    return model
  new = as_config(dataclasses.replace(config, **changes))
  params = params_of(model)
  if new.scan_layers != config.scan_layers:
    params = (stacks.stack_layer_params if new.scan_layers else stacks.unstack_layer_params)(params)
  return bind(new, params)


def unrolled(model: nnx.Module) -> nnx.Module:
  """A `scan_layers` model -> the same model unrolled (the same arrays, unstacked); decoding and
  attention plots need a KV cache and weights per layer."""
  return with_options(model, scan_layers=False)
