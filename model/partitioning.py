"""Logical axis names: how every parameter and layer-boundary activation may be split.

A parameter names its dimensions in its `nnx.Param` metadata (`axes`), e.g. the fused QKV
kernel `[d_model, 3, heads, head_dim]` is `('embed', None, 'heads', 'kv')`. A rules table
`((logical name, mesh axes), ...)` maps names to mesh axes (`configs.schema.MeshConfig.rule_table`
reads it from `config.mesh.rules`), as in MaxText and the Flax lm1b example:

  vocab   the vocabulary dimension of the embedding / output projection
  embed   d_model, the residual stream's width (of parameters: FSDP shards it)
  heads   attention heads (tensor parallelism: Q/K/V column-split, W^O row-split)
  kv      the size of one head (d_k = d_v)
  mlp     the feed-forward's hidden units d_ff (W_1 column-split, W_2 row-split)
  layers  the stacked layer dimension of `scan_layers` parameters
  batch   the batch dimension of activations

`model.build.logical_axes(config)` reads them (no arrays) into a `PartitionSpec` per parameter.
Activations get constraints (`constrain`) only inside `activation_sharding(mesh, rules)`,
which the jitted train and eval steps enter while tracing; anywhere else it is a no-op.

The mesh itself, `device_mesh(sizes)`, is `(data, fsdp, tensor)` over the devices
(`MESH_AXES`): training builds it from `config.mesh`, decode.py from `--mesh`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from common.errors import ConfigError

MESH_AXES = ('data', 'fsdp', 'tensor')  # the mesh's axes, in order (config.mesh's sizes)
LOGICAL_AXES = ('vocab', 'embed', 'heads', 'kv', 'mlp', 'layers', 'batch')
Rules = Sequence[tuple[str, Any]]  # (logical name, mesh axis | tuple of mesh axes | None)
# The default rules over the mesh axes ('data', 'fsdp', 'tensor'): logical name -> mesh axes
# ('' = not split; 'a,b' = over both). configs/base.py copies it into config.mesh.rules and
# training/mesh.py fills unset names from it.
DEFAULT_RULES = {'batch': 'data,fsdp', 'vocab': 'tensor', 'embed': 'fsdp', 'heads': 'tensor',
                 'kv': '', 'mlp': 'tensor', 'layers': ''}

_activation_rules: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    'activation_rules', default=None)


def mesh_shape(sizes: Sequence[int], num_devices: int | None = None) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes, one of them maybe -1 (the devices left) -> the sizes for
  `num_devices` (None: all). Raises ConfigError naming `config.mesh`."""
  n = num_devices or jax.device_count()
  sizes = list(sizes)
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if n % known:
      raise ConfigError(f'config.mesh (data, fsdp, tensor)={tuple(sizes)}: {n} devices are not '
                        f'divisible by {known}')
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) != n:
    raise ConfigError(f'config.mesh (data, fsdp, tensor)={tuple(sizes)} has {math.prod(sizes)} '
                      f'devices; this run has {n}')
  return tuple(sizes)


def device_mesh(sizes: Sequence[int], num_devices: int | None = None) -> Mesh:
  """The `(data, fsdp, tensor)` mesh of `sizes` (`mesh_shape`'s) over all devices (or the first
  `num_devices`).

  `jax.make_mesh` orders devices for the interconnect ('tensor', the last axis, on the
  closest devices). Auto axis types: Explicit ones (its default) break gathers in nn.Embed.
  """
  shape = mesh_shape(sizes, num_devices)
  devices = jax.devices()[:math.prod(shape)] if num_devices else None
  return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                       devices=devices)


def tensor_misfit(model_config, tensor: int) -> tuple[str, int] | None:
  """(field, value) of the first model size the 'tensor' axis does not divide, else None:
  heads and feed-forward units are what tensor parallelism splits."""
  for field in ('num_heads', 'd_ff'):
    value = getattr(model_config, field)
    if value % tensor:
      return field, value
  return None


def _mesh_axes(table: dict, name: str | None) -> tuple[str, ...]:
  """The mesh axes the rules give logical axis `name` ('' / None: none; a name or a tuple)."""
  axes = table.get(name) if name is not None else None
  return (axes,) if isinstance(axes, str) else tuple(axes or ())


def mesh_spec(names: Sequence[str | None], rules: Rules, shape: Sequence[int],
              mesh: Mesh) -> P:
  """Logical names -> a mesh `PartitionSpec` for an array of `shape`. A mesh axis is used
  once per array (the first dimension that asks for it), and a dimension its mesh axes do
  not divide stays whole (e.g. a 65-symbol vocabulary over 4 devices)."""
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for name, size in zip(names, shape, strict=False):  # no names (P()): every dimension whole
    axes = tuple(a for a in _mesh_axes(table, name) if a not in used and mesh.shape[a] > 1)
    count = 1
    for a in axes:
      count *= mesh.shape[a]
    if not axes or size % count:
      spec.append(None)
      continue
    used.update(axes)
    spec.append(axes[0] if len(axes) == 1 else axes)
  return P(*spec)


def shardings(logical: Any, shapes: Any, mesh: Mesh, rules: Rules) -> Any:
  """`NamedSharding` per leaf of `shapes` (arrays or ShapeDtypeStructs) from its logical spec."""
  return jax.tree.map(lambda spec, x: NamedSharding(mesh, mesh_spec(tuple(spec), rules,
                                                                     x.shape, mesh)),
                      logical, shapes, is_leaf=lambda s: isinstance(s, P))


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules):
  """Within: `constrain` pins activations to `mesh` by `rules` (enter it while tracing)."""
  token = _activation_rules.set((mesh, tuple(rules)))
  try:
    yield
  finally:
    _activation_rules.reset(token)


def splits(name: str) -> bool:
  """Whether the active `activation_sharding` splits the logical axis `name` over devices."""
  active = _activation_rules.get()
  if active is None:
    return False
  mesh, rules = active
  return any(mesh.shape[a] > 1 for a in _mesh_axes(dict(rules), name))


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """`x` with a sharding constraint from its logical dimension `names` (no-op outside
  `activation_sharding`): at layer boundaries, so XLA keeps the batch split over the data
  axes and the heads / hidden units over 'tensor' instead of choosing a layout itself."""
  active = _activation_rules.get()
  if active is None:
    return x
  mesh, rules = active
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, mesh_spec(names, rules, x.shape, mesh)))
