"""A workdir restored for inference: config, model, tokenizer and parameters only (no optimizer
state, no training code path, no dataset): what `decode.py`, `export.py` and
`inference.load` (below) start from.

Every problem (missing workdir, unreadable config.json or tokenizer, a tokenizer that is not
the model's (`tokenizers.check_vocabulary`), no checkpoint, a checkpoint that does not fit the
model of config.json, a mesh that does not fit the devices or the model) raises `RestoreError`
with one line.

Placement: without a mesh the parameters go to the first local device (a checkpoint written on
any mesh restores there). With a mesh `(data, fsdp, tensor)` each parameter is read straight
into its shards, laid out by the rules of config.json's `mesh.rules` (the training defaults
when config.json has no mesh section), as training lays it out; decoding then runs
tensor-parallel (XLA inserts the collectives).
"""

from __future__ import annotations

import os
import time

import jax

from autoregressive.decode_loop import decoding_model
from autoregressive.session import Session
from input_pipeline import tokenizers
from model import ConfigError, build_model, partitioning
from model.kinds import adapter_of
from training import checkpoint, config_io, mesh as mesh_lib


class RestoreError(ValueError):
  """The workdir cannot be restored; the message says why, in one line."""


def check_params(params, module, workdir: str) -> None:
  """The restored tree must be the model of config.json (a clear error, not a JAX one)."""
  problems = checkpoint.shape_mismatches(adapter_of(module).param_shapes(module), params)
  if problems:
    more = f' (+{len(problems) - 3} more)' if len(problems) > 3 else ''
    raise RestoreError(f'the checkpoint in {workdir} does not fit the model in its config.json '
                       f'(kind={module.config.kind}): {"; ".join(problems[:3])}{more}')


def mesh_from_flag(text: str, flag: str = '--mesh') -> jax.sharding.Mesh:
  """'DATA,FSDP,TENSOR' (sizes; one may be -1: the remaining devices) -> a mesh of all devices.
  A malformed value, or one that does not fit the devices, is a one-line `RestoreError`."""
  parts = [p.strip() for p in str(text).split(',')]
  try:
    sizes = [int(p) for p in parts]
  except ValueError:
    sizes = []
  if len(sizes) != len(mesh_lib.AXES) or any(s < 1 and s != -1 for s in sizes):
    raise RestoreError(f'{flag}={text} must be three sizes DATA,FSDP,TENSOR (positive integers; '
                       'one may be -1 = the remaining devices), e.g. 1,2,4')
  try:  # the sizes are checked against the devices as config.mesh's are
    return mesh_lib.make_mesh(mesh_config=dict(zip(mesh_lib.AXES, sizes, strict=True)))
  except ConfigError:
    n = jax.device_count()
    raise RestoreError(f'{flag}={text} does not fit the {n} device(s) here: DATA x FSDP x '
                       f'TENSOR must be {n} (one size may be -1: the remaining devices)') from None


def check_mesh(model_config, mesh: jax.sharding.Mesh, workdir: str) -> None:
  """Heads and feed-forward units must split evenly over the mesh's 'tensor' axis."""
  tensor = mesh.shape['tensor']
  misfit = mesh_lib.tensor_misfit(model_config, tensor)
  if misfit:
    raise RestoreError(f'the model in {config_io.config_path(workdir)} has {misfit[0]}='
                       f'{misfit[1]}, not divisible by the mesh\'s tensor size {tensor}')


def _shardings(module, config, mesh):
  """`module`'s parameter shardings on `mesh` by config.json's `mesh.rules` (the training
  defaults when config.json has none), as training lays them out (no optimizer involved)."""
  try:
    rules = mesh_lib.rules(config.get('mesh', None))
  except ConfigError as e:
    raise RestoreError(str(e)) from None
  adapter = adapter_of(module)
  logical = partitioning.logical_axes(module, adapter.example_inputs())
  return partitioning.shardings(logical, adapter.param_shapes(module), mesh, rules)


def _placement(module, config, mesh):
  """`restore_params`'s `sharding`: (key path, shape) -> the leaf's sharding on `mesh`; None
  without a mesh. A leaf the model lacks, or whose sharding does not divide its shape (a
  checkpoint of another model: `check_params` reports it), goes to the first device."""
  if mesh is None:
    return None
  by_path = dict(jax.tree_util.tree_flatten_with_path(_shardings(module, config, mesh))[0])
  fallback = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def place(path, shape):
    sharding = by_path.get(tuple(path))
    if sharding is not None:
      try:
        sharding.shard_shape(shape)  # raises when the mesh does not divide the shape
        return sharding
      except ValueError:
        pass
    return fallback
  return place


def read_model(workdir: str):
  """(config, module) of a workdir's config.json, no parameters: cheap, so that a command line
  can check its flags against the model kind before restoring anything."""
  if not workdir:
    raise RestoreError('--workdir is required (a directory written by train.py)')
  if not os.path.isdir(workdir):
    raise RestoreError(f'--workdir {workdir} does not exist')
  try:
    config = config_io.load_config(workdir)
    return config, build_model(config.model)
  except ConfigError as e:
    raise RestoreError(str(e)) from None


def load(workdir: str, *, step: int | None = None, average_last: int = 1,
         mesh: jax.sharding.Mesh | None = None, warn=None) -> Session:
  """`workdir`'s model ready to decode (`inference.load`): its parameters (the newest
  checkpoint, or `step`; the average of the last `average_last`) on one device, or sharded
  over `mesh` -> a `Session`. `warn(message)` hears about truncated inputs and capped
  lengths (default: `warnings.warn`)."""
  restored = Restored(workdir, step, average_last, mesh)
  return Session(restored.module, restored.params, restored.tokenizer, restored.config,
                 step=restored.step, warn=warn)


class Restored:
  """`config`, `module`, `kind` (name), `tokenizer`, `params` (unrolled: one KV cache per
  layer when decoding), `step`, `seconds` (restore time) and `mesh` (None: one device) of a
  workdir."""

  def __init__(self, workdir: str, step: int | None = None, average_last: int = 1,
               mesh: jax.sharding.Mesh | None = None):
    self.config, self.module = read_model(workdir)
    self.kind = self.module.config.kind
    self.mesh = mesh
    if mesh is not None:
      check_mesh(self.module.config, mesh, workdir)
    try:
      self.tokenizer = tokenizers.load_tokenizer(workdir)
      tokenizers.check_vocabulary(  # another workdir's tokenizer would decode garbage, exit 0
          self.tokenizer, self.config.data, self.module.config.vocab_size, workdir,
          tokenizers.NOT_THE_MODELS)
    except Exception as e:  # noqa: BLE001  # DataError/DataFileError: one line already
      error = RestoreError(str(e))
      error.exit_code = getattr(e, 'exit_code', 2)  # 1: a tokenizer file fails its checksum
      raise error from None
    if not checkpoint.list_steps(workdir):
      raise RestoreError(f'no checkpoint in {checkpoint.checkpoint_dir(workdir)}: train first '
                         f'(python train.py --workdir={workdir})')
    started = time.time()
    try:  # read straight into the shards of the stored (scanned or not) layout
      self.params, self.step = checkpoint.restore_params(
          workdir, step=step, average_last=average_last,
          sharding=_placement(self.module, self.config, mesh))
    except checkpoint.CheckpointError as e:
      raise RestoreError(str(e)) from None
    check_params(self.params, self.module, workdir)
    stored = self.module
    self.module, self.params = decoding_model(self.module, self.params)
    if mesh is not None and self.module is not stored:
      # Each layer's slice as the unrolled model lays it out (not the stacked array's layout).
      self.params = jax.device_put(self.params, _shardings(self.module, self.config, mesh))
    self.seconds = time.time() - started
