"""The device mesh and shardings: batch sharded over 'data', parameters replicated.

One program for every scale: `jax.jit` over a mesh of all devices (of all processes). Each
process feeds its own slice of the global batch (`shard_batch`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = 'data'


def make_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh `('data',)` over all devices (or the first `num_devices`), Auto axis types."""
  n = num_devices or jax.device_count()
  # Explicit axis types (the make_mesh default) break gathers inside nn.Embed.
  return jax.make_mesh((n,), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over 'data'."""
  return NamedSharding(mesh, P(DATA_AXIS))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Per-process numpy batch -> global arrays sharded over 'data' (batch = sum over processes)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}


def local_device_count(mesh: Mesh) -> int:
  return sum(d.process_index == jax.process_index() for d in mesh.devices.flat)


def describe(mesh: Mesh) -> str:
  kinds = sorted({d.platform for d in mesh.devices.flat})
  shape = ', '.join(f'{name}={size}' for name, size in mesh.shape.items())
  return (f'mesh ({shape}) over {mesh.devices.size} {"/".join(kinds)} device(s) in '
          f'{jax.process_count()} process(es); batch sharded over {DATA_AXIS!r}, '
          'parameters replicated')


def to_local(tree: Any) -> Any:
  """Replicated global arrays -> numpy copies (process-local; no collective)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)
