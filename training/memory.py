"""Per-device memory of a training run, known before it starts: parameters, optimizer state
(from their shardings) and the compiled train step's temporaries (XLA's memory analysis).

`train.py` logs the table when it compiles its first step; `--config.train.dry_run=True`
prints it for any preset on any mesh without data, checkpoints or training (simulate a device
count on CPU with XLA_FLAGS=--xla_force_host_platform_device_count=N).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

import optim
from model import partitioning
from model.build import count_params
from model.kinds import adapter_of
from training import config_check, mesh as mesh_lib, state as state_lib, steps

GIB = 2 ** 30


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs with shardings)."""
  total = 0
  for x in jax.tree.leaves(tree):
    total += int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
  return total


def step_memory(compiled, state) -> dict[str, int]:
  """Per-device bytes: 'params', 'opt_state' (held between steps), 'temporaries' (the step's
  scratch: activations, gradients, collectives' buffers) and their 'total'."""
  out = {'params': per_device_bytes(state.params), 'opt_state': per_device_bytes(state.opt_state)}
  analysis = compiled.memory_analysis()
  out['temporaries'] = int(getattr(analysis, 'temp_size_in_bytes', 0) or 0)
  out['total'] = out['params'] + out['opt_state'] + out['temporaries']
  return out


def format_table(memory: dict[str, int], mesh) -> str:
  shape = 'x'.join(str(mesh.shape[a]) for a in partitioning.MESH_AXES)
  cells = ' | '.join(f'{k} {v / GIB:.3f} GiB' for k, v in memory.items())
  return f'per-device memory on mesh (data x fsdp x tensor) {shape}: {cells}'


def abstract_batch(config, model_config, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The global train batch as ShapeDtypeStructs split over data x fsdp."""
  shapes = adapter_of(model_config).train_batch_shapes(
      config.train.batch_size, config.data.max_length, bool(config.data.get('packing', False)))
  sharding = mesh_lib.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct(s, d, sharding=sharding) for k, (s, d) in shapes.items()}


def dry_run(config) -> dict[str, Any]:
  """Compiles `config`'s train step on this process's devices (nothing else) and returns
  {'parameters', 'mesh', 'memory' (per-device bytes), 'compile_s'}."""
  model_config = config_check.validate_config(config, num_devices=jax.device_count(),
                                           process_count=jax.process_count())
  mesh = mesh_lib.make_mesh(mesh_config=config.get('mesh'))
  rules = mesh_lib.rules(config.get('mesh'))
  schedule = optim.make_schedule(config)
  tx = optim.make_optimizer(config, schedule)
  state = state_lib.abstract_train_state(model_config, tx, mesh, rules)
  step = steps.jit_train_step(model_config, tx, schedule, mesh,
                              label_smoothing=config.train.label_smoothing,
                              grad_accum_steps=config.train.grad_accum_steps, rules=rules)
  started = time.time()
  compiled = step.lower(state, abstract_batch(config, model_config, mesh)).compile()
  return {'parameters': count_params(state.params), 'mesh': mesh,
          'memory': step_memory(compiled, state), 'compile_s': time.time() - started}
