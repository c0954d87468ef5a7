"""Memory-efficient attention: `dot_product_attention` computed one block of keys at a time.

softmax(Q K^T * scale + bias) V over keys split into blocks of `block_size`, with an online
softmax (Milakov & Gimelshein 2018; Rabe & Staats 2021; FlashAttention, Dao et al. 2022):
per query row a running maximum `m`, normaliser `l` and unnormalised output `acc`, rescaled
by exp(m_old - m_new) whenever a block raises the maximum. The backward pass recomputes each
block's weights from the saved log-sum-exp (a custom VJP), so neither pass holds more than
`[batch, heads, q_len, block_size]` of logits: memory O(length x block), not O(length^2).

Same semantics as `attention.dot_product_attention`: float32 logits and softmax statistics,
masked logits set to the float32 minimum, rows with every key masked give zeros (and zero
gradients), and attention dropout keeps exactly the reference's elements: the 'hash' bits are
a function of each weight's (batch, head, query, key) index, computed here block by block.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from model.dropout import hashed_bits_block, keep_threshold
from model.masks import FactoredMask, combine_masks

Array = jax.Array
_MIN = float(jnp.finfo(jnp.float32).min)


class _Static(NamedTuple):
  scale: float
  dropout_rate: float  # 0.0 when deterministic
  block: int
  kv_len: int  # keys before padding to a whole number of blocks
  weights_shape: tuple[int, ...]  # [batch..., heads, q_len, kv_len]: the dropout bits' index


def chunked_dot_product_attention(query: Array, key: Array, value: Array, *,
                                  mask: Array | FactoredMask | None = None,
                                  bias: Array | None = None, scale: float | None = None,
                                  dropout_rate: float = 0.0, dropout_rng: Array | None = None,
                                  deterministic: bool = True, block_size: int = 512) -> Array:
  """`dot_product_attention`'s result with O(q_len x block_size) memory, not O(q_len x kv_len).

  Args:
    query `[batch..., q_len, heads, head_dim]`, key `[batch..., kv_len, heads, head_dim]`,
    value `[batch..., kv_len, heads, v_head_dim]` (query, key and value carry the full
    batch shape); mask (boolean array, or an `attention.FactoredMask` whose blocks are built
    on the fly), bias, scale, dropout: as in `attention.dot_product_attention` (dropout
    uses the 'hash' bits, identical to the reference's).
    block_size: keys per block (the last block is padded with masked keys).
  Returns:
    `[batch..., q_len, heads, v_head_dim]` in the query's dtype.
  """
  scale = query.shape[-1] ** -0.5 if scale is None else scale
  rate = 0.0 if deterministic else float(dropout_rate)
  if rate > 0.0 and dropout_rng is None:
    raise ValueError('chunked_dot_product_attention: dropout_rate > 0 needs a dropout_rng')
  kv_len = key.shape[-3]
  block = min(block_size, kv_len)
  padded_len = -(-kv_len // block) * block
  weights_shape = (*query.shape[:-3], query.shape[-2], query.shape[-3], kv_len)
  static = _Static(float(scale), rate, block, kv_len, weights_shape)
  key, value = (_pad_axis(x, x.ndim - 3, padded_len, 0) for x in (key, value))
  if isinstance(mask, FactoredMask):
    mask = FactoredMask(mask.causal, mask.query_valid,
                        _pad_axis(mask.key_valid, -1, padded_len, False),
                        mask.query_segment_ids,
                        _pad_axis(mask.key_segment_ids, -1, padded_len, -1))
  else:
    mask = _pad_axis(_full_rank(mask, query.ndim), -1, padded_len, False)
  bias = _pad_axis(_full_rank(bias, query.ndim), -1, padded_len, 0)
  return _attention(static, query, key, value, bias, mask, dropout_rng)


def _full_rank(x, ndim):
  return None if x is None else jnp.reshape(x, (1,) * (ndim - x.ndim) + x.shape)


def _pad_axis(x, axis, length, fill):
  """x padded with `fill` to `length` along `axis` (axes of size 1 broadcast: left alone)."""
  if x is None or x.shape[axis] in (1, length):
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, widths, constant_values=fill)


def _key_block(x, start, size):
  """`x[..., start:start + size]`, or `x` when its last axis broadcasts (size 1)."""
  return x if x.shape[-1] == 1 else jax.lax.dynamic_slice_in_dim(x, start, size, axis=-1)


def _block_logits(st: _Static, scaled_query, key, bias, mask, i):
  """Logits `[batch..., heads, q_len, block]` (float32) of key block `i` and its mask (or None)."""
  start = i * st.block
  key_block = jax.lax.dynamic_slice_in_dim(key, start, st.block, axis=key.ndim - 3)
  logits = jnp.einsum('...qhd,...khd->...hqk', scaled_query, key_block,
                      preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + _key_block(bias, start, st.block).astype(jnp.float32)
  q_len = scaled_query.shape[-3]
  if isinstance(mask, FactoredMask):
    allowed = mask.dense(q_len, st.block, start)
  else:
    allowed = None if mask is None else _key_block(mask, start, st.block)
  if st.kv_len % st.block:  # the padding keys of the last block
    allowed = combine_masks(allowed, start + jnp.arange(st.block) < st.kv_len)
  if allowed is not None:
    logits = jnp.where(allowed, logits, _MIN)
  return logits, allowed


def _dropout_scale(st: _Static, rng, i):
  """Inverted-dropout factors of block `i`, `[batch..., heads, q_len, block]`: 0 or 1/(1-rate),
  from the same bits as `attention.dropout(weights, rate, rng, rng_impl='hash')`."""
  bits = hashed_bits_block(rng, st.weights_shape, i * st.block, st.block)
  keep = bits < keep_threshold(st.dropout_rate)
  return jnp.where(keep, jnp.float32(1.0 / (1.0 - st.dropout_rate)), jnp.float32(0.0))


def _rows(x):
  """Per-row statistics `[batch..., heads, q_len]` -> broadcastable to
  `[batch..., q_len, heads, 1]`."""
  return jnp.swapaxes(x, -1, -2)[..., None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(st: _Static, query, key, value, bias, mask, rng):
  return _forward(st, query, key, value, bias, mask, rng)[0]


def _forward(st: _Static, query, key, value, bias, mask, rng):
  """The online softmax over key blocks: (output, log-sum-exp, rows with a visible key)."""
  scaled_query = query * jnp.asarray(st.scale, query.dtype)
  stats_shape = st.weights_shape[:-1]  # [batch..., heads, q_len]

  def step(carry, i):
    top, norm, acc, seen = carry
    logits, allowed = _block_logits(st, scaled_query, key, bias, mask, i)
    new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
    rescale = jnp.exp(top - new_top)
    p = jnp.exp(logits - new_top[..., None])
    norm = norm * rescale + jnp.sum(p, axis=-1)
    if st.dropout_rate > 0.0:
      p = p * _dropout_scale(st, rng, i)
    value_block = jax.lax.dynamic_slice_in_dim(value, i * st.block, st.block, value.ndim - 3)
    acc = acc * _rows(rescale) + jnp.einsum('...hqk,...khd->...qhd', p.astype(value.dtype),
                                            value_block, preferred_element_type=jnp.float32)
    if allowed is not None:
      seen = seen | jnp.any(jnp.broadcast_to(allowed, logits.shape), axis=-1)
    return (new_top, norm, acc, seen), None

  init = (jnp.full(stats_shape, _MIN, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
          jnp.zeros((*query.shape[:-1], value.shape[-1]), jnp.float32),
          jnp.zeros(stats_shape, jnp.bool_) if _may_mask(st, mask)
          else jnp.ones(stats_shape, jnp.bool_))
  num_blocks = key.shape[-3] // st.block
  (top, norm, acc, seen), _ = jax.lax.scan(step, init, jnp.arange(num_blocks))
  out = jnp.where(_rows(seen), acc / _rows(norm), 0.0).astype(query.dtype)
  return out, (top + jnp.log(norm), seen)


def _may_mask(st, mask):
  return mask is not None or st.kv_len % st.block != 0


def _attention_fwd(st, query, key, value, bias, mask, rng):
  out, (lse, seen) = _forward(st, query, key, value, bias, mask, rng)
  return out, (query, key, value, bias, mask, rng, out, lse, seen)


def _attention_bwd(st, residuals, grad_out):
  """FlashAttention's backward, block by block: recompute P = exp(logits - lse), then
  dV = P'^T dO, dP' = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = dS K, dK = dS^T Q
  (P' = P with dropout applied; dP = dP' with the same dropout factors)."""
  query, key, value, bias, mask, rng, out, lse, seen = residuals
  scaled_query = query * jnp.asarray(st.scale, query.dtype)
  delta = jnp.einsum('...qhd,...qhd->...hq', grad_out.astype(jnp.float32),
                     out.astype(jnp.float32))

  def step(grad_query, i):
    logits, _ = _block_logits(st, scaled_query, key, bias, mask, i)
    p = jnp.where(seen[..., None], jnp.exp(logits - lse[..., None]), 0.0)
    value_block = jax.lax.dynamic_slice_in_dim(value, i * st.block, st.block, value.ndim - 3)
    grad_p = jnp.einsum('...qhd,...khd->...hqk', grad_out, value_block,
                        preferred_element_type=jnp.float32)
    dropped = p
    if st.dropout_rate > 0.0:
      factors = _dropout_scale(st, rng, i)
      dropped, grad_p = p * factors, grad_p * factors
    grad_value = jnp.einsum('...hqk,...qhd->...khd', dropped.astype(grad_out.dtype), grad_out,
                            preferred_element_type=jnp.float32)
    grad_logits = p * (grad_p - delta[..., None])
    key_block = jax.lax.dynamic_slice_in_dim(key, i * st.block, st.block, key.ndim - 3)
    grad_query = grad_query + jnp.einsum('...hqk,...khd->...qhd', grad_logits.astype(key.dtype),
                                         key_block, preferred_element_type=jnp.float32)
    grad_key = jnp.einsum('...hqk,...qhd->...khd', grad_logits.astype(query.dtype),
                          scaled_query, preferred_element_type=jnp.float32)
    grad_bias = None if bias is None else _sum_to(grad_logits, _key_block(bias, 0, st.block).shape)
    return grad_query, (grad_key, grad_value, grad_bias)

  num_blocks = key.shape[-3] // st.block
  grad_query, (grad_key, grad_value, grad_bias) = jax.lax.scan(
      step, jnp.zeros(query.shape, jnp.float32), jnp.arange(num_blocks))
  grad_query = (grad_query * st.scale).astype(query.dtype)
  grad_key, grad_value = (_unblock(g, key.ndim - 3).astype(x.dtype)
                          for g, x in ((grad_key, key), (grad_value, value)))
  if bias is not None:
    grad_bias = (jnp.sum(grad_bias, axis=0) if bias.shape[-1] == 1
                 else _unblock(grad_bias, bias.ndim - 1)).astype(bias.dtype)
  return grad_query, grad_key, grad_value, grad_bias, None, None


def _sum_to(x, shape):
  """Sums `x` over the axes where `shape` (same rank) is 1: the gradient of a broadcast."""
  axes = tuple(a for a, (n, m) in enumerate(zip(x.shape, shape, strict=True)) if m == 1 and n != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _unblock(x, axis):
  """Per-block results `[blocks, ..., block, ...]` (block on `axis` of each) -> one axis."""
  x = jnp.moveaxis(x, 0, axis)
  return x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2:])


_attention.defvjp(_attention_fwd, _attention_bwd)
