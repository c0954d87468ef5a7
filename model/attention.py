"""Scaled dot-product attention and its masks, as pure functions (no Flax, no state).

Layout: arrays are `[batch..., length, heads, head_dim]`. Masks are boolean,
`True` = may attend, broadcastable to `[batch..., heads, q_len, kv_len]`.

The paper's equation (1):  Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


# ----------------------------------------------------------------------------- attention

def dot_product_attention_weights(query: Array, key: Array, *, mask: Array | None = None,
                                  bias: Array | None = None, scale: float | None = None) -> Array:
  """softmax(Q K^T * scale + bias), masked.

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., kv_len, heads, head_dim]`.
    mask: boolean, broadcastable to `[batch..., heads, q_len, kv_len]`; True = keep.
    bias: additive, broadcastable like `mask` (e.g. relative position terms).
    scale: multiplies the logits; defaults to `1/sqrt(head_dim)`.
  Returns:
    weights `[batch..., heads, q_len, kv_len]` in the query's dtype. Rows whose
    keys are all masked are all zero. The softmax runs in float32.
  """
  if scale is None:
    scale = query.shape[-1] ** -0.5
  logits = jnp.einsum('...qhd,...khd->...hqk', query * jnp.asarray(scale, query.dtype), key,
                      preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    # A row with every key masked would otherwise be uniform over the masked keys.
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)
  return weights.astype(query.dtype)


def dot_product_attention(query: Array, key: Array, value: Array, *, mask: Array | None = None,
                          bias: Array | None = None, scale: float | None = None,
                          dropout_rate: float = 0.0, dropout_rng: Array | None = None,
                          dropout_rng_impl: str = 'hash', deterministic: bool = True,
                          return_weights: bool = False):
  """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, with optional attention dropout.

  Args:
    query: `[batch..., q_len, heads, head_dim]`.
    key: `[batch..., kv_len, heads, head_dim]`.
    value: `[batch..., kv_len, heads, v_head_dim]`.
    mask, bias, scale: as in `dot_product_attention_weights`.
    dropout_rate: dropout on the attention weights (needs `dropout_rng` when not
      `deterministic`); `dropout_rng_impl` as `rng_impl` of `dropout`.
    return_weights: also return the weights `[batch..., heads, q_len, kv_len]`.
  Returns:
    `[batch..., q_len, heads, v_head_dim]` (and the weights when asked).
  """
  weights = dot_product_attention_weights(query, key, mask=mask, bias=bias, scale=scale)
  attended = weights
  if not deterministic and dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError('dot_product_attention: dropout_rate > 0 needs a dropout_rng')
    attended = dropout(weights, dropout_rate, dropout_rng, rng_impl=dropout_rng_impl)
  out = jnp.einsum('...hqk,...khd->...qhd', attended, value)
  return (out, weights) if return_weights else out


def fused_dot_product_attention(query: Array, key: Array, value: Array, *,
                                mask: Array | None = None, scale: float | None = None) -> Array:
  """Same result as `dot_product_attention` (no bias, no dropout) through
  `jax.nn.dot_product_attention(implementation='xla')`: XLA may fuse the whole computation.

  Fully masked query rows are zeroed explicitly so the contract (zeros, never NaN) holds on
  every backend. (cuDNN's fused kernel is `cudnn_dot_product_attention`.)
  """
  if mask is not None:
    lead = query.shape[:-3]
    mask = jnp.broadcast_to(mask, (*lead, query.shape[-2], query.shape[-3], key.shape[-3]))
  out = jax.nn.dot_product_attention(query, key, value, mask=mask, scale=scale,
                                     implementation='xla')
  if mask is not None:
    any_key = jnp.any(mask, axis=-1)  # [batch..., heads, q_len]
    out = jnp.where(jnp.swapaxes(any_key, -1, -2)[..., None], out, 0.0)
  return out.astype(query.dtype)


def cudnn_dot_product_attention(query: Array, key: Array, value: Array, *,
                                mask: FactoredMask | None = None,
                                scale: float | None = None) -> Array:
  """`dot_product_attention` (no bias, no dropout) by cuDNN's fused flash attention (GPU only).

  query `[batch, q_len, heads, head_dim]`, key/value `[batch, kv_len, heads, head_dim]`, in
  bfloat16 or float16. cuDNN takes a mask only as "causal" plus per-row valid lengths, so
  `mask` must be a `FactoredMask` without segment ids; anything else raises a ValueError
  rather than being approximated. Its validity vectors are read as lengths (padding at the
  end): a row whose padding is not at the end gets NaN outputs, never a wrong value. Rows
  with no valid query or no valid key give zeros, as in `dot_product_attention`.
  """
  if query.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f'cudnn_dot_product_attention: cuDNN computes in bfloat16/float16, got '
                     f'{query.dtype}; use dot_product_attention for float32')
  if mask is not None and not isinstance(mask, FactoredMask):
    raise ValueError('cudnn_dot_product_attention: cuDNN cannot take an arbitrary boolean mask '
                     'exactly; pass a FactoredMask (causal + padding)')
  mask = mask or FactoredMask()
  if mask.query_segment_ids is not None or mask.key_segment_ids is not None:
    raise ValueError('cudnn_dot_product_attention: packed sequences (segment ids) cannot be '
                     'masked through jax.nn.dot_product_attention; use the reference or '
                     'chunked attention for packed batches')
  (batch, q_len), kv_len = query.shape[:2], key.shape[1]
  if mask.causal and q_len != kv_len:
    raise ValueError(f'cudnn_dot_product_attention: causal needs q_len == kv_len, '
                     f'got {q_len} and {kv_len}')
  q_lengths, q_prefix = _valid_lengths(mask.query_valid, batch, q_len)
  kv_lengths, kv_prefix = _valid_lengths(mask.key_valid, batch, kv_len)
  padded = mask.query_valid is not None or mask.key_valid is not None
  out = jax.nn.dot_product_attention(
      query, key, value, scale=scale, is_causal=mask.causal, implementation='cudnn',
      query_seq_lengths=q_lengths if padded else None,
      key_value_seq_lengths=kv_lengths if padded else None)
  if not padded:
    return out
  row_valid = (jnp.arange(q_len)[None, :] < q_lengths[:, None]) & (kv_lengths[:, None] > 0)
  out = jnp.where(row_valid[:, :, None, None], out, jnp.zeros((), out.dtype))
  return jnp.where((q_prefix & kv_prefix)[:, None, None, None], out, jnp.nan).astype(query.dtype)


def _valid_lengths(valid: Array | None, batch: int, length: int) -> tuple[Array, Array]:
  """int32 lengths `[batch]` of boolean validity `[batch, length]`, and whether each row is
  a prefix (True ... True False ... False)."""
  if valid is None:
    return jnp.full((batch,), length, jnp.int32), jnp.ones((batch,), jnp.bool_)
  valid = jnp.broadcast_to(valid, (batch, length))
  lengths = jnp.sum(valid, axis=-1, dtype=jnp.int32)
  prefix = jnp.all(valid == (jnp.arange(length)[None, :] < lengths[:, None]), axis=-1)
  return lengths, prefix


# ----------------------------------------------------------------------------- dropout

DROPOUT_RNGS = ('hash', 'threefry')


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
    keep = hashed_bits(rng, x.shape) < jnp.uint32(min(round((1.0 - rate) * 2 ** 32), 2 ** 32 - 1))
  else:
    raise ValueError(f'dropout: rng_impl={rng_impl!r} is not one of {list(DROPOUT_RNGS)}')
  return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


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


def _mix32(x: Array) -> Array:
  """A bijective 32-bit integer hash with full avalanche ("lowbias32", C. Wellons'
  hash-prospector: xor-shift / multiply rounds)."""
  x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
  x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


# ----------------------------------------------------------------------------- masks

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


# ----------------------------------------------------------------------------- heads

def split_heads(x: Array, num_heads: int) -> Array:
  """`[..., len, d_model]` -> `[..., len, heads, d_model // heads]`."""
  d_model = x.shape[-1]
  if d_model % num_heads:
    raise ValueError(f'split_heads: d_model={d_model} is not divisible by num_heads={num_heads}')
  return x.reshape(*x.shape[:-1], num_heads, d_model // num_heads)


def merge_heads(x: Array) -> Array:
  """`[..., len, heads, head_dim]` -> `[..., len, heads * head_dim]` (inverse of `split_heads`)."""
  return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


# ----------------------------------------------------------------------------- positions

def sinusoidal_positions(length: int, d_model: int) -> Array:
  """float32 `[length, d_model]`: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same).

  Computed in float64 with NumPy, then cast: the table is a constant.
  """
  position = np.arange(length, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = position / np.power(10000.0, two_i / d_model)
  table = np.zeros((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return jnp.asarray(table, dtype=jnp.float32)


def rotary_embedding(x: Array, positions: Array, *, base: float = 10000.0) -> Array:
  """Rotary position embedding (RoFormer) of `x` `[batch, len, heads, head_dim]` at `positions` `[batch, len]`.

  Rotates pairs (x[..., i], x[..., i + head_dim/2]) by angle `position / base^(2i/head_dim)`,
  so `q . k` depends only on the distance between the positions.
  """
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1]))
  angle = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [batch, len, 1, half]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


# The memory-efficient path lives in its own module; imported last (it uses the above).
from model.chunked_attention import chunked_dot_product_attention  # noqa: E402,F401
