"""The train state: one pytree holding everything a checkpoint must restore."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from model import partitioning
from model.kinds import adapter_of
from model.partitioning import Rules
from training import mesh as mesh_lib


@flax.struct.dataclass
class TrainState:
  """`step` int32 scalar (updates done), `params`, `opt_state`, `rng` uint32[2] (base dropout key;
  step s uses `fold_in(rng, s)`)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def init_params(module, seed_key: jax.Array) -> Any:
  """Float32 parameters from `init` on a dummy batch."""
  args = adapter_of(module).example_inputs()
  return module.init({'params': seed_key}, *args, deterministic=True)['params']


def make_init_fn(module, tx: optax.GradientTransformation, seed: int):
  """() -> TrainState, deterministic in `seed` (params key and dropout key split from it)."""
  def init():
    params_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(module, params_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_key)
  return init


def state_shardings(module, tx: optax.GradientTransformation, mesh: Mesh,
                    rules: Rules | None = None) -> TrainState:
  """Where every leaf of the train state lives: parameters by their logical axes and `rules`
  (default: `config.mesh` defaults), each optimizer moment like its parameter, the step, the
  dropout key and the optimizer's counters replicated."""
  return _layout(module, tx, mesh, rules)[1]


def _layout(module, tx, mesh, rules) -> tuple[TrainState, TrainState]:
  """(ShapeDtypeStructs, shardings) of the train state (shapes do not depend on the seed)."""
  rules = mesh_lib.rules() if rules is None else rules
  shapes = jax.eval_shape(make_init_fn(module, tx, 0))
  logical = partitioning.logical_axes(module, adapter_of(module).example_inputs())
  params = partitioning.shardings(logical, shapes.params, mesh, rules)
  replicated = mesh_lib.replicated(mesh)
  opt_state = optax.tree_utils.tree_map_params(
      tx, lambda _, sharding: sharding, shapes.opt_state, params,
      transform_non_params=lambda _: replicated)
  return shapes, TrainState(step=replicated, params=params, opt_state=opt_state, rng=replicated)


def param_shardings(module, mesh: Mesh, rules: Rules | None = None) -> Any:
  """Where each parameter of `module` lives on `mesh` (as in training; for inference)."""
  return state_shardings(module, optax.identity(), mesh, rules).params


def create_train_state(module, tx: optax.GradientTransformation, seed: int, mesh: Mesh,
                       rules: Rules | None = None) -> TrainState:
  """A fresh state laid out by `state_shardings` (every process computes the same values;
  each device materialises only its shards)."""
  shardings = state_shardings(module, tx, mesh, rules)
  return jax.jit(make_init_fn(module, tx, seed), out_shardings=shardings)()


def abstract_train_state(module, tx: optax.GradientTransformation, seed: int, mesh: Mesh,
                         rules: Rules | None = None) -> TrainState:
  """ShapeDtypeStructs with the `state_shardings`: the restore target for checkpoints (a
  checkpoint written on any mesh restores onto this one)."""
  del seed  # the shapes do not depend on it
  shapes, shardings = _layout(module, tx, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      shapes, shardings)


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
