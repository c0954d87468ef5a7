"""Attention masks, as pure functions and one small factored form.

Masks are boolean, `True` = may attend, broadcastable to `[batch..., heads, q_len, kv_len]`.
`model.attention` re-exports every name here (the public API's place for them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


def causal_mask(length: int) -> Array:
  """`[1, 1, length, length]`, True on and below the diagonal (position i sees j <= i)."""
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def padding_mask(query_valid: Array, key_valid: Array) -> Array:
  """`[batch, 1, q_len, kv_len]` from boolean `[batch, q_len]` and `[batch, kv_len]` validity."""
  return jnp.logical_and(query_valid[:, None, :, None], key_valid[:, None, None, :])


def segment_mask(query_segment_ids: Array, key_segment_ids: Array) -> Array:
  """`[batch, 1, q_len, kv_len]`, True where the (packed) segment ids are equal."""
  return jnp.equal(query_segment_ids[:, None, :, None], key_segment_ids[:, None, None, :])


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are not None; None when all are None."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  combined = present[0]
  for m in present[1:]:
    combined = jnp.logical_and(combined, m)
  return combined


@dataclasses.dataclass(frozen=True)
class FactoredMask:
  """A mask kept as its factors: causal AND padding(query_valid, key_valid) AND
  segment(query_segment_ids, key_segment_ids), each factor optional.

  `dense(q_len, kv_len)` is the boolean `[batch|1, 1, q_len, kv_len]` mask (`combine_masks`
  of `causal_mask`, `padding_mask`, `segment_mask`). The fast attention paths read the
  factors instead: chunked attention builds one key block at a time, cuDNN takes causal +
  lengths, so the `[q_len, kv_len]` matrix never needs to exist.
  """
  causal: bool = False  # query i sees key j <= i
  query_valid: Array | None = None  # bool [batch, q_len]
  key_valid: Array | None = None  # bool [batch, kv_len]
  query_segment_ids: Array | None = None  # int [batch, q_len]
  key_segment_ids: Array | None = None  # int [batch, kv_len]

  @property
  def packed(self) -> bool:
    """Whether the mask separates packed sequences (has segment ids)."""
    return self.query_segment_ids is not None or self.key_segment_ids is not None

  def dense(self, q_len: int, kv_len: int, key_start: Array | int = 0) -> Array | None:
    """Boolean `[batch|1, 1, q_len, kv_len]` over keys `key_start .. key_start + kv_len - 1`
    (all keys by default; None when there is no factor)."""
    def keys(x):  # [batch, len] -> the keys' slice
      if x.shape[-1] == kv_len:
        return x
      return jax.lax.dynamic_slice_in_dim(x, key_start, kv_len, axis=-1)

    causal = None
    if self.causal:
      key_pos = key_start + jnp.arange(kv_len)
      causal = (jnp.arange(q_len)[:, None] >= key_pos[None, :])[None, None]
    query_valid = None if self.query_valid is None else self.query_valid[:, None, :, None]
    key_valid = None if self.key_valid is None else keys(self.key_valid)[:, None, None, :]
    segments = None
    if self.query_segment_ids is not None:
      segments = segment_mask(self.query_segment_ids, keys(self.key_segment_ids))
    return combine_masks(causal, query_valid, key_valid, segments)


jax.tree_util.register_dataclass(
    FactoredMask, data_fields=['query_valid', 'key_valid', 'query_segment_ids', 'key_segment_ids'],
    meta_fields=['causal'])


def dense_mask(mask: Array | FactoredMask | None, q_len: int, kv_len: int) -> Array | None:
  """A boolean mask array (or None) from a mask array, a `FactoredMask` or None."""
  return mask.dense(q_len, kv_len) if isinstance(mask, FactoredMask) else mask
