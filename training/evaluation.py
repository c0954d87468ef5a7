"""Evaluation during training: validation loss, accuracy and perplexity.

`evaluate` runs the jitted eval step over the (padded) validation batches of every process.
(The validation BLEU scores the trainer's `Session` translations with `common.scores`.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from training import mesh as mesh_lib


def _pad_rows(batch: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  rows = next(iter(batch.values())).shape[0]
  extra = -rows % multiple
  if not extra:
    return batch
  return {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def _max_over_processes(value: int) -> int:
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return int(np.max(multihost_utils.process_allgather(np.array([value]))))


def evaluate(eval_step: Callable, params: Any, batches: Iterable[dict[str, np.ndarray]],
             mesh, num_batches: int | None = None) -> dict[str, float]:
  """-> {'loss' (per-token cross-entropy), 'accuracy', 'perplexity', 'num_tokens'}.

  Each process passes its own batches; a process with fewer batches adds all-padding ones so
  that every process runs the same number of (collective) steps.
  """
  local = [{k: np.asarray(v) for k, v in b.items()}
           for b in itertools.islice(batches, num_batches)]
  total = _max_over_processes(len(local))
  if not local and total:
    raise RuntimeError(f'process {jax.process_index()} has no evaluation batches')
  local += [{k: np.zeros_like(v) for k, v in local[0].items()}] * (total - len(local))
  devices = mesh_lib.local_batch_shards(mesh)
  sums = None
  for batch in local:
    out = eval_step(params, mesh_lib.shard_batch(_pad_rows(batch, devices), mesh))
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    # One eval program in flight at a time. The eval steps do not depend on each other, so
    # XLA:CPU would run several at once, and with several CPU devices each device's part of
    # each program blocks a worker thread at its all-reduce: a small thread pool (2 cores)
    # fills with parts waiting for partners queued behind them, and XLA aborts after 40 s.
    jax.block_until_ready(sums)
  if sums is None:
    return {'loss': float('nan'), 'accuracy': float('nan'), 'perplexity': float('nan'),
            'num_tokens': 0.0}
  sums = jax.device_get(sums)
  n = max(float(sums['num_tokens']), 1.0)
  loss = float(sums['loss']) / n
  return {'loss': loss, 'accuracy': float(sums['correct']) / n,
          'perplexity': float(np.exp(min(loss, 100.0))), 'num_tokens': float(sums['num_tokens'])}
