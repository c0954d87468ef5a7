"""The train state: one pytree holding everything a checkpoint must restore."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from model import build, partitioning
from model.config import ModelConfig
from model.partitioning import Rules
from training import mesh as mesh_lib


@flax.struct.dataclass
class TrainState:
  """`step` int32 scalar (updates done), `params` (the pure dict of the model's parameters,
  `model.params_of`), `opt_state`, `rng` uint32[2] (base dropout key; step s uses
  `fold_in(rng, s)`)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def init_params(config: ModelConfig, seed_key: jax.Array) -> Any:
  """Float32 parameters (a pure dict) initialised from `seed_key`."""
  return build.params_of(build.build_model(config, rngs=nnx.Rngs(params=seed_key)))


def seed_key(seed: int) -> np.ndarray:
  """The run's base key, uint32[2] (`jax.random.PRNGKey(seed)`, as NumPy: the same on every
  process of a multi-host run)."""
  return np.asarray(jax.random.PRNGKey(seed))


def make_init_fn(config: ModelConfig, tx: optax.GradientTransformation):
  """(key `seed_key(seed)`) -> TrainState, deterministic in the key (params key and dropout key
  split from it). The key is an argument, not a constant of the program: one compiled
  initialisation starts every seed (a sweep's later seeds read it from the compilation cache
  instead of compiling it again: seconds a start on CPU, more on accelerators)."""
  def init(key):
    params_key, dropout_key = jax.random.split(key)
    params = init_params(config, params_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_key)
  return init


def state_shardings(config: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh,
                    rules: Rules | None = None) -> TrainState:
  """Where every leaf of the train state lives: parameters by their logical axes and `rules`
  (default: `config.mesh` defaults), each optimizer moment like its parameter, the step, the
  dropout key and the optimizer's counters replicated."""
  return _layout(config, tx, mesh, rules)[1]


def _layout(config, tx, mesh, rules) -> tuple[TrainState, TrainState]:
  """(ShapeDtypeStructs, shardings) of the train state (shapes do not depend on the seed)."""
  rules = mesh_lib.rules() if rules is None else rules
  param_shapes = build.param_shapes(config)  # the model is built abstractly once per config
  shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=param_shapes,
                      opt_state=jax.eval_shape(tx.init, param_shapes),
                      rng=jax.eval_shape(jax.random.PRNGKey, 0))
  params = partitioning.shardings(build.logical_axes(config), param_shapes, mesh, rules)
  replicated = mesh_lib.replicated(mesh)
  # A partitioned optimizer (Muon's matrices beside Adam's rest) holds each part's state as a
  # parameter tree with `MaskedNode`s where the other part's parameters are: kept as they are.
  opt_state = optax.tree_utils.tree_map_params(
      tx, lambda leaf, sharding: leaf if isinstance(leaf, optax.MaskedNode) else sharding,
      shapes.opt_state, params, transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  return shapes, TrainState(step=replicated, params=params, opt_state=opt_state, rng=replicated)


def param_shardings(config: ModelConfig, mesh: Mesh, rules: Rules | None = None) -> Any:
  """Where each parameter of `config`'s model lives on `mesh` (as in training; for inference)."""
  return state_shardings(config, optax.identity(), mesh, rules).params


def create_train_state(config: ModelConfig, tx: optax.GradientTransformation, seed: int, mesh: Mesh,
                       rules: Rules | None = None, params: Any = None) -> TrainState:
  """A fresh state laid out by `state_shardings` (every process computes the same values;
  each device materialises only its shards). `params` (a pure dict, e.g. another workdir's:
  config.train.init_from) start it instead of an initialisation; the dropout key is the
  seed's either way."""
  shardings = state_shardings(config, tx, mesh, rules)
  init, key = make_init_fn(config, tx), seed_key(seed)
  if params is None:
    return jax.jit(init, out_shardings=shardings)(key)

  def start(key, params):
    return init(key).replace(params=params, opt_state=tx.init(params))
  return jax.jit(start, out_shardings=shardings)(key, params)


def abstract_train_state(config: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh,
                         rules: Rules | None = None) -> TrainState:
  """ShapeDtypeStructs with the `state_shardings`: the restore target for checkpoints (a
  checkpoint written on any mesh restores onto this one)."""
  shapes, shardings = _layout(config, tx, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      shapes, shardings)
