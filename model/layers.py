"""Linen building blocks. Modules hold parameters and call the pure functions in `attention`.

Sizes follow the paper: `d_model`, `num_heads` (h), `d_ff`, head size
`d_k = d_v = d_model / h`. Parameters are float32; `dtype` is the compute dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from common.errors import ConfigError
from model import attention as attn, partitioning
from model.partitioning import constrain, with_axes

Array = jax.Array
Dtype = Any

# T2T / the Flax WMT example initialise projections with Glorot uniform.
dense_init = nn.initializers.xavier_uniform()


def _dense(features, name, dtype, axes, axis=-1, init_std=None, matmul='auto'):
  features = (features,) if isinstance(features, int) else tuple(features)
  num_inputs = 1 if isinstance(axis, int) else len(axis)
  return Dense(features, num_inputs, dtype, init_std, matmul, axes, name=name)


def flat_matmul(matmul: str) -> bool:
  """Resolves ModelConfig.projection_matmul: 'auto' is 'flat' on CPU when the heads are not
  split over devices (flattening a split heads axis makes XLA gather it first)."""
  if matmul == 'auto':
    return jax.default_backend() == 'cpu' and not partitioning.splits('heads')
  return matmul == 'flat'


class Dense(nn.Module):
  """y = x W + b contracting the last `num_inputs` axes of x with W `[*inputs, *features]`.

  The parameters (names, shapes, Glorot init over the flattened fan-in/out) are those of
  `nn.DenseGeneral`; `axes` are the kernel's logical axis names (model.partitioning), the
  bias takes the features' names. `matmul` (ModelConfig.projection_matmul): 'flat' makes
  the product one 2-D matmul. With several output axes (the fused `[d_model, 3, heads,
  head_dim]` QKV kernel), XLA:CPU lays the kernel's gradient out transposed, and every
  optimizer pass then reads it with a stride: the Adam update of those kernels cost more
  than their matmuls in the base model's step. 'general' contracts the axes as they are,
  so a kernel whose heads axis is split over devices is never gathered to be flattened.
  """
  features: tuple[int, ...]
  num_inputs: int = 1
  dtype: Dtype = jnp.float32
  init_std: float | None = None  # kernel ~ normal(init_std); None: Glorot uniform
  matmul: str = 'auto'  # config.PROJECTION_MATMULS
  axes: tuple[str | None, ...] = ()  # the kernel's logical axis names; () = none

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x `[batch..., *inputs]` -> `[batch..., *features]` in `dtype`."""
    inputs = x.shape[x.ndim - self.num_inputs:]
    fan_in, fan_out = int(np.prod(inputs)), int(np.prod(self.features))
    init = dense_init if self.init_std is None else nn.initializers.normal(self.init_std)

    def kernel_init(rng, shape):
      return init(rng, (fan_in, fan_out)).reshape(shape)

    bias_init = nn.initializers.zeros_init()
    if self.axes:
      kernel_init = with_axes(kernel_init, self.axes)
      bias_init = with_axes(bias_init, self.axes[self.num_inputs:])
    kernel = self.param('kernel', kernel_init, (*inputs, *self.features))
    bias = self.param('bias', bias_init, self.features)
    batch = x.shape[:x.ndim - self.num_inputs]
    x, kernel, bias = x.astype(self.dtype), kernel.astype(self.dtype), bias.astype(self.dtype)
    if flat_matmul(self.matmul):
      y = jnp.dot(x.reshape(*batch, fan_in), kernel.reshape(fan_in, fan_out))
      return (y + bias.reshape(fan_out)).reshape(*batch, *self.features)
    contract = tuple(range(len(batch), x.ndim)), tuple(range(self.num_inputs))
    return jax.lax.dot_general(x, kernel, (contract, ((), ()))) + bias


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
  head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i).

  Self-attention (`kv=None`) projects Q, K, V with one fused matmul; cross-attention
  projects Q from `x` and K, V from `kv`.

  With `use_cache=True` the module keeps a KV cache in the `cache` collection:
    self-attention: `cached_key` `[batch, heads, head_dim, cache_len]`, `cached_value`
      `[batch, heads, cache_len, head_dim]` and `cache_index`; each call appends its `x` (one
      or more tokens) at `cache_index`.
    cross-attention: `cross_key` `[batch, heads, head_dim, src_len]` and `cross_value`
      `[batch, heads, src_len, head_dim]`, the projected encoder keys/values. `init` does not
      create them; the first decode call (whose cache lacks them) projects and stores them,
      later calls only read them, so a decoding loop after the first step does no projection
      and no conditional.
  The caches are heads-major (`CACHE_LAYOUTS`), keys with positions last and values with
  positions before head_dim: the operands of the batched matmuls Q K^T and weights V as
  XLA:CPU reads them for queries of 1 or a few tokens, so no step transposes a whole cache
  (the attention functions get `[batch, len, heads, head_dim]` views).
  The cache length is the length of `x` when the cache is created (init or the first
  mutable apply), as in the Flax WMT example.
  """
  num_heads: int
  dtype: Dtype = jnp.float32
  attention_dropout_rate: float = 0.0
  impl: str = 'reference'  # a row of attention.IMPLEMENTATIONS
  use_rope: bool = False
  dropout_rng_impl: str = 'hash'  # attention.DROPOUT_RNGS
  init_std: float | None = None  # Q/K/V kernels (ModelConfig.init_stds; None: Glorot)
  out_init_std: float | None = None  # the output projection W^O
  matmul: str = 'auto'  # ModelConfig.projection_matmul

  @nn.compact
  def __call__(self, x: Array, kv: Array | None = None, *, mask: Array | None = None,
               positions: Array | None = None, deterministic: bool = True,
               use_cache: bool = False) -> Array:
    """x `[batch, q_len, d_model]`, kv `[batch, kv_len, d_model]` -> `[batch, q_len, d_model]`.

    `mask` is boolean `[batch|1, 1|heads, q_len, kv_len]` or an `attention.FactoredMask`
    (what the model passes: the fast paths read its factors); in self-attention with
    `use_cache` it is the mask over the whole cache `[batch|1, 1, q_len, cache_len]` minus
    causality, which is added here from `cache_index`. `positions` `[batch, len]` feed rotary
    embeddings.
    """
    d_model = x.shape[-1]
    head_dim = d_model // self.num_heads
    heads = (self.num_heads, head_dim)

    if kv is None:
      # [batch, len, 3, heads, head_dim]
      qkv = self._dense((3, *heads), 'qkv', (None, 'heads', 'kv'))(x)
      qkv = constrain(qkv, ('batch', None, None, 'heads', 'kv'))
      query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
      if self.use_rope:
        query, key = self._rotate(query, key, positions)
      if use_cache:
        key, value, mask = self._update_self_cache(key, value, mask)
    else:
      query = constrain(self._dense(heads, 'query', ('heads', 'kv'))(x),
                        ('batch', None, 'heads', 'kv'))
      if use_cache:
        key, value = self._cross_cache(kv, heads)
      else:
        key, value = self._project_kv(kv, heads)

    out = self._attend(query, key, value, mask, deterministic, use_cache)
    out = constrain(out, ('batch', None, 'heads', 'kv'))
    return _dense(d_model, 'out', self.dtype, ('heads', 'kv', 'embed'), axis=(-2, -1),
                  init_std=self.out_init_std, matmul=self.matmul)(out)

  def _dense(self, features, name, feature_axes):
    """A projection of the model's width `d_model` ('embed') into head axes."""
    return _dense(features, name, self.dtype, ('embed', *feature_axes), init_std=self.init_std,
                  matmul=self.matmul)

  def _attend(self, query, key, value, mask, deterministic, use_cache):
    """Attention(Q, K, V) `[batch, q_len, heads, head_dim]` by the row of
    `attention.IMPLEMENTATIONS` named `impl` (or the one it hands this call to: calls on the
    KV cache, or dropout it cannot draw); a call the row cannot compute exactly is refused."""
    use_dropout = not deterministic and self.attention_dropout_rate > 0.0
    rng_impl = self.dropout_rng_impl if use_dropout else None
    row = attn.select_implementation(self.impl, use_cache=use_cache, dropout_rng_impl=rng_impl)
    problem = row.refusal(f'config.model.attention_impl={self.impl!r}', dtype=query.dtype,
                          dropout_rng_impl=rng_impl, mask=mask, head_dim=query.shape[-1])
    if problem:  # ModelConfig refuses what it can see; the masks are seen only here
      raise ConfigError(problem)
    out, weights = (row.cache_fn if use_cache else row.fn)(
        query, key, value, mask=mask, dropout_rate=self.attention_dropout_rate,
        dropout_rng=self.make_rng('dropout') if use_dropout else None,
        dropout_rng_impl=self.dropout_rng_impl, deterministic=deterministic)
    if weights is not None:
      # Stored only when the caller makes 'intermediates' mutable (attention plots).
      self.sow('intermediates', 'attention_weights', weights)
    return out

  def _project_kv(self, kv, heads):
    kv = self._dense((2, *heads), 'kv', (None, 'heads', 'kv'))(kv)
    kv = constrain(kv, ('batch', None, None, 'heads', 'kv'))
    return kv[:, :, 0], kv[:, :, 1]

  def _rotate(self, query, key, positions):
    if positions is None:
      positions = jnp.arange(query.shape[1])[None, :]
    return attn.rotary_embedding(query, positions), attn.rotary_embedding(key, positions)

  def _update_self_cache(self, key, value, mask):
    """Writes this call's keys/values at `cache_index` and returns the whole cache."""
    initializing = not self.has_variable('cache', 'cached_key')
    new = {'cached_key': key, 'cached_value': value}
    cached = {name: self.variable('cache', name, jnp.zeros, _to_cache(x, name).shape, x.dtype)
              for name, x in new.items()}
    cache_index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if initializing:
      return key, value, mask
    cache_len = cached['cached_key'].value.shape[CACHE_POSITION_AXIS['cached_key']]
    num_new = key.shape[1]
    index = cache_index.value
    for name, x in new.items():
      start = [0] * 4
      start[CACHE_POSITION_AXIS[name]] = index
      cached[name].value = jax.lax.dynamic_update_slice(cached[name].value, _to_cache(x, name),
                                                        start)
    cache_index.value = index + num_new
    # Query i (at absolute position index + i) sees cache slots 0 .. index + i.
    query_pos = index + jnp.arange(num_new)
    causal = (jnp.arange(cache_len)[None, :] <= query_pos[:, None])[None, None]
    return (_from_cache(cached['cached_key'].value, 'cached_key'),
            _from_cache(cached['cached_value'].value, 'cached_value'),
            attn.combine_masks(mask, causal))

  def _cross_cache(self, kv, heads):
    """Projects the encoder output on the first decode call and reuses it at every later one.

    Whether to project is static (does the cache hold `cross_key` yet?), so the decoding
    loop body holds no projection and no `lax.cond` copying the keys/values each step.
    """
    if self.has_variable('cache', 'cross_key'):
      return (_from_cache(self.get_variable('cache', 'cross_key'), 'cross_key'),
              _from_cache(self.get_variable('cache', 'cross_value'), 'cross_value'))
    key, value = self._project_kv(kv, heads)
    key, value = key.astype(self.dtype), value.astype(self.dtype)
    if not self.is_initializing():
      self.put_variable('cache', 'cross_key', _to_cache(key, 'cross_key'))
      self.put_variable('cache', 'cross_value', _to_cache(value, 'cross_value'))
    return key, value


# Each cache's axes, as a permutation of `[batch, len, heads, head_dim]`: keys
# `[batch, heads, head_dim, len]` and values `[batch, heads, len, head_dim]`. With values also
# positions last, weights V was ~3.5x slower per decoder step on XLA:CPU (a transposed
# batched matmul; measured at 64 rows x 4 beams, 65 positions).
CACHE_LAYOUTS = {'cached_key': (0, 2, 3, 1), 'cached_value': (0, 2, 1, 3),
                 'cross_key': (0, 2, 3, 1), 'cross_value': (0, 2, 1, 3)}
# Where each cache keeps its positions, from the end (decoding loops grow the self-attention
# caches there).
CACHE_POSITION_AXIS = {name: layout.index(1) - 4 for name, layout in CACHE_LAYOUTS.items()}


def _to_cache(x, name: str):
  """`[batch, len, heads, head_dim]` -> the layout of the cache `name` (`CACHE_LAYOUTS`)."""
  return jnp.transpose(x, CACHE_LAYOUTS[name])


def _from_cache(x, name: str):
  """The cache `name`'s layout -> a `[batch, len, heads, head_dim]` view."""
  inverse = sorted(range(4), key=CACHE_LAYOUTS[name].__getitem__)
  return jnp.transpose(x, inverse)


class Dropout(nn.Module):
  """`attention.dropout` with the module's 'dropout' RNG stream; identity when deterministic."""
  rate: float
  dropout_rng_impl: str = 'hash'  # attention.DROPOUT_RNGS

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    return attn.dropout(x, self.rate, self.make_rng('dropout'), rng_impl=self.dropout_rng_impl)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (GELU optionally)."""
  d_ff: int
  activation: str = 'relu'
  dtype: Dtype = jnp.float32
  init_std: float | None = None  # W_1 (ModelConfig.init_stds; None: Glorot)
  out_init_std: float | None = None  # W_2, which writes into the residual stream
  matmul: str = 'auto'  # ModelConfig.projection_matmul

  @nn.compact
  def __call__(self, x: Array) -> Array:
    act: Callable = {'relu': nn.relu, 'gelu': nn.gelu}[self.activation]
    h = _dense(self.d_ff, 'wi', self.dtype, ('embed', 'mlp'), init_std=self.init_std,
               matmul=self.matmul)(x)
    h = constrain(act(h), ('batch', None, 'mlp'))
    return _dense(x.shape[-1], 'wo', self.dtype, ('mlp', 'embed'), init_std=self.out_init_std,
                  matmul=self.matmul)(h)


# The Flax WMT example's (and T2T's); the exports write it into their configs (hf_export).
LAYER_NORM_EPS = 1e-6


class LayerNorm(nn.Module):
  """LayerNorm computed in float32 whatever the compute dtype, cast back."""
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    norm = nn.LayerNorm(epsilon=LAYER_NORM_EPS, dtype=jnp.float32, param_dtype=jnp.float32)
    return norm(x).astype(self.dtype)


class Embed(nn.Module):
  """Token embedding, scaled by sqrt(d_model) (the paper, §3.4) when `scale`; `attend` gives
  logits through its transpose."""
  vocab_size: int
  d_model: int
  dtype: Dtype = jnp.float32
  init_std: float | None = None  # None: d_model^-0.5 (ModelConfig.init_stds 'paper')
  scale: bool = True

  def setup(self):
    std = self.d_model ** -0.5 if self.init_std is None else self.init_std
    self.embedding = self.param('embedding', with_axes(nn.initializers.normal(stddev=std),
                                                       ('vocab', 'embed')),
                                (self.vocab_size, self.d_model), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    """`[batch, len]` int -> `[batch, len, d_model]`."""
    # FSDP: gather the table's 'embed' axis first; a lookup from a table split along the axis
    # that also splits the batch is one XLA:SPMD can only do by replicating its output.
    x = jnp.take(constrain(self.embedding, ('vocab', None)), tokens, axis=0)
    if self.scale:
      x = x * jnp.sqrt(float(self.d_model))
    return x.astype(self.dtype)

  def attend(self, x: Array) -> Array:
    """`[batch, len, d_model]` -> logits `[batch, len, vocab]` (float32)."""
    return logits_via_embedding(x, self.embedding.astype(x.dtype))


@jax.custom_vjp
def logits_via_embedding(x: Array, embedding: Array) -> Array:
  """x `[..., d_model]` @ embedding `[vocab, d_model]`^T -> float32 logits `[..., vocab]`.

  The custom gradient computes d(embedding)^T = x^T @ d(logits), `[d_model, vocab]`, and
  transposes that small result; left to itself, XLA transposes the `[tokens, vocab]` logit
  gradient instead, which on CPU costs more than the three vocabulary matmuls together.
  """
  return jnp.einsum('...d,vd->...v', x, embedding, preferred_element_type=jnp.float32)


def _logits_fwd(x, embedding):
  return logits_via_embedding(x, embedding), (x, embedding)


def _logits_bwd(residuals, grad):
  x, embedding = residuals
  grad_x = jnp.einsum('...v,vd->...d', grad.astype(x.dtype), embedding)
  flat_x = x.reshape(-1, x.shape[-1])
  flat_grad = grad.reshape(-1, grad.shape[-1]).astype(x.dtype)
  grad_embedding_t = jnp.einsum('nd,nv->dv', flat_x, flat_grad,
                                preferred_element_type=jnp.float32)
  # The barrier keeps XLA from folding the transpose back into the (large) operand.
  grad_embedding = jax.lax.optimization_barrier(grad_embedding_t).T.astype(embedding.dtype)
  return grad_x, grad_embedding


logits_via_embedding.defvjp(_logits_fwd, _logits_bwd)


class AddPositions(nn.Module):
  """Adds sinusoidal or learned absolute position encodings (nothing for 'rope')."""
  encoding: str  # config.model.positional_encoding: 'sinusoidal' | 'learned' | 'rope'
  max_len: int  # positions of the table (config.model.max_len)

  @nn.compact
  def __call__(self, x: Array, positions: Array | None = None) -> Array:
    """x `[batch, len, d_model]`; positions `[batch, len]` (packed rows, decoding) or 0..len-1."""
    if self.encoding == 'rope':
      return x
    d_model = x.shape[-1]
    if self.encoding == 'sinusoidal':
      table = attn.sinusoidal_positions(self.max_len, d_model)
    else:
      table = self.param('pos_embedding', with_axes(nn.initializers.normal(stddev=0.02),
                                                    (None, 'embed')),
                         (self.max_len, d_model), jnp.float32)
    if positions is None:
      pe = table[None, : x.shape[1]]
    else:
      pe = jnp.take(table, positions, axis=0)
    return x + pe.astype(x.dtype)
