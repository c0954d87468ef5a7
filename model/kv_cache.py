"""The KV cache of decoding: a typed pytree, and the operations the searches need.

Per decoder layer, a `SelfAttentionCache` (the keys and values of every decoder input so far,
written at the cache's `index`) and, in an encoder-decoder, a `CrossAttentionCache` (the
encoder output's keys and values, projected once per sentence). `KVCache` holds them with
the index. The searches (`autoregressive`) carry it through their loops and use only its
methods: `grow` (more positions), `select_rows` (hypotheses follow their beams) and `pin`
(the loop-invariant cross-attention) -- never its field names.

Layouts are heads-major: keys `[batch, heads, head_dim, len]` and values `[batch, heads, len,
head_dim]`. With values also positions last, weights V was ~3.5x slower per decoder step on
XLA:CPU (a transposed batched matmul; measured at 64 rows x 4 beams, 65 positions).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array

# `[batch, len, heads, head_dim]` -> the stored layout, and where the positions are (from the end).
KEY_LAYOUT, VALUE_LAYOUT = (0, 2, 3, 1), (0, 2, 1, 3)
KEY_POSITIONS, VALUE_POSITIONS = KEY_LAYOUT.index(1) - 4, VALUE_LAYOUT.index(1) - 4


def _stored(x: Array, layout: tuple[int, ...]) -> Array:
  return jnp.transpose(x, layout)


def _view(x: Array, layout: tuple[int, ...]) -> Array:
  """The stored layout -> a `[batch, len, heads, head_dim]` view."""
  return jnp.transpose(x, sorted(range(4), key=layout.__getitem__))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SelfAttentionCache:
  """One self-attention's keys `[batch, heads, head_dim, len]` and values `[batch, heads, len,
  head_dim]`, one position per decoder input; the empty positions are masked by causality."""
  key: Array
  value: Array

  @classmethod
  def empty(cls, batch: int, cache_len: int, num_heads: int, head_dim: int, dtype
            ) -> SelfAttentionCache:
    zeros = jnp.zeros((batch, cache_len, num_heads, head_dim), dtype)
    return cls(_stored(zeros, KEY_LAYOUT), _stored(zeros, VALUE_LAYOUT))

  @property
  def length(self) -> int:
    return self.key.shape[KEY_POSITIONS]

  def write(self, key: Array, value: Array, index: Array) -> SelfAttentionCache:
    """This call's keys and values `[batch, n, heads, head_dim]` written at position `index`."""
    def at(cached, x, layout, axis):
      start = [0] * 4
      start[axis] = index
      return jax.lax.dynamic_update_slice(cached, _stored(x, layout), start)
    return SelfAttentionCache(at(self.key, key, KEY_LAYOUT, KEY_POSITIONS),
                              at(self.value, value, VALUE_LAYOUT, VALUE_POSITIONS))

  def keys_values(self) -> tuple[Array, Array]:
    """Every position's keys and values as `[batch, len, heads, head_dim]` views."""
    return _view(self.key, KEY_LAYOUT), _view(self.value, VALUE_LAYOUT)

  def grow(self, cache_len: int) -> SelfAttentionCache:
    """Padded with empty positions up to `cache_len`."""
    def pad(x, axis):
      axis += x.ndim
      return jnp.pad(x, [(0, cache_len - x.shape[axis]) if i == axis else (0, 0)
                         for i in range(x.ndim)])
    return SelfAttentionCache(pad(self.key, KEY_POSITIONS), pad(self.value, VALUE_POSITIONS))

  def select_rows(self, rows: Array) -> SelfAttentionCache:
    """Rows `rows` `[n]` (in range: a beam's parents), e.g. hypotheses following their beams."""
    return SelfAttentionCache(self.key.at[rows].get(mode='promise_in_bounds'),
                              self.value.at[rows].get(mode='promise_in_bounds'))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CrossAttentionCache:
  """One encoder-decoder attention's keys and values of the encoder output (stored layouts
  as `SelfAttentionCache`'s), the same at every step."""
  key: Array
  value: Array

  @classmethod
  def of(cls, key: Array, value: Array) -> CrossAttentionCache:
    """From keys and values `[batch, src_len, heads, head_dim]`."""
    return cls(_stored(key, KEY_LAYOUT), _stored(value, VALUE_LAYOUT))

  def keys_values(self) -> tuple[Array, Array]:
    return _view(self.key, KEY_LAYOUT), _view(self.value, VALUE_LAYOUT)

  def pin(self) -> CrossAttentionCache:
    """Under an optimization barrier: XLA's loop-invariant code motion would otherwise hoist
    the `[batch, len, heads, head_dim]` view of these loop-invariant arrays (a transpose) out of
    the decoding loop, then transpose them back, physically, at every step for the attention
    matmuls (measured on CPU). Changes no value."""
    return CrossAttentionCache(jax.lax.optimization_barrier(self.key),
                               jax.lax.optimization_barrier(self.value))


LayerCache = dict  # attention module name ('self_attention', 'cross_attention') -> its cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """The decoder's cache: `index` (int32 `[]`, the positions written so far) and one
  `LayerCache` per layer."""
  index: Array
  layers: list[LayerCache]

  def _map(self, self_fn, cross_fn) -> KVCache:
    def one(cache):
      return self_fn(cache) if isinstance(cache, SelfAttentionCache) else cross_fn(cache)
    return KVCache(self.index, [{name: one(c) for name, c in layer.items()}
                                for layer in self.layers])

  def grow(self, cache_len: int) -> KVCache:
    """Every self-attention cache padded to `cache_len` positions. A loop's first steps can
    run on a short cache: attention over the cache costs in proportion to its length, and most
    outputs are short."""
    return self._map(lambda c: c.grow(cache_len), lambda c: c)

  def select_rows(self, rows: Array) -> KVCache:
    """The self-attention caches at rows `rows` (one row per hypothesis: they follow their
    beams); the cross-attention caches, one per sentence, are left as they are."""
    return self._map(lambda c: c.select_rows(rows), lambda c: c)

  def pin(self) -> KVCache:
    """The cross-attention caches pinned (`CrossAttentionCache.pin`) at the top of a loop."""
    return self._map(lambda c: c, lambda c: c.pin())
