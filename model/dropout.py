"""Inverted dropout and its random bits, as pure functions.

`model.attention` re-exports `DROPOUT_RNGS`, `dropout` and `hashed_bits` (their public place);
`hashed_bits_block` is what the chunked attention draws its attention-dropout bits with.

Where the keys come from: one key per training step; each module that drops something names
its sites once (`SITES`, a tuple) and takes `site_keys(key, SITES)`: site i's key is
`fold_in(key, i)`. A stack gives layer i the key `layer_key(key, i)` (site 0 being the
embeddings'), the same whether its layers are unrolled or scanned, so both draw the same masks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DROPOUT_RNGS = ('hash', 'threefry')


def site_keys(key: Array | None, sites: tuple[str, ...]) -> dict[str, Array | None]:
  """The dropout key of each named site of one module call: `fold_in(key, index)`, index its
  place in `sites` (None stays None: no dropout)."""
  return {name: None if key is None else jax.random.fold_in(key, i)
          for i, name in enumerate(sites)}


def layer_key(key: Array | None, index: Array | int) -> Array | None:
  """Layer `index`'s key in a stack whose site 0 is the embeddings (`STACK_SITES`)."""
  return None if key is None else jax.random.fold_in(key, index + 1)


STACK_SITES = ('embeddings',)  # a stack's own site; its layers follow (`layer_key`)


def dropout(x: Array, rate: float, rng: Array, *, rng_impl: str = 'hash') -> Array:
  """Inverted dropout: zero each element with probability `rate`, scale the rest by 1/(1-rate).

  `rng_impl` picks the random bits: 'threefry' draws them with `jax.random.bits` (16 per
  element; the reference), 'hash' with `hashed_bits` (32 per element, computed inside the
  elementwise fusion, never stored). On CPU, JAX's threefry runs as a rolled XLA loop whose
  bits are written to memory and copied every round: that was ~20% of a small model's train
  step, against ~1% for the hash.
  """
  if rng_impl == 'threefry':
    keep = jax.random.bits(rng, x.shape, jnp.uint16) < jnp.uint16(
        min(round((1.0 - rate) * 2 ** 16), 2 ** 16 - 1))
  elif rng_impl == 'hash':
    keep = hashed_bits(rng, x.shape) < keep_threshold(rate)
  else:
    raise ValueError(f'dropout: rng_impl={rng_impl!r} is not one of {list(DROPOUT_RNGS)}')
  return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


def keep_threshold(rate: float) -> Array:
  """uint32 threshold: an element is kept when its `hashed_bits` are below it."""
  return jnp.uint32(min(round((1.0 - rate) * 2 ** 32), 2 ** 32 - 1))


def hashed_bits(rng: Array, shape: tuple[int, ...], *, max_counter: int = 2 ** 32) -> Array:
  """32 random bits per element, uint32 `shape`: a keyed integer hash of each element's index.

  A counter-based generator, like threefry and Philox, with a cheaper mixing function: two
  rounds of `_mix32`, keyed by two words drawn from `rng` with `jax.random.bits`, so distinct
  keys give unrelated streams. Tensors of `max_counter` elements or more (more than a uint32
  index can count) hash their leading index into the key, so no two elements share a counter.
  """
  seed = jax.random.bits(rng, (2,), jnp.uint32)
  size = int(np.prod(shape))
  if size < max_counter or len(shape) < 2:
    counter, stream = jax.lax.iota(jnp.uint32, size).reshape(shape), seed[1]
  else:
    rows = int(np.prod(shape[1:]))
    counter = jax.lax.iota(jnp.uint32, rows).reshape((1, *shape[1:]))
    row = jax.lax.broadcasted_iota(jnp.uint32, (shape[0], *(1,) * (len(shape) - 1)), 0)
    stream = _mix32(row ^ seed[1])
  return _mix32(_mix32(counter ^ seed[0]) + stream)


def hashed_bits_block(rng: Array, shape: tuple[int, ...], start: Array | int, size: int, *,
                      max_counter: int = 2 ** 32) -> Array:
  """`hashed_bits(rng, shape)[..., start:start + size]`, computing only that block.

  Each element's counter is its row-major index in `shape` (or, for tensors of `max_counter`
  elements or more, its index within the leading entry, which is hashed into the key), so a
  block's bits need no other block's. Columns past `shape[-1]` get bits too (unused).
  """
  seed = jax.random.bits(rng, (2,), jnp.uint32)
  block_shape = (*shape[:-1], size)
  by_row = int(np.prod(shape)) >= max_counter and len(shape) >= 2
  strides = np.cumprod((1, *shape[:0:-1]))[::-1]  # row-major strides of `shape`
  counter = jnp.zeros(block_shape, jnp.uint32)
  for axis in range(1 if by_row else 0, len(shape)):
    index = jax.lax.broadcasted_iota(jnp.uint32, block_shape, axis)
    if axis == len(shape) - 1:
      index = index + jnp.asarray(start).astype(jnp.uint32)
    counter = counter + index * jnp.uint32(int(strides[axis]) % 2 ** 32)
  stream = seed[1]
  if by_row:
    row = jax.lax.broadcasted_iota(jnp.uint32, (shape[0], *(1,) * (len(shape) - 1)), 0)
    stream = _mix32(row ^ seed[1])
  return _mix32(_mix32(counter ^ seed[0]) + stream)


def _mix32(x: Array) -> Array:
  """A bijective 32-bit integer hash with full avalanche ("lowbias32", C. Wellons'
  hash-prospector: xor-shift / multiply rounds)."""
  x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
  x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)
