"""The train state: one pytree holding everything a checkpoint must restore."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from model.kinds import kind_of
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
  args = kind_of(module).example_inputs()
  return module.init({'params': seed_key}, *args, deterministic=True)['params']


def make_init_fn(module, tx: optax.GradientTransformation, seed: int):
  """() -> TrainState, deterministic in `seed` (params key and dropout key split from it)."""
  def init():
    params_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(module, params_key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_key)
  return init


def create_train_state(module, tx: optax.GradientTransformation, seed: int,
                       mesh: Mesh) -> TrainState:
  """A fresh state, replicated over the mesh (every process computes the same values)."""
  return jax.jit(make_init_fn(module, tx, seed), out_shardings=mesh_lib.replicated(mesh))()


def abstract_train_state(module, tx: optax.GradientTransformation, seed: int,
                         mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs with replicated shardings: the restore target for checkpoints."""
  shapes = jax.eval_shape(make_init_fn(module, tx, seed))
  sharding = mesh_lib.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), shapes)


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
