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

from autoregressive.decodable import decoding_model
from autoregressive.session import Session
from common.dtype_limits import INT32_MAX
from common.schema import is_int
from configs.schema import DecodeConfig, MeshConfig
from input_pipeline import tokenizers
from model import ConfigError, abstract_model, bind, build, partitioning
from model.config import ModelConfig
from workdir import checkpoint, checkpoint_files, config_io
from workdir.cli import AVERAGE_LAST_MAX


class RestoreError(ValueError):
  """The workdir cannot be restored; the message says why, in one line."""


def check_params(params, model_config: ModelConfig, workdir: str) -> None:
  """The restored tree must be the model of config.json (a clear error, not a JAX one)."""
  problems = checkpoint_files.shape_mismatches(build.param_shapes(model_config), params)
  if problems:
    more = f' (+{len(problems) - 3} more)' if len(problems) > 3 else ''
    raise RestoreError(f'the checkpoint in {workdir} does not fit the model in its config.json '
                       f'(kind={model_config.kind}): {"; ".join(problems[:3])}{more}')


def mesh_from_flag(text: str, flag: str = '--mesh') -> jax.sharding.Mesh:
  """'DATA,FSDP,TENSOR' (sizes; one may be -1: the remaining devices) -> a mesh of all devices.
  A malformed value, or one that does not fit the devices, is a one-line `RestoreError`."""
  parts = [p.strip() for p in str(text).split(',')]
  try:
    sizes = [int(p) for p in parts]
  except ValueError:
    sizes = []
  if len(sizes) != len(partitioning.MESH_AXES) or any(s < 1 and s != -1 for s in sizes):
    raise RestoreError(f'{flag}={text} must be three sizes DATA,FSDP,TENSOR (positive integers; '
                       'one may be -1 = the remaining devices), e.g. 1,2,4')
  try:  # the sizes are checked against the devices as config.mesh's are
    return partitioning.device_mesh(sizes)
  except ConfigError:
    n = jax.device_count()
    raise RestoreError(f'{flag}={text} does not fit the {n} device(s) here: DATA x FSDP x '
                       f'TENSOR must be {n} (one size may be -1: the remaining devices)') from None


def check_mesh(model_config, mesh: jax.sharding.Mesh, workdir: str) -> None:
  """Heads and feed-forward units must split evenly over the mesh's 'tensor' axis."""
  tensor = mesh.shape['tensor']
  misfit = partitioning.tensor_misfit(model_config, tensor)
  if misfit:
    raise RestoreError(f'the model in {config_io.config_path(workdir)} has {misfit[0]}='
                       f'{misfit[1]}, not divisible by the mesh\'s tensor size {tensor}')


def _shardings(model_config: ModelConfig, config, mesh):
  """The parameter shardings (a tree like `params_of`'s) of `model_config`'s model on `mesh`
  by config.json's `mesh.rules` (the training defaults when config.json has none), as training
  lays them out (no optimizer involved)."""
  try:
    rules = MeshConfig.from_config(config.get('mesh', None)).rule_table()
  except ConfigError as e:
    raise RestoreError(str(e)) from None
  return partitioning.shardings(build.logical_axes(model_config),
                                build.param_shapes(model_config), mesh, rules)


def _path_names(path) -> tuple[str, ...]:
  """A key path as strings: a checkpoint's `layers/'0'` and the model's `layers/0` match."""
  return tuple(str(getattr(k, 'key', k)) for k in path)


def _placement(model_config: ModelConfig, config, mesh):
  """`restore_params`'s `sharding`: (key path, shape) -> the leaf's sharding on `mesh`; None
  without a mesh. A leaf the model lacks, or whose sharding does not divide its shape (a
  checkpoint of another model: `check_params` reports it), goes to the first device."""
  if mesh is None:
    return None
  by_path = {_path_names(path): sharding for path, sharding in
             jax.tree_util.tree_flatten_with_path(_shardings(model_config, config, mesh))[0]}
  fallback = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def place(path, shape):
    sharding = by_path.get(_path_names(path))
    if sharding is not None:
      try:
        sharding.shard_shape(shape)  # raises when the mesh does not divide the shape
        return sharding
      except ValueError:
        pass
    return fallback
  return place


def read_model(workdir: str):
  """(config, module) of a workdir's config.json, the module abstract (`abstract_model`: its
  parameters are shapes; nothing is computed): cheap, so that a command line can check its
  flags against the model kind before restoring anything."""
  if not workdir:
    raise RestoreError('--workdir is required (a directory written by train.py)')
  if not os.path.isdir(workdir):
    raise RestoreError(f'--workdir {workdir} ' + ('is not a directory' if os.path.lexists(workdir)
                                          else 'does not exist'))
  try:
    config = config_io.load_config(workdir)
    # The decode section is read field by field later: a typo ("beam_szie") would be ignored.
    DecodeConfig.from_config(config.decode)
    return config, abstract_model(config.model)
  except ConfigError as e:
    raise RestoreError(f'{config_io.config_path(workdir)}: {e}') from None


def check_arguments(workdir, step, average_last, mesh) -> str:
  """`load`'s (and `Restored`'s) arguments, each checked before anything is read -> the
  workdir as a str (a path object is taken); a bad one is a one-line `RestoreError` (a
  ValueError), as decode.py's flags are refused."""
  if isinstance(workdir, os.PathLike):
    workdir = os.fspath(workdir)
  if not isinstance(workdir, str):
    raise RestoreError(f'workdir must be a path (a str or os.PathLike), got '
                       f'{type(workdir).__name__}')
  if step is not None and not (is_int(step) and 0 <= step <= INT32_MAX):
    raise RestoreError(f'step={step!r} must be None (the newest checkpoint) or an integer in '
                       f'[0, {INT32_MAX}]')
  if not (is_int(average_last) and 1 <= average_last <= AVERAGE_LAST_MAX):
    raise RestoreError(f'average_last={average_last!r} must be an integer in '
                       f'[1, {AVERAGE_LAST_MAX}]')
  if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
    raise RestoreError(f'mesh={mesh!r} must be None (one device) or a jax.sharding.Mesh, e.g. '
                       f'workdir.restore.mesh_from_flag({mesh!r})' if isinstance(mesh, str) else
                       f'mesh must be None (one device) or a jax.sharding.Mesh, got '
                       f'{type(mesh).__name__}')
  return workdir


def load(workdir: str, *, step: int | None = None, average_last: int = 1,
         mesh: jax.sharding.Mesh | None = None, warn=None) -> Session:
  """`workdir`'s model ready to decode (`inference.load`): its parameters (the newest
  checkpoint, or `step`; the average of the last `average_last`) on one device, or sharded
  over `mesh` -> a `Session`. `warn(message)` hears about truncated inputs and capped
  lengths (default: `warnings.warn`)."""
  if warn is not None and not callable(warn):
    raise RestoreError(f'warn must be None or a function of one message, got '
                       f'{type(warn).__name__}')
  restored = Restored(workdir, step, average_last, mesh)
  return Session(restored.module, restored.tokenizer, restored.config, step=restored.step,
                 warn=warn)


class Restored:
  """`config`, `module` (the NNX model holding the restored parameters, unrolled: one KV
  cache per layer when decoding), `params` (its pure dict, `model.params_of`), `kind` (name),
  `tokenizer`, `step`, `seconds` (restore time) and `mesh` (None: one device) of a workdir."""

  def __init__(self, workdir: str, step: int | None = None, average_last: int = 1,
               mesh: jax.sharding.Mesh | None = None):
    workdir = check_arguments(workdir, step, average_last, mesh)
    self.config, abstract = read_model(workdir)
    model_config = abstract.config
    self.kind, self.mesh = model_config.kind, mesh
    if mesh is not None:
      check_mesh(model_config, mesh, workdir)
    try:
      self.tokenizer = tokenizers.load_tokenizer(workdir)
      tokenizers.check_vocabulary(  # another workdir's tokenizer would decode garbage, exit 0
          self.tokenizer, self.config.data, model_config.vocab_size, workdir,
          tokenizers.NOT_THE_MODELS)
    except Exception as e:  # noqa: BLE001  # DataError/DataFileError: one line already
      error = RestoreError(str(e))
      error.exit_code = getattr(e, 'exit_code', 2)  # 1: a tokenizer file fails its checksum
      raise error from None
    if not checkpoint.list_steps(workdir):
      raise RestoreError(f'no checkpoint in {checkpoint.checkpoint_dir(workdir)}: train first '
                         f'(python train.py --workdir={workdir})')
    started = time.time()
    self.module, self.params = self._restore(workdir, model_config, step, average_last)
    self.seconds = time.time() - started

  def _restore(self, workdir: str, model_config: ModelConfig, step, average_last: int):
    """(module, params) of the checkpoint, read straight into the shards of its stored
    (scanned or not) layout, then unrolled once; sets `step`."""
    try:
      params, self.step = checkpoint.restore_params(
          workdir, step=step, average_last=average_last,
          sharding=_placement(model_config, self.config, self.mesh), config=self.config)
    except checkpoint.CheckpointError as e:
      raise RestoreError(str(e)) from None
    check_params(params, model_config, workdir)
    unrolled_config, params = decoding_model(bind(model_config, params))
    if self.mesh is not None and unrolled_config != model_config:
      # Each layer's slice as the unrolled model lays it out (not the stacked array's layout).
      params = jax.device_put(params, _shardings(unrolled_config, self.config, self.mesh))
    return bind(unrolled_config, params), params
