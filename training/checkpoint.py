"""The one module over Orbax: checkpoints under `DIR/checkpoints/<step>/{state,data}`.

  Checkpointer(workdir, max_to_keep=3)   for the trainer: save(step, state, data_state) (async),
                                         restore(abstract_state) with fallback, wait(), close()
  restore_params(workdir, step=None, average_last=1) -> (params, step)   for decode.py
  list_steps(workdir) -> [int]

`state` is the whole TrainState pytree (params, opt_state, step, rng); `data` is the JSON
iterator state of every process. Orbax writes each step to a temporary directory and renames
it when complete, so a process killed mid-write leaves the previous checkpoints intact; a
finished-but-damaged latest checkpoint is skipped with a warning in favour of the previous one.
Arrays restore onto whatever devices/shardings the target asks for (1 <-> 8 devices).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

CHECKPOINT_SUBDIR = 'checkpoints'


class CheckpointError(RuntimeError):
  """No usable checkpoint, or one incompatible with the model; the message is one line."""


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_SUBDIR)


def _warn(message: str) -> None:
  if jax.process_index() == 0:
    print(f'WARNING: {message}', file=sys.stderr, flush=True)


def _one_line(error: BaseException) -> str:
  text = ' '.join(str(error).split())
  return f'{type(error).__name__}: {text[:300]}'


def _manager(workdir: str, *, max_to_keep: int | None = None, async_save: bool = False,
             read_only: bool = False) -> ocp.CheckpointManager:
  directory = checkpoint_dir(workdir)
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=not read_only)  # leftovers of a save killed mid-write
  handlers = {'state': ocp.PyTreeCheckpointHandler(), 'data': ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def list_steps(workdir: str) -> list[int]:
  """Steps of the finished checkpoints in `DIR/checkpoints`, ascending ([] if none)."""
  if not os.path.isdir(checkpoint_dir(workdir)):
    return []
  return sorted(_manager(workdir, read_only=True).all_steps())


def _state_metadata(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  metadata = manager.item_metadata(step)['state']
  tree = getattr(metadata, 'tree', metadata)
  if tree is None:
    raise ValueError(f'checkpoint {step} has no state metadata')
  return tree


def _shape_mismatches(expected: Any, stored: Any, prefix: str = '') -> list[str]:
  """Differences between a target tree of ShapeDtypeStructs and stored metadata (dict/list)."""
  if isinstance(expected, dict) or isinstance(stored, dict):
    if not (isinstance(expected, dict) and isinstance(stored, dict)):
      return [f'{prefix or "<root>"}: structure differs']
    out = []
    for key in sorted(set(expected) | set(stored), key=str):
      if key not in expected or key not in stored:
        out.append(f'{prefix}{key}: only in the {"checkpoint" if key in stored else "model"}')
      else:
        out += _shape_mismatches(expected[key], stored[key], f'{prefix}{key}/')
    return out
  shape = getattr(stored, 'shape', None)
  if shape is not None and tuple(shape) != tuple(expected.shape):
    return [f'{prefix.rstrip("/")}: checkpoint {tuple(shape)} vs model {tuple(expected.shape)}']
  return []


def _params_tree(state_tree: Any) -> Any:
  """The `params` subtree of a TrainState-like pytree as nested dicts (for shape comparison)."""
  params = state_tree['params'] if isinstance(state_tree, dict) else state_tree.params
  return jax.tree_util.tree_map(lambda x: x, params)


class Checkpointer:
  """Saves/restores the train state + data iterator state for the trainer.

  `save` is asynchronous (Orbax writes in a background thread after copying the arrays off
  the devices); `wait()` blocks until the last save is on disk. Every process must call
  `save`/`restore` (Orbax coordinates the processes; process 0 writes the metadata).
  """

  def __init__(self, workdir: str, *, max_to_keep: int = 3, async_save: bool = True):
    self.workdir = workdir
    self._manager = _manager(workdir, max_to_keep=max_to_keep, async_save=async_save)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, data_state: dict[str, Any] | None) -> None:
    """Starts saving `state` (a pytree of arrays) and this process's `data_state` (JSON) at `step`."""
    data = {'process_count': jax.process_count(), 'states': _gather_json(data_state)}
    if step in self._manager.all_steps():  # a damaged checkpoint skipped at restore
      self._manager.delete(step)
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data)), force=True)

  def restore(self, abstract_state: Any) -> tuple[Any, dict[str, Any] | None, int] | None:
    """-> (state, this process's data state or None, step) from the newest good checkpoint,
    or None when there is none. Raises `CheckpointError` for an incompatible checkpoint."""
    steps = self.all_steps()
    if not steps:
      return None
    skipped = []
    for step in reversed(steps):
      try:
        stored = _state_metadata(self._manager, step)
      except Exception as e:  # pylint: disable=broad-except
        _warn(f'checkpoint {step} is unreadable ({_one_line(e)}); trying the previous one')
        skipped.append(step)
        continue
      mismatches = _shape_mismatches(_params_tree(abstract_state), stored.get('params', {}),
                                     'params/')
      if mismatches:
        raise CheckpointError(
            f'checkpoint {step} in {checkpoint_dir(self.workdir)} does not fit the model: '
            f'{"; ".join(mismatches[:3])}' + (f' (+{len(mismatches) - 3} more)'
                                              if len(mismatches) > 3 else ''))
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=abstract_state,
                restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state)),
            data=ocp.args.JsonRestore()))
      except Exception as e:  # pylint: disable=broad-except
        _warn(f'checkpoint {step} is damaged ({_one_line(e)}); trying the previous one')
        skipped.append(step)
        continue
      for bad in skipped:
        _warn(f'removing damaged checkpoint {bad}')
        if jax.process_index() == 0:
          self._manager.delete(bad)
      return restored['state'], self._data_state(restored['data'], step), step
    raise CheckpointError(f'no readable checkpoint in {checkpoint_dir(self.workdir)} '
                          f'(tried steps {sorted(skipped)})')

  @staticmethod
  def _data_state(data: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    if not data or not data.get('states'):
      return None
    if data.get('process_count') != jax.process_count():
      _warn(f'checkpoint {step} was written by {data.get("process_count")} process(es), this run '
            f'has {jax.process_count()}: the data iterators start afresh')
      return None
    return data['states'][jax.process_index()]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _gather_json(value: Any) -> list[Any]:
  """Every process's JSON-serialisable `value`, in process order (a collective)."""
  if jax.process_count() == 1:
    return [value]
  import json  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
  length = int(np.max(multihost_utils.process_allgather(np.array([encoded.size]))))
  padded = np.zeros(length, np.uint8)
  padded[:encoded.size] = encoded
  gathered = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row).rstrip(b'\0').decode()) for row in gathered]


def _restore_params_at(manager: ocp.CheckpointManager, step: int, sharding) -> Any:
  stored = _state_metadata(manager, step)
  if 'params' not in stored:
    raise ValueError(f'checkpoint {step} has no params')
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding),
                        stored['params'])
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item={'params': target}, restore_args=ocp.checkpoint_utils.construct_restore_args(
          {'params': target}), partial_restore=True)))
  return restored['state']['params']


def restore_params(workdir: str, step: int | None = None, average_last: int = 1,
                   sharding: jax.sharding.Sharding | None = None) -> tuple[Any, int]:
  """Parameters only (no optimizer state, no model code needed) -> (params, step).

  `step=None` takes the newest readable checkpoint (falling back past a damaged one with a
  warning). `average_last=N` averages the params of the N newest checkpoints up to `step`.
  Arrays are placed with `sharding` (default: the first local device), whatever device count
  wrote them. Raises `CheckpointError` (one line) when there is nothing to restore.
  """
  if average_last < 1:
    raise CheckpointError(f'average_last={average_last} must be >= 1')
  steps = list_steps(workdir)
  where = checkpoint_dir(workdir)
  if not steps:
    raise CheckpointError(f'no checkpoint in {where}')
  if step is not None and step not in steps:
    raise CheckpointError(f'no checkpoint for step {step} in {where}; available: {steps}')
  sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  manager = _manager(workdir, read_only=True)
  candidates = [s for s in steps if step is None or s <= step]
  loaded: list[tuple[int, Any]] = []
  for s in reversed(candidates):
    try:
      loaded.append((s, _restore_params_at(manager, s, sharding)))
    except Exception as e:  # pylint: disable=broad-except
      if step is not None and s == step:
        raise CheckpointError(f'checkpoint {s} in {where} is unreadable: {_one_line(e)}') from None
      _warn(f'checkpoint {s} in {where} is unreadable ({_one_line(e)}); skipping it')
      continue
    if len(loaded) == average_last:
      break
  if len(loaded) < average_last:
    raise CheckpointError(f'average_last={average_last} needs {average_last} readable checkpoints '
                          f'in {where}; found {len(loaded)} (steps {[s for s, _ in loaded]})')
  newest_step, params = loaded[0]
  if average_last > 1:
    trees = [p for _, p in loaded]
    shapes = [jax.tree.map(jnp.shape, t) for t in trees]
    if any(s != shapes[0] for s in shapes[1:]):
      raise CheckpointError(f'checkpoints {[s for s, _ in loaded]} have different parameter shapes')
    params = jax.tree.map(lambda *xs: sum(x.astype(jnp.float32) for x in xs) / len(xs), *trees)
  return params, newest_step
