"""The Transformer (Vaswani et al. 2017, Figure 1) as Flax NNX modules.

  EncoderDecoder  inputs, targets -> logits      (translation; the paper's model)
  DecoderOnly     tokens -> logits               (language model)
  EncoderOnly     tokens -> [batch, len, d_model] (bidirectional encoder)

Token id 0 is padding (masked as keys, ignored by the loss) and the decoder's start
token: targets are shifted right inside the model, so `logits[:, t]` predicts
`targets[:, t]` from `targets[:, :t]`. Packed rows carry `*_segmentation` (1, 2, ...
per example, 0 = pad) and `*_position` (restarting at 0 per example); attention never
crosses segments and the shift restarts at each segment.

A stack's `layers`: model.stacks (an `nnx.List`, or one scanned module with `scan_layers`).
The KV cache is a `model.kv_cache.KVCache` (`Decoder.init_cache`): the index and, per layer,
its attentions' caches by module name; `step` returns the cache it wrote (decoding runs
unrolled: one cache per layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from model import attention as attn
from model.dropout import STACK_SITES, site_keys
from model.kv_cache import KVCache, SelfAttentionCache
from model.layers import (
  AddPositions,
  Dense,
  Embed,
  FeedForward,
  MultiHeadAttention,
  norm_layer,
)
from model.partitioning import constrain
from model.stacks import make_layers, run_layers

if TYPE_CHECKING:
  from model.config import ModelConfig

Array = jax.Array
RESIDUAL_AXES = ('batch', None, None)  # the residual stream [batch, len, d_model] between layers


def shift_right(tokens: Array, segment_ids: Array | None = None) -> Array:
  """`[batch, len]` -> the decoder input: 0 then tokens[:, :-1], restarting at each segment
  (`segment_ids` `[batch, len]`)."""
  shifted = jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]
  if segment_ids is not None:
    segment_start = segment_ids != jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segment_start, 0, shifted)
  return shifted


def residual(config: ModelConfig, norm: nnx.Module, x: Array, fn, dropout_rng) -> Array:
  """LayerNorm(x + Dropout(fn(x))) ('post', the paper) or x + Dropout(fn(LayerNorm(x))) ('pre')."""
  if config.norm_position == 'post':  # the norm's output is the stream
    return norm(x + _dropout(config, fn(x), dropout_rng)).astype(config.residual_stream_dtype)
  return x + _dropout(config, fn(norm(x).astype(config.compute_dtype)), dropout_rng)


def _norm(config: ModelConfig, rngs: nnx.Rngs) -> nnx.LayerNorm | nnx.RMSNorm:
  return norm_layer(config.norm, config.d_model, rngs, config.layer_norm_epsilon)


def _dropout(config: ModelConfig, x: Array, rng: Array | None) -> Array:
  """P_drop dropout with `rng` (None: none)."""
  if rng is None or config.dropout_rate == 0.0:
    return x
  return attn.dropout(x, config.dropout_rate, rng, rng_impl=config.dropout_rng_impl)


def _attention(config: ModelConfig, num_layers: int, rngs: nnx.Rngs, *, cross: bool = False):
  """One attention sub-layer of a stack of `num_layers` (for the init scheme's stds)."""
  stds = config.init_stds(num_layers)
  return MultiHeadAttention(
      config.d_model, config.num_heads, cross=cross, dtype=config.compute_dtype,
      attention_dropout_rate=config.attention_dropout_rate, impl=config.attention_impl,
      use_rope=config.positional_encoding == 'rope' and not cross,
      dropout_rng_impl=config.dropout_rng_impl, init_std=stds.kernel,
      out_init_std=stds.residual, matmul=config.projection_matmul, qk_norm=config.qk_norm,
      norm_epsilon=config.layer_norm_epsilon, rngs=rngs)


def _ffn(config: ModelConfig, num_layers: int, rngs: nnx.Rngs) -> FeedForward:
  stds = config.init_stds(num_layers)
  return FeedForward(config.d_model, config.d_ff, activation=config.activation,
                     dtype=config.compute_dtype, init_std=stds.kernel,
                     out_init_std=stds.residual, matmul=config.projection_matmul,
                     dropout_rate=config.activation_dropout_rate,
                     dropout_rng_impl=config.dropout_rng_impl, rngs=rngs)


class EncoderLayer(nnx.Module):
  """Self-attention then feed-forward, each inside `residual`."""
  # Dropout keys; a new site goes last, so that the others keep their keys (and masks).
  SITES = ('self_attention', 'self_attention_residual', 'ffn_residual', 'ffn_activation')

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    n = config.num_encoder_layers
    self.config = config
    self.self_attention = _attention(config, n, rngs)
    self.self_attention_norm = _norm(config, rngs)
    self.ffn = _ffn(config, n, rngs)
    self.ffn_norm = _norm(config, rngs)

  def __call__(self, x: Array, mask: attn.FactoredMask, positions: Array | None,
               dropout_rng: Array | None = None) -> Array:
    keys = site_keys(dropout_rng, self.SITES)

    def attend(h):
      return self.self_attention(h, mask=mask, positions=positions,
                                 dropout_rng=keys['self_attention'])[0]
    x = residual(self.config, self.self_attention_norm, x, attend,
                 keys['self_attention_residual'])
    x = residual(self.config, self.ffn_norm, x, lambda h: self.ffn(h, keys['ffn_activation']),
                 keys['ffn_residual'])
    return constrain(x, RESIDUAL_AXES)


class DecoderLayer(nnx.Module):
  """Masked self-attention, encoder-decoder attention (`cross`; not in an LM), feed-forward."""
  SITES = ('self_attention', 'self_attention_residual', 'cross_attention',
           'cross_attention_residual', 'ffn_residual', 'ffn_activation')  # as EncoderLayer's

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, cross: bool):
    n = config.num_decoder_layers
    self.config = config
    self.self_attention = _attention(config, n, rngs)
    self.self_attention_norm = _norm(config, rngs)
    if cross:
      self.cross_attention = _attention(config, n, rngs, cross=True)
      self.cross_attention_norm = _norm(config, rngs)
    self.ffn = _ffn(config, n, rngs)
    self.ffn_norm = _norm(config, rngs)
    self.cross = cross

  def __call__(self, x: Array, encoded: Array | None, self_mask, cross_mask,
               positions: Array | None, dropout_rng: Array | None = None,
               cache: dict | None = None, index: Array | None = None
               ) -> tuple[Array, dict | None]:
    """-> (x, this layer's cache after the call: None without `cache`)."""
    cfg, new_cache = self.config, {} if cache is not None else None
    keys = site_keys(dropout_rng, self.SITES)

    def attend(name, h, kv, mask):
      out, layer_cache = getattr(self, name)(
          h, kv, mask=mask, positions=positions, dropout_rng=keys[name],
          cache=None if cache is None else cache[name], index=index)
      if cache is not None:
        new_cache[name] = layer_cache
      return out
    x = residual(cfg, self.self_attention_norm, x,
                 lambda h: attend('self_attention', h, None, self_mask),
                 keys['self_attention_residual'])
    if self.cross:
      x = residual(cfg, self.cross_attention_norm, x,
                   lambda h: attend('cross_attention', h, encoded, cross_mask),
                   keys['cross_attention_residual'])
    x = residual(cfg, self.ffn_norm, x, lambda h: self.ffn(h, keys['ffn_activation']),
                 keys['ffn_residual'])
    return constrain(x, RESIDUAL_AXES), new_cache


def _input(stack, embed: Embed, tokens: Array, positions: Array | None) -> Array:
  """Token embeddings + positions `[batch, len, d_model]` (LayerNormed: `embedding_norm`)."""
  x = stack.positions(embed(tokens), positions)
  if stack.config.embedding_norm:
    x = stack.embedding_norm(x).astype(x.dtype)
  return x


def _embed(config: ModelConfig, rngs: nnx.Rngs) -> Embed:
  """The token embedding of `config` (init and sqrt(d_model) scaling included)."""
  return Embed(config.vocab_size, config.d_model, dtype=config.residual_stream_dtype,
               init_std=config.init_stds(1).embedding, scale=config.scale_embeddings,
               rngs=rngs)


class Encoder(nnx.Module):
  """Embedding + positions + N encoder layers (+ final LayerNorm for pre-norm). The embedding
  is the model's (`embed`), passed to each call: a module is not held by two parents."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    self.positions = AddPositions(config.positional_encoding, config.max_len, config.d_model,
                                  rngs=rngs)
    if config.embedding_norm:
      self.embedding_norm = _norm(config, rngs)
    self.layers = make_layers(config, lambda: EncoderLayer(config, rngs),
                              config.num_encoder_layers)
    if config.norm_position == 'pre':
      self.final_norm = _norm(config, rngs)

  def __call__(self, embed: Embed, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, dropout_rng: Array | None = None) -> Array:
    """tokens `[batch, len]` (segment ids and positions `[batch, len]` for packed rows) ->
    `[batch, len, d_model]`."""
    cfg = self.config
    valid = tokens > 0
    mask = attn.FactoredMask(query_valid=valid, key_valid=valid,
                             query_segment_ids=segment_ids, key_segment_ids=segment_ids)
    x = _dropout(cfg, _input(self, embed, tokens, positions),
                 site_keys(dropout_rng, STACK_SITES)['embeddings'])
    x = run_layers(cfg, self.layers, x, lambda layer, x, rng: layer(x, mask, positions, rng),
                   dropout_rng)
    if cfg.norm_position == 'pre':
      x = self.final_norm(x).astype(cfg.compute_dtype)
    return x.astype(cfg.compute_dtype)  # a float32 stream (residual_dtype) leaves in `dtype`


class Decoder(nnx.Module):
  """Shifted target embedding + positions + N decoder layers + output logits. Without
  `cross` (decoder-only) the layers have no encoder-decoder attention."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, cross: bool):
    self.config = config
    self.positions = AddPositions(config.positional_encoding, config.max_len, config.d_model,
                                  rngs=rngs)
    if config.embedding_norm:
      self.embedding_norm = _norm(config, rngs)
    self.layers = make_layers(config, lambda: DecoderLayer(config, rngs, cross=cross),
                              config.num_decoder_layers)
    if config.norm_position == 'pre':
      self.final_norm = _norm(config, rngs)
    if not config.logits_via_embedding:
      self.logits = Dense(config.d_model, config.vocab_size, ('embed', 'vocab'),
                          init_std=config.init_stds(config.num_decoder_layers).kernel,
                          matmul='general', rngs=rngs)
    elif config.final_logits_bias:
      self.logits_bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32), axes=('vocab',))

  def __call__(self, embed: Embed, tokens: Array, encoded: Array | None = None,
               encoder_valid: Array | None = None, *, segment_ids: Array | None = None,
               positions: Array | None = None, encoder_segment_ids: Array | None = None,
               dropout_rng: Array | None = None) -> Array:
    """tokens `[batch, len]`, encoded `[batch, src_len, d_model]` -> logits `[batch, len,
    vocab]` (float32). `encoder_valid` `[batch, src_len]` marks the non-pad source positions;
    `segment_ids` `[batch, len]` and `encoder_segment_ids` `[batch, src_len]` those of packed
    rows."""
    valid = tokens > 0
    self_mask = attn.FactoredMask(causal=True, query_valid=valid, key_valid=valid,
                                  query_segment_ids=segment_ids, key_segment_ids=segment_ids)
    packed = segment_ids is not None and encoder_segment_ids is not None
    cross_mask = None if encoded is None else attn.FactoredMask(
        query_valid=valid, key_valid=encoder_valid,
        query_segment_ids=segment_ids if packed else None,
        key_segment_ids=encoder_segment_ids if packed else None)
    x = _input(self, embed, shift_right(tokens, segment_ids), positions)
    x = _dropout(self.config, x, site_keys(dropout_rng, STACK_SITES)['embeddings'])
    x = run_layers(self.config, self.layers, x,
                   lambda layer, x, rng: layer(x, encoded, self_mask, cross_mask, positions,
                                               rng)[0], dropout_rng)
    return self._logits(embed, x)

  def step(self, embed: Embed, tokens: Array, cache: KVCache, encoder_valid: Array | None = None,
           *, positions: Array | None = None, cache_mask: Array | None = None
           ) -> tuple[Array, KVCache]:
    """One call on the KV cache: decoder *inputs* `[batch, n]` (already shifted: the first
    call gets the start token 0) -> (logits `[batch, n, vocab]`, the cache with them written).

    `positions` `[batch, n]` default to the count of decoded tokens (`cache.index`);
    `cache_mask` `[batch, 1, n, cache_len]` restricts which cached positions each query sees
    (beam search runs a sentence's hypotheses as the `n` queries of one row, all at the same
    position, each seeing only its ancestors' keys); causality over the cache is added by the
    attention from the index.
    """
    if self.config.scan_layers:
      raise ValueError('decode a scan_layers model through unrolled(model)')
    index = cache.index
    if positions is None:
      positions = index + jnp.arange(tokens.shape[1])[None, :]
    cross_mask = None if encoder_valid is None else attn.FactoredMask(
        query_valid=jnp.ones(tokens.shape, jnp.bool_), key_valid=encoder_valid)
    x = _input(self, embed, tokens, positions)
    layer_caches = []
    for layer, layer_cache in zip(self.layers, cache.layers, strict=True):
      x, layer_cache = layer(x, None, cache_mask, cross_mask, positions, cache=layer_cache,
                             index=index)
      layer_caches.append(layer_cache)
    return self._logits(embed, x), KVCache(index + tokens.shape[1], layer_caches)

  def init_cache(self, batch: int, cache_len: int, encoded: Array | None = None) -> KVCache:
    """An empty cache of `cache_len` positions for `batch` rows; with `encoded` `[batch,
    src_len, d_model]` its cross-attention keys/values, projected once."""
    cfg = self.config
    caches = []
    for layer in self.layers:
      layer_cache = {'self_attention': SelfAttentionCache.empty(
          batch, cache_len, cfg.num_heads, cfg.head_dim, cfg.compute_dtype)}
      if encoded is not None:
        layer_cache['cross_attention'] = layer.cross_attention.cross_cache(encoded)
      caches.append(layer_cache)
    return KVCache(jnp.zeros((), jnp.int32), caches)

  def _logits(self, embed: Embed, x: Array) -> Array:
    cfg = self.config
    if cfg.norm_position == 'pre':
      x = self.final_norm(x)
    x = x.astype(cfg.compute_dtype)  # a float32 stream (residual_dtype) leaves in `dtype`
    if not cfg.logits_via_embedding:
      return self.logits(x)
    logits = embed.attend(x)
    return logits + self.logits_bias[...] if cfg.final_logits_bias else logits


class EncoderDecoder(nnx.Module):
  """The paper's model: `model(inputs, targets)` -> logits `[batch, tgt_len, vocab]`."""
  SITES = ('encoder', 'decoder')  # dropout keys

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = _embed(config, rngs)
    if not config.share_embeddings:
      self.target_embed = _embed(config, rngs)
    self.encoder = Encoder(config, rngs)
    self.decoder = Decoder(config, rngs, cross=True)

  def _target_embed(self) -> Embed:
    return self.embed if self.config.share_embeddings else self.target_embed

  def encode(self, inputs: Array, *, inputs_segmentation: Array | None = None,
             inputs_position: Array | None = None, deterministic: bool = True,
             dropout_rng: Array | None = None) -> Array:
    """inputs `[batch, src_len]` -> encoded `[batch, src_len, d_model]`."""
    return self.encoder(self.embed, inputs, segment_ids=inputs_segmentation,
                        positions=inputs_position,
                        dropout_rng=None if deterministic else
                        site_keys(dropout_rng, self.SITES)['encoder'])

  def decode(self, encoded: Array, inputs: Array, targets: Array, *,
             inputs_segmentation: Array | None = None, targets_segmentation: Array | None = None,
             targets_position: Array | None = None, deterministic: bool = True,
             dropout_rng: Array | None = None) -> Array:
    """The decoder half: encoded `[batch, src_len, d_model]`, inputs `[batch, src_len]` (for
    the source padding mask), targets `[batch, tgt_len]` -> logits `[batch, tgt_len, vocab]`."""
    return self.decoder(self._target_embed(), targets, encoded, inputs > 0,
                        segment_ids=targets_segmentation, positions=targets_position,
                        encoder_segment_ids=inputs_segmentation,
                        dropout_rng=None if deterministic else
                        site_keys(dropout_rng, self.SITES)['decoder'])

  def __call__(self, inputs: Array, targets: Array, *, inputs_segmentation: Array | None = None,
               targets_segmentation: Array | None = None, inputs_position: Array | None = None,
               targets_position: Array | None = None, deterministic: bool = True,
               dropout_rng: Array | None = None) -> Array:
    """`deterministic=False` draws dropout from `dropout_rng` (a key)."""
    _check_rng(deterministic, dropout_rng)
    encoded = self.encode(inputs, inputs_segmentation=inputs_segmentation,
                          inputs_position=inputs_position, deterministic=deterministic,
                          dropout_rng=dropout_rng)
    return self.decode(encoded, inputs, targets, inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation,
                       targets_position=targets_position, deterministic=deterministic,
                       dropout_rng=dropout_rng)

  def init_cache(self, batch: int, cache_len: int, encoded: Array, inputs: Array) -> KVCache:
    del inputs  # the source padding is a mask at every step
    return self.decoder.init_cache(batch, cache_len, encoded)

  def step(self, cache: KVCache, inputs: Array, tokens: Array, *, positions: Array | None = None,
           cache_mask: Array | None = None) -> tuple[Array, KVCache]:
    """`Decoder.step` on the source `inputs` `[batch, src_len]` (for its padding mask)."""
    return self.decoder.step(self._target_embed(), tokens, cache, inputs > 0,
                             positions=positions, cache_mask=cache_mask)


class DecoderOnly(nnx.Module):
  """Language model: `model(tokens)` -> logits; `logits[:, t]` predicts `tokens[:, t]`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = _embed(config, rngs)
    self.decoder = Decoder(config, rngs, cross=False)

  def __call__(self, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, deterministic: bool = True,
               dropout_rng: Array | None = None) -> Array:
    """tokens `[batch, len]` -> logits `[batch, len, vocab]` (float32)."""
    _check_rng(deterministic, dropout_rng)
    return self.decoder(self.embed, tokens, segment_ids=segment_ids, positions=positions,
                        dropout_rng=None if deterministic else dropout_rng)

  def init_cache(self, batch: int, cache_len: int, encoded=None, inputs=None) -> KVCache:
    del encoded, inputs
    return self.decoder.init_cache(batch, cache_len)

  def step(self, cache: KVCache, inputs, tokens: Array, *, positions: Array | None = None,
           cache_mask: Array | None = None) -> tuple[Array, KVCache]:
    del inputs
    return self.decoder.step(self.embed, tokens, cache, positions=positions,
                             cache_mask=cache_mask)


class EncoderOnly(nnx.Module):
  """Bidirectional encoder: `model(tokens)` -> `[batch, len, d_model]`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = _embed(config, rngs)
    self.encoder = Encoder(config, rngs)

  def __call__(self, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, deterministic: bool = True,
               dropout_rng: Array | None = None) -> Array:
    _check_rng(deterministic, dropout_rng)
    return self.encoder(self.embed, tokens, segment_ids=segment_ids, positions=positions,
                        dropout_rng=None if deterministic else dropout_rng)


def _check_rng(deterministic: bool, dropout_rng) -> None:
  if not deterministic and dropout_rng is None:
    raise ValueError('deterministic=False needs a dropout_rng (a jax.random key)')
