"""Suite-wide settings, applied before any test imports JAX.

Tests that compare two computations for equality (cache vs full pass, packed vs alone, 1 vs
8 devices, resume vs straight) must not depend on the backend's default matmul precision:
on GPUs and TPUs a float32 matmul runs by default with TF32/bf16 inputs (relative error
~1e-3), and scatter-add gradients are non-deterministic. So the whole suite (and every
subprocess it starts, which inherits the environment) runs float32 matmuls at full precision
and deterministic GPU ops. Reduced-precision behaviour has its own tests
(tests/test_precision.py), which ask for it explicitly.
"""

import os
import sys

# Tests import the project from the checkout, installed or not.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUITE_MATMUL_PRECISION = 'highest'
DETERMINISTIC_XLA_FLAG = '--xla_gpu_deterministic_ops=true'

os.environ['JAX_DEFAULT_MATMUL_PRECISION'] = SUITE_MATMUL_PRECISION
if DETERMINISTIC_XLA_FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {DETERMINISTIC_XLA_FLAG}'.strip()

if 'jax' in sys.modules:  # a plugin imported JAX before us: set it there too
  sys.modules['jax'].config.update('jax_default_matmul_precision', SUITE_MATMUL_PRECISION)
