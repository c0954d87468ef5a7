"""The limits of the dtypes that config values and flags end up in: an int flag or field becomes
an int32 array index or step (a seed a uint32 PRNG key), a float one a float32 scalar on the
device, so a number is range-checked against these rather than against Python's."""

import numpy as np

INT32_MAX = int(np.iinfo(np.int32).max)
UINT32_MAX = int(np.iinfo(np.uint32).max)  # jax.random.PRNGKey takes a 32-bit seed on CPU
FLOAT32_MAX = float(np.finfo(np.float32).max)
# A positive float must not underflow to 0 (nor to a subnormal, which XLA may flush to 0 on
# CPU/GPU): optimizer.eps=1e-50 would divide 0 by 0 at a zero gradient.
FLOAT32_TINY = 1.1754944e-38  # the smallest normal float32
