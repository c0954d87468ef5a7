"""The one module over Orbax: checkpoints under `DIR/checkpoints/<step>/{state,data}`.

  Checkpointer(workdir, max_to_keep=3)   for the trainer: save(step, state, data_state) (async),
                                         restore(abstract_state) with fallback, wait(), close()
  save_params(workdir, params)           a step-0 checkpoint of parameters only (an import):
                                         restore gives `ParamsOnly`, the trainer starts from it
  restore_params(workdir, step=None, average_last=1) -> (params, step)   for decode.py;
  list_steps(workdir) -> [int]. A checkpoint of version 0.1 (Linen names) is refused.

`state` is the TrainState (params, opt_state, step, rng), or `{'params': ...}` alone (an
import, which trains nothing); `data` every process's JSON iterator state. Orbax writes a step
to a temporary directory renamed when complete (a kill mid-write
leaves the earlier checkpoints intact); single-process runs add `checksums.json` (sha256 of
every file) before that rename. A step failing it, or unreadable, is "damaged": skipped with a
warning. A failed save raises `CheckpointWriteError` naming the step; arrays restore onto any mesh.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from common import waiting
from common.messages import first_few
from optim import ema
from workdir import checkpoint_files as files, orbax_noise

CHECKPOINT_SUBDIR = 'checkpoints'


class ParamsOnly(NamedTuple):
  """What `Checkpointer.restore` gives for a checkpoint of parameters only (`save_params`: an
  import's step 0): the trainer starts its optimizer state and data afresh from `params`."""
  params: Any


class CheckpointError(RuntimeError):
  """No usable checkpoint, or one incompatible with the model; the message is one line."""


class CheckpointWriteError(CheckpointError):
  """A checkpoint could not be written (e.g. a full disk); the earlier ones are intact."""


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_SUBDIR)


def _warn(message: str) -> None:
  if jax.process_index() == 0:
    print(f'WARNING: {message}', file=sys.stderr, flush=True)


def step_dir(workdir: str, step: int) -> str:
  return os.path.join(checkpoint_dir(workdir), str(step))


def _manager(workdir: str, *, max_to_keep: int | None = None, async_save: bool = False,
             read_only: bool = False, before_commit=None) -> ocp.CheckpointManager:
  """`before_commit()` (async saves) runs once every file of a step is written, before the
  step's temporary directory is renamed into place. A reader (`read_only`) creates and
  deletes nothing and reads no step's metadata until asked; Orbax's own `read_only` option is
  not used, as it only adds a misleading 'Given directory is read only' warning. Orbax's
  `cleanup_tmp_directories` is not used either: its background thread is not awaited by
  `close()`, and at a quick exit it dies printing a traceback (`Checkpointer` removes the
  leftovers itself, before this)."""
  directory = checkpoint_dir(workdir)
  async_options = None
  if async_save and before_commit is not None:
    async_options = ocp.AsyncOptions(post_finalization_callback=before_commit)
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, lightweight_initialize=read_only,
      enable_async_checkpointing=async_save, async_options=async_options)
  handlers = {'state': ocp.PyTreeCheckpointHandler(), 'data': ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def list_steps(workdir: str) -> list[int]:
  """Steps of the finished checkpoints in `DIR/checkpoints`, ascending ([] if none): the
  step folders Orbax has renamed into place (no Orbax metadata is read)."""
  return files.committed_steps(checkpoint_dir(workdir))


def _state_metadata(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  metadata = manager.item_metadata(step)['state']
  tree = getattr(metadata, 'tree', metadata)
  if tree is None:
    raise ValueError(f'checkpoint {step} has no state metadata')
  return tree


class Checkpointer:
  """Saves/restores the train state + data iterator state for the trainer.

  `save` is asynchronous (Orbax writes in a background thread after copying the arrays off
  the devices); `wait()` blocks until the last save is on disk. Every process calls
  `save`/`restore`. Orbax's own logs are held back: a failure is one `CheckpointError` line.
  """

  def __init__(self, workdir: str, *, max_to_keep: int = 3, async_save: bool = True,
               checksums: bool = True):
    self.workdir = workdir
    self._async = async_save
    self._pending: int | None = None  # the step a background save may still be writing
    # Checksums and the free-space check need one view of every file: single-process runs.
    self._single = jax.process_count() == 1
    self._checksums = checksums and self._single  # False: bench/checkpoint_io.py's baseline
    _, linked = files.unlink_planted(checkpoint_dir(workdir), _warn)  # Orbax's folder names
    if linked:  # a step: Orbax would delete (rmtree) through it
      raise CheckpointError(
          f'{os.path.join(checkpoint_dir(workdir), linked[0])} is a symbolic link: train.py '
          'neither writes nor deletes checkpoints through links (replace it with the folder it '
          'points to, or remove it)')
    if jax.process_index() == 0:  # the leftovers of a save killed mid-write
      for path in files.temporary_folders(checkpoint_dir(workdir)):
        files.remove(path)
    self._quiet = contextlib.ExitStack()
    self._quiet.enter_context(orbax_noise.quiet_orbax_logs())
    self._manager = _manager(workdir, max_to_keep=max_to_keep, async_save=async_save,
                             before_commit=self._checksum_pending if self._checksums else None)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, data_state: dict[str, Any] | None) -> None:
    """Starts saving `state` (a pytree of arrays) and this process's `data_state` (JSON) at
    `step`."""
    data = {'process_count': jax.process_count(), 'states': files.gather_json(data_state),
            **files.data_marker(self._checksums)}
    self._finish_pending()
    if self._single:
      self._check_free_space(step, state)
    if files.unlink_planted(checkpoint_dir(self.workdir), _warn, step)[0]:  # since the start
      self._manager.reload()
    try:
      if step in self._manager.all_steps():  # a damaged checkpoint skipped at restore
        self._delete(step)
      self._pending = step
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data)), force=True)
    except Exception as e:  # pylint: disable=broad-except
      self._write_failed(step, e)
    if not self._async:
      self._finish_pending()

  def _checksum_pending(self) -> None:
    """Orbax's background thread, once every file of the pending step is written: checksums
    into its temporary directory, so that they are renamed into place with it."""
    found = [p for p in files.temporary_folders(checkpoint_dir(self.workdir), self._pending)
             if os.path.isdir(p)]
    if len(found) != 1:
      _warn(f'checkpoint {self._pending} is saved without checksums (Orbax wrote it to '
            f'{len(found)} temporary directories)')
      return
    files.write_checksums(found[0])

  def _finish_pending(self) -> None:
    """Waits for the background save; its failure raises `CheckpointWriteError`."""
    step = self._pending
    if step is None:
      return
    try:
      # `_checksum_pending` runs meanwhile: keep _pending. Interruptible by a second Ctrl-C.
      waiting.wait_interruptibly(self._manager.wait_until_finished)
    except Exception as e:  # pylint: disable=broad-except
      self._write_failed(step, e)
    self._pending = None
    if self._single and not os.path.isdir(step_dir(self.workdir, step)):
      self._write_failed(step, RuntimeError('Orbax did not commit it'))
    if not self._async and self._checksums:  # no background thread: checksum the final files
      files.write_checksums(step_dir(self.workdir, step))

  def _check_free_space(self, step: int, state: Any) -> None:
    """Refuses a save that cannot fit: a step needs about as much as the previous one."""
    steps = [s for s in self._manager.all_steps() if os.path.isdir(step_dir(self.workdir, s))]
    if steps:
      need = files.tree_size(step_dir(self.workdir, max(steps)))
    else:
      need = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))
    need = int(need * 1.05) + (1 << 16)
    free = shutil.disk_usage(checkpoint_dir(self.workdir)).free
    if free < need:
      self._write_failed(step, OSError(28, f'about {need / 2**20:.1f} MiB needed, '
                                           f'{free / 2**20:.1f} MiB free'))

  def _write_failed(self, step: int, error: BaseException) -> None:
    """Stops Orbax's pending work, removes the unfinished step (freeing its space) and raises
    one line naming the step and the checkpoints still intact."""
    self._pending = None
    orbax_noise.note_failure()
    with contextlib.suppress(Exception):
      self._manager.close()
    where = checkpoint_dir(self.workdir)
    for path in files.temporary_folders(where, step):
      files.remove(path)
    self._quiet.close()
    intact = [s for s in files.committed_steps(where) if s != step]
    kept = (f'checkpoints {", ".join(map(str, intact))} are intact' if len(intact) > 1 else
            f'checkpoint {intact[0]} is intact' if intact else 'there is no earlier checkpoint')
    if files.is_disk_full(error):
      raise CheckpointWriteError(
          f'no space left on device writing checkpoint {step} in {where}; {kept}') from None
    raise CheckpointWriteError(f'cannot write checkpoint {step} in {where} '
                               f'({files.short_reason(error, where)}); {kept}') from None

  def restore(self, abstract_state: Any, *, allow_fresh_data: bool = False
              ) -> tuple[Any, dict[str, Any] | None, int] | None:
    """-> (state, this process's data state or None, step) from the newest good checkpoint,
    or None when there is none. Raises `CheckpointError` for an incompatible checkpoint, and
    for one without its data-iterator state unless `allow_fresh_data`."""
    steps = self.all_steps()
    if not steps:
      return None
    skipped, unverified = [], _Unverified(self.workdir)
    for step in reversed(steps):
      no_data = files.missing_items(step_dir(self.workdir, step), ('data',))
      problem = files.verify_checksums(step_dir(self.workdir, step), skip=tuple(no_data))
      if problem is None:
        unverified.check(step)
        try:
          stored = _state_metadata(self._manager, step)
        except Exception as e:  # pylint: disable=broad-except
          problem = files.short_reason(e, checkpoint_dir(self.workdir))
      if problem is not None:
        _warn(f'checkpoint {step} is damaged ({problem}); trying the previous one')
        skipped.append(step)
        continue
      self._check_fits(abstract_state, stored, step)
      if 'opt_state' not in stored:  # parameters only: nothing of a run to resume but them
        if step != 0:
          raise CheckpointError(f'checkpoint {step} in {checkpoint_dir(self.workdir)} holds '
                                'parameters only, which only a step-0 checkpoint may')
        first = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return ParamsOnly(_restore_params_at(self._manager, self.workdir, step, first,
                                             unverified, ema.PARAMS)), None, step
      if no_data:
        self._no_data_state(step, allow_fresh_data)
      try:
        restored = self._restore_step(step, abstract_state, with_data=not no_data)
      except Exception as e:  # pylint: disable=broad-except
        _warn(f'checkpoint {step} is damaged '
              f'({files.short_reason(e, checkpoint_dir(self.workdir))}); trying the previous one')
        skipped.append(step)
        continue
      for bad in skipped:
        _warn(f'removing damaged checkpoint {bad}')
        if jax.process_index() == 0:
          self._delete(bad)
      return restored['state'], self._data_state(restored.get('data'), step), step
    raise CheckpointError(f'no readable checkpoint in {checkpoint_dir(self.workdir)} '
                          f'(tried steps {sorted(skipped)})')

  def _delete(self, step: int) -> None:
    """Deletes a step; a symlink planted there meanwhile is unlinked, never followed."""
    if os.path.islink(step_dir(self.workdir, step)):
      files.remove(step_dir(self.workdir, step))
      self._manager.reload()
    else:
      self._manager.delete(step)

  def _check_fits(self, abstract_state: Any, stored: Any, step: int) -> None:
    if problem := files.older_layout(stored.get('params', {}), step, self.workdir):
      raise CheckpointError(problem)
    mismatches = files.shape_mismatches(files.params_tree(abstract_state), stored.get('params', {}),
                                   'params/')
    if mismatches:
      raise CheckpointError(
          f'checkpoint {step} in {checkpoint_dir(self.workdir)} does not fit the model: '
          f'{first_few(mismatches)}')

  def _no_data_state(self, step: int, allow_fresh_data: bool) -> None:
    """A step whose parameters are fine but whose data-iterator state is gone: kept; resumed
    with a fresh iterator only when asked (the batches then differ from an unbroken run)."""
    where = step_dir(self.workdir, step)
    if not allow_fresh_data:
      raise CheckpointError(
          f'checkpoint {step} has no data-iterator state ({where}/data is missing; its '
          'parameters are intact and kept): rerun with '
          '--config.train.allow_fresh_data_iterator=True to resume from it with a fresh data '
          'iterator, or restore that folder')
    _warn(f'checkpoint {step} has no data-iterator state ({where}/data is missing): resuming '
          'with a fresh data iterator (config.train.allow_fresh_data_iterator)')

  def _restore_step(self, step: int, abstract_state: Any, with_data: bool) -> dict[str, Any]:
    items = {'state': ocp.args.PyTreeRestore(
        item=abstract_state,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))}
    if with_data:
      items['data'] = ocp.args.JsonRestore()
    return dict(self._manager.restore(step, args=ocp.args.Composite(**items)))

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
    self._finish_pending()

  def close(self) -> None:
    self._finish_pending()
    self._manager.close()
    self._quiet.close()


class _Unverified:
  """Warns once per restore about steps without checksums from a version before them."""

  def __init__(self, workdir: str):
    self.workdir, self.warned = workdir, False

  def check(self, step: int) -> None:
    if not self.warned and files.unverified(step_dir(self.workdir, step)):
      self.warned = True
      _warn(f'checkpoint {step} in {checkpoint_dir(self.workdir)} has no {files.CHECKSUM_FILE} '
            '(written by a version from before checksums): restoring it unverified')


class _Damaged(Exception):  # files failing their checksums (the message: the short reason)
  pass


def _restore_params_at(manager: ocp.CheckpointManager, workdir: str, step: int, sharding,
                       unverified: _Unverified, subtree: tuple[str, ...]) -> Any:
  problem = files.verify_checksums(step_dir(workdir, step), skip=('data',))
  if problem is not None:  # found before Orbax starts reading: nothing is left pending
    raise _Damaged(problem)
  unverified.check(step)
  stored = _state_metadata(manager, step)
  for key in subtree:
    if not isinstance(stored, dict) or key not in stored:
      raise ValueError(f'checkpoint {step} has no {"/".join(subtree)}')
    stored = stored[key]
  if problem := files.older_layout(stored, step, workdir):
    raise CheckpointError(problem)
  place = (lambda *_: sharding) if isinstance(sharding, jax.sharding.Sharding) else sharding
  target = jax.tree_util.tree_map_with_path(lambda path, m: jax.ShapeDtypeStruct(
      tuple(m.shape), m.dtype, sharding=place(path, tuple(m.shape))), stored)
  for key in reversed(subtree):
    target = {key: target}
  restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
      partial_restore=True)))['state']
  for key in subtree:
    restored = restored[key]
  return files.int_keys(restored)


def _load_params(workdir: str, candidates: list[int], count: int, sharding,
                 strict_step: int | None, subtree: tuple[str, ...]) -> list[tuple[int, Any]]:
  """The params of up to `count` readable checkpoints among `candidates`, newest first; a
  damaged one is skipped with a warning, except `strict_step` (asked for by number)."""
  where = checkpoint_dir(workdir)
  loaded: list[tuple[int, Any]] = []
  unverified = _Unverified(workdir)
  with contextlib.closing(_manager(workdir, read_only=True)) as manager:
    for s in reversed(candidates):
      try:
        loaded.append((s, _restore_params_at(manager, workdir, s, sharding, unverified, subtree)))
      except CheckpointError:  # readable, but not this version's: no fallback
        raise
      except Exception as e:  # pylint: disable=broad-except
        reason = str(e) if isinstance(e, _Damaged) else files.short_reason(e, where)
        if s == strict_step:
          raise CheckpointError(f'checkpoint {s} in {where} is damaged: {reason}') from None
        _warn(f'checkpoint {s} in {where} is damaged ({reason}); skipping it')
        continue
      if len(loaded) == count:
        break
  return loaded


def save_params(workdir: str, params: Any, step: int = 0) -> None:
  """A checkpoint of `params` (a pure dict of arrays) alone at `step` (0), written and
  checksummed before this returns: a workdir made without training (an import) that decode.py,
  export.py and `init_from` read as any, and that train.py starts from (`ParamsOnly`)."""
  saver = Checkpointer(workdir, async_save=False)
  try:
    saver.save(step, {'params': jax.tree.map(jnp.asarray, params)}, None)
  finally:
    saver.close()


def restore_params(workdir: str, step: int | None = None, average_last: int = 1,
                   sharding: Any = None, config: Any = None) -> tuple[Any, int]:
  """Parameters only (no optimizer state, no model code needed) -> (params, step).

  `step=None` takes the newest readable checkpoint (falling back past a damaged one with a
  warning). `average_last=N` averages the params of the N newest checkpoints up to `step`.
  Arrays are placed with `sharding` (default: the first local device), whatever mesh wrote
  them; a function `(key path, shape) -> Sharding` places each leaf by itself (its shards are
  read straight onto their devices: `workdir.restore` lays parameters out on a mesh so).
  `config` (the run's, its config.json's): the weights it evaluates with, which `optim.ema`
  says (the moving average of the parameters when the run kept one); None: the parameters.
  Raises `CheckpointError` (one line) when there is nothing to restore.
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
  candidates = [s for s in steps if step is None or s <= step]
  with orbax_noise.quiet_orbax_logs():
    loaded = _load_params(workdir, candidates, average_last, sharding, strict_step=step,
                          subtree=ema.stored_weights(config))
  if not loaded:
    raise CheckpointError(f'no readable checkpoint in {where} (tried steps {candidates})')
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
