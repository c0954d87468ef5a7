"""The device mesh `(data, fsdp, tensor)` from `config.mesh`, its rules table, and batch shardings.

One program for every scale: `jax.jit` over a mesh of all devices (of all processes).
  data    batch split, parameters replicated (what the default mesh does with every device)
  fsdp    batch split too, and parameters, gradients and optimizer state split along their
          'embed' axis (gathered by XLA where a layer uses them)
  tensor  attention heads, feed-forward units and the vocabulary split (Megatron style)
`config.mesh.rules` maps the model's logical axis names (model.partitioning) to these axes.
Each process feeds its own slice of the global batch (`shard_batch`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from configs.schema import MeshConfig
from model import partitioning
from model.config import ConfigError
from model.partitioning import Rules

BATCH_AXES = ('data', 'fsdp')  # the batch is split over both


def make_mesh(num_devices: int | None = None, mesh_config=None) -> Mesh:
  """The mesh of `config.mesh` (None: every device on 'data') over all devices (or the first
  `num_devices`): `model.partitioning.device_mesh`."""
  return partitioning.device_mesh(_schema(mesh_config).sizes, num_devices)


def rules(mesh_config=None) -> Rules:
  """`config.mesh.rules` -> ((logical name, mesh axes), ...); unset names take DEFAULT_RULES."""
  return _schema(mesh_config).rule_table()


def _schema(mesh_config) -> MeshConfig:
  """`config.mesh` (a ConfigDict, dict, None or a `MeshConfig`) checked by its schema."""
  if isinstance(mesh_config, MeshConfig):
    return mesh_config
  return MeshConfig.from_config(mesh_config)


def check(mesh_config, model_config, batch_size: int, grad_accum_steps: int,
          num_devices: int) -> None:
  """The mesh fits the devices, the model and the batch (one line naming the field)."""
  data, fsdp, tensor = partitioning.mesh_shape(_schema(mesh_config).sizes, num_devices)
  rules(mesh_config)
  misfit = partitioning.tensor_misfit(model_config, tensor)
  if misfit:
    raise ConfigError(f'config.model.{misfit[0]}={misfit[1]} is not divisible by '
                      f'config.mesh.tensor={tensor}')
  if jax.process_count() > 1 and jax.local_device_count() % tensor:
    # Each process feeds its own rows; a 'tensor' group spanning processes would need the same.
    raise ConfigError(f'config.mesh.tensor={tensor} must divide the devices of one process '
                      f'({jax.local_device_count()}): tensor groups stay within a host')
  if batch_size % (data * fsdp * grad_accum_steps):
    raise ConfigError(f'config.train.batch_size={batch_size} must be divisible by config.mesh '
                      f'data x fsdp ({data} x {fsdp}) x config.train.grad_accum_steps '
                      f'({grad_accum_steps})')


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over 'data' x 'fsdp', replicated over 'tensor'."""
  return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Per-process numpy batch -> global arrays split over the batch axes (batch = sum over
  processes)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


def local_batch_shards(mesh: Mesh) -> int:
  """How many distinct slices of the batch this process's devices hold (a per-process batch
  must be a multiple of it)."""
  batch_devices = mesh.shape['data'] * mesh.shape['fsdp']
  return max(1, batch_devices * jax.local_device_count() // mesh.devices.size)


def describe(mesh: Mesh) -> str:
  platforms = sorted({d.platform for d in mesh.devices.flat})
  shape = ', '.join(f'{name}={size}' for name, size in mesh.shape.items())
  what = 'parameters replicated'
  if mesh.shape['fsdp'] > 1 or mesh.shape['tensor'] > 1:
    what = 'parameters and optimizer state sharded over ' + ' x '.join(
        a for a in ('fsdp', 'tensor') if mesh.shape[a] > 1)
  return (f'mesh ({shape}) over {mesh.devices.size} {"/".join(platforms)} device(s) in '
          f'{jax.process_count()} process(es); batch sharded over data x fsdp, {what}')


def to_host(tree: Any) -> Any:
  """Global arrays (any sharding) -> full numpy copies on every process. With several
  processes this is a collective: every process must call it."""
  if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)
