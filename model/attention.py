"""Scaled dot-product attention and its masks, as pure functions (no Flax, no state), and
`IMPLEMENTATIONS`: the table of the ways to compute it (`config.model.attention_impl`).

Layout: arrays are `[batch..., length, heads, head_dim]`. Masks are boolean,
`True` = may attend, broadcastable to `[batch..., heads, q_len, kv_len]`.

The paper's equation (1):  Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.

The masks (`model.masks`), dropout (`model.dropout`) and the memory-efficient path
(`model.chunked_attention`) live in modules of their own; their public names are here too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from model.chunked_attention import chunked_dot_product_attention
from model.dropout import DROPOUT_RNGS, dropout, hashed_bits
from model.masks import (
  FactoredMask,
  causal_mask,
  combine_masks,
  dense_mask,
  padding_mask,
  segment_mask,
)

__all__ = [
    'dot_product_attention_weights', 'dot_product_attention', 'fused_dot_product_attention',
    'cudnn_dot_product_attention', 'chunked_dot_product_attention',
    'heads_major_dot_product_attention', 'causal_mask', 'padding_mask', 'segment_mask',
    'combine_masks', 'FactoredMask', 'dense_mask', 'DROPOUT_RNGS', 'dropout', 'hashed_bits',
    'split_heads', 'merge_heads', 'sinusoidal_positions', 'rotary_embedding', 'AttentionImpl',
    'IMPLEMENTATIONS', 'select_implementation',
]

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


def _weights_dropout(weights, rate, rng, rng_impl, deterministic):
  """The attention weights as the values see them: dropped out when training asks for it."""
  if deterministic or rate <= 0.0:
    return weights
  if rng is None:
    raise ValueError('dot_product_attention: dropout_rate > 0 needs a dropout_rng')
  return dropout(weights, rate, rng, rng_impl=rng_impl)


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
  attended = _weights_dropout(weights, dropout_rate, dropout_rng, dropout_rng_impl,
                              deterministic)
  out = jnp.einsum('...hqk,...khd->...qhd', attended, value)
  return (out, weights) if return_weights else out


def heads_major_dot_product_attention(query: Array, key: Array, value: Array, *,
                                      mask: Array | None = None, bias: Array | None = None,
                                      scale: float | None = None, dropout_rate: float = 0.0,
                                      dropout_rng: Array | None = None,
                                      dropout_rng_impl: str = 'hash', deterministic: bool = True):
  """`dot_product_attention(..., return_weights=True)` computed with (batch, heads) as its
  batch dimensions; query `[batch, q_len, heads, head_dim]`, key/value `[batch, kv_len, heads,
  head_dim]`, mask and bias `[batch|1, heads|1, q_len, kv_len]`.

  For decoding: the KV caches are heads-major (`key`/`value` are transposed views of them),
  and a query of a few tokens makes each head's products tiny. Q K^T gets `[batch, heads,
  len, 1, head_dim]` operands (one "head" per batch entry) and weights V plain `[batch, heads,
  ...]` ones: XLA then emits batched matmuls on the caches as they are (with the `[batch, len,
  heads, ...]` views, transposed matrix-vector-like products ~3x slower per decoder step;
  a size-1 axis in weights V made it copy the values cache at every step, ~10x). The same
  products and sums: the weights are equal, the output equal to float rounding (a matmul may
  add in another order).
  """
  def as_batch(x):  # [b, len, h, d] -> [b, h, len, 1, d]
    return jnp.swapaxes(x, 1, 2)[:, :, :, None]

  def as_heads(x):  # [b|1, h|1, q, k] -> [b|1, h|1, 1, q, k]
    return None if x is None else jnp.asarray(x)[:, :, None]

  weights = dot_product_attention_weights(as_batch(query), as_batch(key), mask=as_heads(mask),
                                          bias=as_heads(bias), scale=scale)[:, :, 0]
  attended = _weights_dropout(weights, dropout_rate, dropout_rng, dropout_rng_impl,
                              deterministic)
  out = jnp.einsum('bhqk,bhkd->bhqd', attended, jnp.swapaxes(value, 1, 2))
  return jnp.swapaxes(out, 1, 2), weights


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
  `mask` must be a `FactoredMask` without segment ids; anything else (see the 'cudnn' row of
  `IMPLEMENTATIONS`) raises a ValueError rather than being approximated. Its validity vectors
  are read as lengths (padding at the end): a row whose padding is not at the end gets NaN
  outputs, never a wrong value. Rows with no valid query or no valid key give zeros, as in
  `dot_product_attention`.
  """
  problem = IMPLEMENTATIONS['cudnn'].refusal('cudnn_dot_product_attention', dtype=query.dtype,
                                              mask=mask, head_dim=query.shape[-1])
  if problem:
    raise ValueError(problem)
  mask = mask or FactoredMask()
  (batch, q_len), kv_len = query.shape[:2], key.shape[1]
  if mask.causal and q_len != kv_len:
    raise ValueError(f'cudnn_dot_product_attention: causal needs q_len == kv_len, '
                     f'got {q_len} and {kv_len}')
  q_lengths, q_prefix = _valid_lengths(mask.query_valid, batch, q_len)
  kv_lengths, kv_prefix = _valid_lengths(mask.key_valid, batch, kv_len)
  # cuDNN's backward pass needs even lengths (JAX checks it for any call it differentiates):
  # an odd length gets one more position, outside the valid lengths, cut off afterwards.
  odd = q_len % 2 or kv_len % 2
  padded = odd or mask.query_valid is not None or mask.key_valid is not None
  out = jax.nn.dot_product_attention(
      _to_even(query), _to_even(key), _to_even(value), scale=scale, is_causal=mask.causal,
      implementation='cudnn', query_seq_lengths=_at_least_one(q_lengths) if padded else None,
      key_value_seq_lengths=_at_least_one(kv_lengths) if padded else None)[:, :q_len]
  if not padded:
    return out
  row_valid = (jnp.arange(q_len)[None, :] < q_lengths[:, None]) & (kv_lengths[:, None] > 0)
  out = jnp.where(row_valid[:, :, None, None], out, jnp.zeros((), out.dtype))
  return jnp.where((q_prefix & kv_prefix)[:, None, None, None], out, jnp.nan).astype(query.dtype)


def _at_least_one(lengths: Array) -> Array:
  """A length of 0 as 1, its outputs zeroed afterwards: for a sequence with no valid key cuDNN
  gave nonzero key and value gradients on an H200, where a zero cotangent through a length of
  1 gives exact zeros."""
  return jnp.maximum(lengths, 1)


def _to_even(x: Array) -> Array:
  """`[batch, len, heads, dim]` with one zero position appended when `len` is odd."""
  return jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)))


def _valid_lengths(valid: Array | None, batch: int, length: int) -> tuple[Array, Array]:
  """int32 lengths `[batch]` of boolean validity `[batch, length]`, and whether each row is
  a prefix (True ... True False ... False)."""
  if valid is None:
    return jnp.full((batch,), length, jnp.int32), jnp.ones((batch,), jnp.bool_)
  valid = jnp.broadcast_to(valid, (batch, length))
  lengths = jnp.sum(valid, axis=-1, dtype=jnp.int32)
  prefix = jnp.all(valid == (jnp.arange(length)[None, :] < lengths[:, None]), axis=-1)
  return lengths, prefix


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
  """Rotary position embedding (RoFormer) of `x` `[batch, len, heads, head_dim]` at
  `positions` `[batch, len]`.

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


# ----------------------------------------------------------------------------- implementations

@dataclasses.dataclass(frozen=True)
class AttentionImpl:
  """One row of `IMPLEMENTATIONS`: an attention function and what it computes exactly.

  `fn(query, key, value, *, mask, dropout_rate, dropout_rng, dropout_rng_impl,
  deterministic)` -> (out `[batch, q_len, heads, v_head_dim]`, weights `[batch, heads, q_len,
  kv_len]` or None); `mask` is a boolean array, a `FactoredMask` or None. `cache_fn` (same
  call) serves calls on the KV cache (`use_cache=True`: decoding steps, a few queries). What
  a row cannot compute is refused by `refusal` (one message per constraint, for the config,
  the layer and a direct call alike), never approximated; `fallback` names the row that takes
  calls with attention dropout this one cannot draw, and a row without `cache_fn` hands calls
  on the cache to the reference row (nothing quadratic there, and beam search's masks are not
  causal + lengths).
  """
  fn: Callable
  cache_fn: Callable | None = None
  dtypes: tuple[str, ...] = ()  # compute dtypes it takes; () = any
  dropout_rngs: tuple[str, ...] | None = None  # dropout bits it draws (DROPOUT_RNGS); None = any
  fallback: str | None = None  # the row for the dropout it cannot draw; None: refused
  dense_masks: bool = True  # any boolean mask array (False: `FactoredMask`s only)
  packed: bool = True  # masks with segment ids (packed sequences)
  head_dim_multiple: int = 1
  max_head_dim: int | None = None
  backends: tuple[str, ...] = ()  # `jax.default_backend()` names it runs on; () = any

  def draws(self, dropout_rng_impl: str) -> bool:
    return self.dropout_rngs is None or dropout_rng_impl in self.dropout_rngs

  def refusal(self, subject: str, *, dtype=None, dropout_rng_impl: str | None = None,
              mask=None, head_dim: int | None = None, backend: str | None = None) -> str | None:
    """Why this row cannot compute a call (or a config) with these facts, or None. `subject`
    starts the message (e.g. "config.model.attention_impl='cudnn'"); a fact left None is not
    checked. `dropout_rng_impl`: the bit generator of attention dropout, None without it."""
    dtype = None if dtype is None else jnp.dtype(dtype).name
    if self.dtypes and dtype is not None and dtype not in self.dtypes:
      return (f'{subject} computes in {" or ".join(self.dtypes)} only, got {dtype}: use '
              f"config.model.dtype='{self.dtypes[0]}' or another attention_impl")
    if (dropout_rng_impl is not None and not self.draws(dropout_rng_impl)
        and self.fallback is None):
      if not self.dropout_rngs:
        return (f'{subject} cannot apply attention dropout exactly: set config.model.'
                f'attention_dropout_rate=0 or use attention_impl={_able("dropout_rngs")}')
      return (f'{subject} draws attention dropout bits with {" or ".join(self.dropout_rngs)} '
              f"only: set config.model.dropout_rng_impl='{self.dropout_rngs[0]}' (got "
              f'{dropout_rng_impl!r}) or attention_dropout_rate=0')
    if mask is not None and not self.dense_masks and not isinstance(mask, FactoredMask):
      return (f'{subject} cannot take an arbitrary boolean mask exactly; it needs a '
              f'FactoredMask (causal + padding)')
    if isinstance(mask, FactoredMask) and mask.packed and not self.packed:
      return (f'{subject} cannot mask packed batches (segment ids) exactly: set '
              f'config.data.packing=False or use attention_impl={_able("packed")}')
    if head_dim is not None and (head_dim % self.head_dim_multiple
                                 or head_dim > (self.max_head_dim or head_dim)):
      most = f' and at most {self.max_head_dim}' if self.max_head_dim else ''
      return (f'{subject} needs a head size (d_model/num_heads) that is a multiple of '
              f'{self.head_dim_multiple}{most}, got {head_dim}')
    if self.backends and backend is not None and backend not in self.backends:
      return f'{subject} runs on {" or ".join(self.backends)} only, not {backend}'
    return None


def _reference(query, key, value, *, mask, heads_major=False, **kwargs):
  mask = dense_mask(mask, query.shape[-3], key.shape[-3])
  if heads_major:
    return heads_major_dot_product_attention(query, key, value, mask=mask, **kwargs)
  return dot_product_attention(query, key, value, mask=mask, return_weights=True, **kwargs)


def _xla(query, key, value, *, mask, **unused):
  del unused  # no dropout: `fallback` takes calls with dropout
  mask = dense_mask(mask, query.shape[-3], key.shape[-3])
  return fused_dot_product_attention(query, key, value, mask=mask), None


def _cudnn(query, key, value, *, mask, **unused):
  del unused  # no dropout: refused
  return cudnn_dot_product_attention(query, key, value, mask=mask), None


def _chunked(query, key, value, *, mask, dropout_rate, dropout_rng, deterministic, **unused):
  del unused  # dropout_rng_impl: the row draws 'hash' bits only
  return chunked_dot_product_attention(query, key, value, mask=mask, dropout_rate=dropout_rate,
                                       dropout_rng=dropout_rng, deterministic=deterministic), None


# A new variant is one row here plus its function (and a test equal to the reference).
IMPLEMENTATIONS: dict[str, AttentionImpl] = {
    # `dot_product_attention`; the only row that returns the weights (attention plots).
    'reference': AttentionImpl(_reference, cache_fn=functools.partial(_reference,
                                                                     heads_major=True)),
    # jax.nn.dot_product_attention(implementation='xla'): XLA may fuse it.
    'xla': AttentionImpl(_xla, cache_fn=_xla, dropout_rngs=(), fallback='reference'),
    # cuDNN's fused flash attention: causal + padding masks as lengths only.
    'cudnn': AttentionImpl(_cudnn, dtypes=('bfloat16', 'float16'), dropout_rngs=(),
                           dense_masks=False, packed=False, head_dim_multiple=8,
                           max_head_dim=128, backends=('gpu',)),  # (256 on Hopper)
    # `chunked_dot_product_attention`: online softmax over key blocks, O(len x block) memory.
    'chunked': AttentionImpl(_chunked, dropout_rngs=('hash',)),
}


def _able(constraint: str) -> str:
  """The rows that meet `constraint` (a field that is truthy or None), for a message."""
  return ' or '.join(repr(name) for name, row in IMPLEMENTATIONS.items()
                     if getattr(row, constraint) is None or getattr(row, constraint))


def select_implementation(name: str, *, use_cache: bool = False,
                          dropout_rng_impl: str | None = None) -> AttentionImpl:
  """The row that computes a call to `name`'s attention: its own, or the one it hands the call
  to (calls on the KV cache without `cache_fn`; dropout it cannot draw, with a `fallback`)."""
  row = IMPLEMENTATIONS[name]
  if use_cache and row.cache_fn is None:
    return IMPLEMENTATIONS['reference']
  if dropout_rng_impl is not None and not row.draws(dropout_rng_impl) and row.fallback:
    return IMPLEMENTATIONS[row.fallback]
  return row
