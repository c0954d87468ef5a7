"""Matmul precision and deterministic ops: the two settings where GPUs/TPUs differ from CPUs.

On GPUs a float32 matmul runs by default with TF32 inputs (TPUs: bf16 passes), a relative
error of ~1e-3, and scatter-add gradients (the embedding's) sum in a nondeterministic order.
`config.train.matmul_precision` and `config.train.deterministic` choose; on a CPU both are
no-ops (XLA:CPU computes float32 matmuls in float32 and is deterministic).
"""

from __future__ import annotations

import contextlib
import os

from common.errors import ConfigError

MATMUL_PRECISIONS = ('default', 'high', 'highest')  # config.train.matmul_precision's values
DETERMINISTIC_XLA_FLAG = '--xla_gpu_deterministic_ops=true'


def matmul_precision(name: str):
  """Context manager for tracing under `config.train.matmul_precision`.

  'default' leaves JAX's own setting alone: the backend's fast default, or whatever
  `$JAX_DEFAULT_MATMUL_PRECISION` says (the test suite sets 'highest' there).
  """
  if name not in MATMUL_PRECISIONS:
    raise ConfigError(f'config.train.matmul_precision={name!r} is not one of '
                      f'{list(MATMUL_PRECISIONS)}')
  if name == 'default':
    return contextlib.nullcontext()
  import jax  # pylint: disable=import-outside-toplevel  (jax only when a setting is used)
  return jax.default_matmul_precision(name)


def with_deterministic_flag(xla_flags: str) -> str:
  """`$XLA_FLAGS` with deterministic GPU ops turned on (unchanged if already there)."""
  if DETERMINISTIC_XLA_FLAG in xla_flags.split():
    return xla_flags
  return f'{xla_flags} {DETERMINISTIC_XLA_FLAG}'.strip()


def request_deterministic_ops() -> None:
  """Turns on deterministic GPU ops for this process. XLA reads the flag when the backend
  starts, so train.py calls this before anything touches JAX."""
  os.environ['XLA_FLAGS'] = with_deterministic_flag(os.environ.get('XLA_FLAGS', ''))


def check_deterministic(deterministic: bool) -> None:
  """Raises `ConfigError` when deterministic ops were asked for but the running GPU backend
  started without them (only possible when `train_and_evaluate` is called from Python)."""
  if not deterministic:
    return
  import jax  # pylint: disable=import-outside-toplevel  (jax only when a setting is used)
  if jax.default_backend() != 'gpu':
    return  # CPU is deterministic; TPU reductions are too
  if DETERMINISTIC_XLA_FLAG not in os.environ.get('XLA_FLAGS', '').split():
    raise ConfigError(
        'config.train.deterministic=True needs XLA_FLAGS=' + DETERMINISTIC_XLA_FLAG +
        ' before JAX starts (train.py sets it; set it yourself when calling train_and_evaluate '
        'from Python)')
