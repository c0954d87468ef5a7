"""Flax NNX building blocks. Modules hold parameters and call the pure functions in `attention`.

Sizes follow the paper: `d_model`, `num_heads` (h), `d_ff`, head size
`d_k = d_v = d_model / h`. Parameters are float32 `nnx.Param`s whose `axes` metadata names
their logical axes (model.partitioning); `dtype` is the compute dtype.

Dropout is drawn from an explicit key (`dropout_rng`, None = deterministic); which key each
site gets is `model.dropout.site_keys`' (the same masks whether layers are unrolled or scanned).

The KV cache is an explicit pytree, not module state: a decoding step is a pure function
(model, cache, tokens) -> (logits, cache), so the search loops carry, reorder and grow the
cache as arrays, and the module never changes inside a jitted loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from common.errors import ConfigError
from model import attention as attn, partitioning
from model.kv_cache import CrossAttentionCache, SelfAttentionCache
from model.partitioning import constrain

Array = jax.Array
Dtype = Any
Cache = SelfAttentionCache | CrossAttentionCache

# The Flax WMT example's (and T2T's): ModelConfig.layer_norm_epsilon's default.
LAYER_NORM_EPS = 1e-6
# ModelConfig.activation: the feed-forward's nonlinearity. 'gelu' is flax's default, the tanh
# approximation (transformers' 'gelu_new', GPT-2's); 'gelu_exact' the erf form (transformers'
# 'gelu', BERT's); 'silu' = swish, x * sigmoid(x) (OPUS-MT's Marian models).
# 'relu2' = relu(x)^2 (So et al. 2021, Primer; modded-nanogpt). 'swiglu' is gated (below).
ACTIVATIONS = {'relu': jax.nn.relu, 'gelu': jax.nn.gelu,
               'gelu_exact': lambda x: jax.nn.gelu(x, approximate=False), 'silu': jax.nn.silu,
               'relu2': lambda x: jnp.square(jax.nn.relu(x))}
# Gated feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"): FFN(x) =
# (act(x W) * (x V)) W_2, the gate's activation here. Three matrices instead of two: d_ff = 2/3
# of the ungated one keeps the parameter count (ModelConfig.activation's doc).
GATED_ACTIVATIONS = {'swiglu': jax.nn.silu}
NORMS = ('layer_norm', 'rms_norm')  # ModelConfig.norm

def flat_matmul(matmul: str) -> bool:
  """Resolves ModelConfig.projection_matmul: 'auto' is 'flat' on CPU when the heads are not
  split over devices (flattening a split heads axis makes XLA gather it first)."""
  if matmul == 'auto':
    return jax.default_backend() == 'cpu' and not partitioning.splits('heads')
  return matmul == 'flat'


def param(init: Callable, key: Array, shape: tuple[int, ...], axes: tuple[str | None, ...]
          ) -> nnx.Param:
  """A float32 parameter `init(key, shape)` whose dimensions have the logical names `axes`."""
  return nnx.Param(init(key, shape, jnp.float32), axes=axes)


def glorot_or_normal(std: float | None) -> Callable:
  """T2T / the Flax WMT example's Glorot uniform (None), zeros (0), else normal(std)."""
  if std is None:
    return jax.nn.initializers.xavier_uniform()
  return jax.nn.initializers.zeros if std == 0 else jax.nn.initializers.normal(std)


class Dense(nnx.Module):
  """y = x W + b contracting x's last axes `inputs` with W `[*inputs, *features]`.

  Glorot init over the flattened fan-in/out (as `nn.DenseGeneral`); `axes` name the kernel's
  dimensions, the bias takes the features' names. `matmul` (ModelConfig.projection_matmul):
  'flat' makes the product one 2-D matmul. With several output axes (the fused `[d_model, 3,
  heads, head_dim]` QKV kernel), XLA:CPU lays the kernel's gradient out transposed and every
  optimizer pass reads it with a stride; 'general' contracts the axes as they are, so a kernel
  whose heads axis is split over devices is never gathered to be flattened.
  """

  def __init__(self, inputs: int | tuple[int, ...], features: int | tuple[int, ...],
               axes: tuple[str | None, ...], *, dtype: Dtype = jnp.float32,
               init_std: float | None = None, matmul: str = 'auto', rngs: nnx.Rngs):
    self.inputs = (inputs,) if isinstance(inputs, int) else tuple(inputs)
    self.features = (features,) if isinstance(features, int) else tuple(features)
    self.dtype, self.matmul = dtype, matmul
    fan_in, fan_out = int(np.prod(self.inputs)), int(np.prod(self.features))
    init = glorot_or_normal(init_std)
    kernel = init(rngs.params(), (fan_in, fan_out), jnp.float32)
    self.kernel = nnx.Param(kernel.reshape(*self.inputs, *self.features), axes=axes)
    self.bias = nnx.Param(jnp.zeros(self.features, jnp.float32),
                          axes=axes[len(self.inputs):])

  def __call__(self, x: Array) -> Array:
    """x `[batch..., *inputs]` -> `[batch..., *features]` in `dtype`."""
    n = len(self.inputs)
    batch = x.shape[:x.ndim - n]
    kernel, bias = self.kernel[...].astype(self.dtype), self.bias[...].astype(self.dtype)
    x = x.astype(self.dtype)
    if flat_matmul(self.matmul):
      fan_in, fan_out = int(np.prod(self.inputs)), int(np.prod(self.features))
      y = jnp.dot(x.reshape(*batch, fan_in), kernel.reshape(fan_in, fan_out))
      return (y + bias.reshape(fan_out)).reshape(*batch, *self.features)
    contract = tuple(range(len(batch), x.ndim)), tuple(range(n))
    return jax.lax.dot_general(x, kernel, (contract, ((), ()))) + bias


class MultiHeadAttention(nnx.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
  head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i).

  Self-attention projects Q, K, V with one fused matmul (`qkv`); cross-attention (`cross`)
  projects Q from `x` (`query`) and K, V from the encoder output (`kv`).

  The cache of one layer's attention (`model.kv_cache`): self-attention a
  `SelfAttentionCache`, written at the decoder's `index`; cross-attention a
  `CrossAttentionCache`, the projected encoder output (`cross_cache`), only read while
  decoding.
  """

  def __init__(self, d_model: int, num_heads: int, *, cross: bool = False,
               dtype: Dtype = jnp.float32, attention_dropout_rate: float = 0.0,
               impl: str = 'reference', use_rope: bool = False, dropout_rng_impl: str = 'hash',
               init_std: float | None = None, out_init_std: float | None = None,
               matmul: str = 'auto', qk_norm: bool = False,
               norm_epsilon: float = LAYER_NORM_EPS, rngs: nnx.Rngs):
    heads = (num_heads, d_model // num_heads)
    def dense(features, axes):
      return Dense(d_model, features, ('embed', *axes), dtype=dtype, init_std=init_std,
                   matmul=matmul, rngs=rngs)
    if cross:
      self.query = dense(heads, ('heads', 'kv'))
      self.kv = dense((2, *heads), (None, 'heads', 'kv'))
    else:
      self.qkv = dense((3, *heads), (None, 'heads', 'kv'))
    self.out = Dense(heads, d_model, ('heads', 'kv', 'embed'), dtype=dtype,
                     init_std=out_init_std, matmul=matmul, rngs=rngs)
    if qk_norm:  # RMSNorm of each head's query and key, a learned [head_dim] scale each
      self.query_norm = norm_layer('rms_norm', heads[1], rngs, norm_epsilon)
      self.key_norm = norm_layer('rms_norm', heads[1], rngs, norm_epsilon)
    self.cross, self.dtype, self.impl, self.use_rope = cross, dtype, impl, use_rope
    self.qk_norm = qk_norm
    self.attention_dropout_rate, self.dropout_rng_impl = attention_dropout_rate, dropout_rng_impl
    self.keep_weights = False  # True: the last call's weights stay in `attention_weights`

  def __call__(self, x: Array, kv: Array | None = None, *, mask=None,
               positions: Array | None = None, dropout_rng: Array | None = None,
               cache: Cache | None = None, index: Array | None = None
               ) -> tuple[Array, Cache | None]:
    """x `[batch, q_len, d_model]`, kv `[batch, kv_len, d_model]` (cross-attention) ->
    (`[batch, q_len, d_model]`, this layer's cache after the call, or None without one).

    `mask`: boolean `[batch|1, 1|heads, q_len, kv_len]` or an `attention.FactoredMask`; on the
    cache (self-attention) the mask over the whole cache minus causality, which is added here
    from `index` (the cache position of this call's first token). `positions` `[batch, len]`
    feed rotary embeddings.
    """
    if self.cross:
      query = self._normed('query_norm', constrain(self.query(x), ('batch', None, 'heads', 'kv')))
      key, value = cache.keys_values() if cache is not None else self.project_kv(kv)
    else:
      qkv = constrain(self.qkv(x), ('batch', None, None, 'heads', 'kv'))
      query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
      query, key = self._normed('query_norm', query), self._normed('key_norm', key)
      if self.use_rope:
        query, key = _rotate(query, key, positions)
      if cache is not None:
        cache = cache.write(key, value, index)
        # Query i (at absolute position index + i) sees cache slots 0 .. index + i.
        query_pos = index + jnp.arange(key.shape[1])
        causal = (jnp.arange(cache.length)[None, :] <= query_pos[:, None])[None, None]
        (key, value), mask = cache.keys_values(), attn.combine_masks(mask, causal)
    out = self._attend(query, key, value, mask, dropout_rng, cache is not None)
    out = constrain(out, ('batch', None, 'heads', 'kv'))
    return self.out(out), cache

  def project_kv(self, kv: Array) -> tuple[Array, Array]:
    """The encoder output `[batch, src_len, d_model]` -> keys, values `[batch, src_len, heads,
    head_dim]`."""
    kv = constrain(self.kv(kv), ('batch', None, None, 'heads', 'kv'))
    return self._normed('key_norm', kv[:, :, 0]), kv[:, :, 1]

  def _normed(self, name: str, x: Array) -> Array:
    """`qk_norm`: `[batch, len, heads, head_dim]` RMS-normalised over head_dim (float32
    statistics), in x's dtype; x as it is without qk_norm."""
    return getattr(self, name)(x).astype(x.dtype) if self.qk_norm else x

  def cross_cache(self, encoded: Array) -> Cache:
    """The cross-attention cache: the encoder keys/values, projected once per sentence."""
    key, value = self.project_kv(encoded)
    return CrossAttentionCache.of(key.astype(self.dtype), value.astype(self.dtype))

  def _attend(self, query, key, value, mask, dropout_rng, use_cache):
    """Attention(Q, K, V) `[batch, q_len, heads, head_dim]` by the row of
    `attention.IMPLEMENTATIONS` named `impl` (or the one it hands this call to); a call the
    row cannot compute exactly is refused."""
    use_dropout = dropout_rng is not None and self.attention_dropout_rate > 0.0
    rng_impl = self.dropout_rng_impl if use_dropout else None
    row = attn.select_implementation(self.impl, use_cache=use_cache, dropout_rng_impl=rng_impl)
    problem = row.refusal(f'config.model.attention_impl={self.impl!r}', dtype=query.dtype,
                          dropout_rng_impl=rng_impl, mask=mask, head_dim=query.shape[-1])
    if problem:  # ModelConfig refuses what it can see; the masks are seen only here
      raise ConfigError(problem)
    out, weights = (row.cache_fn if use_cache else row.fn)(
        query, key, value, mask=mask, dropout_rate=self.attention_dropout_rate,
        dropout_rng=dropout_rng if use_dropout else None,
        dropout_rng_impl=self.dropout_rng_impl, deterministic=not use_dropout)
    if self.keep_weights and weights is not None:
      self.attention_weights = nnx.Intermediate(weights)
    return out


def _rotate(query, key, positions):
  if positions is None:
    positions = jnp.arange(query.shape[1])[None, :]
  return attn.rotary_embedding(query, positions), attn.rotary_embedding(key, positions)


class FeedForward(nnx.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (another of `ACTIVATIONS` optionally), or gated
  (`GATED_ACTIVATIONS`): (act(x W + b) * (x V + c)) W_2 + b_2, W and V one fused kernel
  `wi` `[d_model, 2, d_ff]` (gate first).

  `dropout_rate` drops the hidden units, the `[..., d_ff]` input of W_2, in training
  (fairseq's --activation-dropout; T5's dropout inside its gated FFN): FFN(x) =
  Dropout(max(0, x W_1 + b_1)) W_2 + b_2. Not in the paper, whose P_drop acts on each
  sub-layer's output only (model.transformer.residual)."""

  def __init__(self, d_model: int, d_ff: int, *, activation: str = 'relu',
               dtype: Dtype = jnp.float32, init_std: float | None = None,
               out_init_std: float | None = None, matmul: str = 'auto',
               dropout_rate: float = 0.0, dropout_rng_impl: str = 'hash', rngs: nnx.Rngs):
    self.activation, self.gated = activation, activation in GATED_ACTIVATIONS
    self.dropout_rate, self.dropout_rng_impl = dropout_rate, dropout_rng_impl
    inner, axes = ((2, d_ff), ('embed', None, 'mlp')) if self.gated else (d_ff, ('embed', 'mlp'))
    self.wi = Dense(d_model, inner, axes, dtype=dtype, init_std=init_std, matmul=matmul,
                    rngs=rngs)
    self.wo = Dense(d_ff, d_model, ('mlp', 'embed'), dtype=dtype, init_std=out_init_std,
                    matmul=matmul, rngs=rngs)

  def __call__(self, x: Array, dropout_rng: Array | None = None) -> Array:
    """x `[batch, len, d_model]` -> `[batch, len, d_model]`; the hidden units are dropped
    with `dropout_rng` (None: deterministic)."""
    h = self.wi(x)
    if self.gated:
      h = GATED_ACTIVATIONS[self.activation](h[..., 0, :]) * h[..., 1, :]
    else:
      h = ACTIVATIONS[self.activation](h)
    if dropout_rng is not None and self.dropout_rate > 0.0:  # else the same program as before
      h = attn.dropout(h, self.dropout_rate, dropout_rng, rng_impl=self.dropout_rng_impl)
    return self.wo(constrain(h, ('batch', None, 'mlp')))


def norm_layer(kind: str, features: int, rngs: nnx.Rngs, epsilon: float = LAYER_NORM_EPS
               ) -> nnx.LayerNorm | nnx.RMSNorm:
  """`kind` (one of NORMS) over the last axis, with float32 statistics and parameters:
  'layer_norm' (Ba et al. 2016: scale, bias), 'rms_norm' (Zhang and Sennrich 2019:
  x / sqrt(mean(x^2) + eps) * scale; no centring, no bias)."""
  cls = {'layer_norm': nnx.LayerNorm, 'rms_norm': nnx.RMSNorm}[kind]
  return cls(features, epsilon=epsilon, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)


class Embed(nnx.Module):
  """Token embedding, scaled by sqrt(d_model) (the paper, §3.4) when `scale`; `attend` gives
  logits through its transpose."""

  def __init__(self, vocab_size: int, d_model: int, *, dtype: Dtype = jnp.float32,
               init_std: float | None = None, scale: bool = True, rngs: nnx.Rngs):
    std = d_model ** -0.5 if init_std is None else init_std
    self.embedding = param(jax.nn.initializers.normal(std), rngs.params(),
                           (vocab_size, d_model), ('vocab', 'embed'))
    self.d_model, self.dtype, self.scale = d_model, dtype, scale

  def __call__(self, tokens: Array) -> Array:
    """`[batch, len]` int -> `[batch, len, d_model]`."""
    # FSDP: gather the table's 'embed' axis first; a lookup from a table split along the axis
    # that also splits the batch is one XLA:SPMD can only do by replicating its output.
    x = jnp.take(constrain(self.embedding[...], ('vocab', None)), tokens, axis=0)
    if self.scale:
      x = x * jnp.sqrt(float(self.d_model))
    return x.astype(self.dtype)

  def attend(self, x: Array) -> Array:
    """`[batch, len, d_model]` -> logits `[batch, len, vocab]` (float32)."""
    return logits_via_embedding(x, self.embedding[...].astype(x.dtype))


class AddPositions(nnx.Module):
  """Adds sinusoidal or learned absolute position encodings (nothing for 'rope')."""

  def __init__(self, encoding: str, max_len: int, d_model: int, *, rngs: nnx.Rngs):
    self.encoding, self.max_len = encoding, max_len
    if encoding == 'learned':
      self.pos_embedding = param(jax.nn.initializers.normal(0.02), rngs.params(),
                                 (max_len, d_model), (None, 'embed'))

  def __call__(self, x: Array, positions: Array | None = None) -> Array:
    """x `[batch, len, d_model]`; positions `[batch, len]` (packed rows, decoding) or 0..len-1."""
    if self.encoding == 'rope':
      return x
    if self.encoding == 'sinusoidal':
      table = attn.sinusoidal_positions(self.max_len, x.shape[-1])
    else:
      table = self.pos_embedding[...]
    pe = table[None, : x.shape[1]] if positions is None else jnp.take(table, positions, axis=0)
    return x + pe.astype(x.dtype)


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
