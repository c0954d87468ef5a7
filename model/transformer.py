"""The Transformer (Vaswani et al. 2017, Figure 1) as Linen modules.

  EncoderDecoder  inputs, targets -> logits      (translation; the paper's model)
  DecoderOnly     tokens -> logits               (language model)
  EncoderOnly     tokens -> [batch, len, d_model] (bidirectional encoder)

Token id 0 is padding (masked as keys, ignored by the loss) and the decoder's start
token: targets are shifted right inside the model, so `logits[:, t]` predicts
`targets[:, t]` from `targets[:, :t]`. Packed rows carry `*_segmentation` (1, 2, ...
per example, 0 = pad) and `*_position` (restarting at 0 per example); attention never
crosses segments and the shift restarts at each segment.

Names: the packed batch's keys (`inputs_segmentation`, `targets_position`, ...) are the paper
codebases' and `EncoderDecoder` takes them as they are (`module.apply(variables, **batch)`);
inside, segment ids are `segment_ids=` and positions `positions=`. `use_cache=True` runs on the
KV cache (the `cache` collection), and `module.decode`
is the encoder-decoder's decoder half, as `module.encode` is its encoder half.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from model import attention as attn
from model.layers import AddPositions, Dropout, Embed, FeedForward, LayerNorm, MultiHeadAttention
from model.partitioning import constrain, with_axes

if TYPE_CHECKING:  # annotations only: model.config validates through model.kinds, which uses us
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


class Sublayer(nn.Module):
  """Residual connection around `fn` with LayerNorm after ('post', the paper) or before ('pre')."""
  config: ModelConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x: Array, fn) -> Array:
    cfg = self.config
    dropout = Dropout(cfg.dropout_rate, cfg.dropout_rng_impl)
    if cfg.norm_position == 'post':  # the norm's output is the stream
      norm = LayerNorm(cfg.residual_stream_dtype, name='norm')
      return norm(x + dropout(fn(x), self.deterministic))  # LayerNorm(x + Sublayer(x))
    norm = LayerNorm(cfg.compute_dtype, name='norm')
    return x + dropout(fn(norm(x)), self.deterministic)


class EncoderLayer(nn.Module):
  """Self-attention then feed-forward, each wrapped in `Sublayer`."""
  config: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: Array, mask: attn.FactoredMask, positions: Array | None) -> Array:
    cfg = self.config
    self_attention = _attention(cfg, cfg.num_encoder_layers, 'self_attention',
                                rope=cfg.positional_encoding == 'rope')
    x = Sublayer(cfg, self.deterministic, name='attention_block')(
        x, lambda h: self_attention(h, mask=mask, positions=positions,
                                    deterministic=self.deterministic))
    x = Sublayer(cfg, self.deterministic, name='ffn_block')(x, _ffn(cfg, cfg.num_encoder_layers))
    return constrain(x, RESIDUAL_AXES)


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention (skipped when `encoded` is None),
  feed-forward."""
  config: ModelConfig
  deterministic: bool = True
  use_cache: bool = False

  @nn.compact
  def __call__(self, x: Array, encoded: Array | None, self_mask: attn.FactoredMask | Array | None,
               cross_mask: attn.FactoredMask | None, positions: Array | None) -> Array:
    cfg = self.config
    n = cfg.num_decoder_layers
    self_attention = _attention(cfg, n, 'self_attention', rope=cfg.positional_encoding == 'rope')
    x = Sublayer(cfg, self.deterministic, name='self_attention_block')(
        x, lambda h: self_attention(h, mask=self_mask, positions=positions,
                                    deterministic=self.deterministic, use_cache=self.use_cache))
    if encoded is not None:
      cross_attention = _attention(cfg, n, 'cross_attention', rope=False)
      x = Sublayer(cfg, self.deterministic, name='cross_attention_block')(
          x, lambda h: cross_attention(h, encoded, mask=cross_mask,
                                       deterministic=self.deterministic,
                                       use_cache=self.use_cache))
    x = Sublayer(cfg, self.deterministic, name='ffn_block')(x, _ffn(cfg, n))
    return constrain(x, RESIDUAL_AXES)


def _attention(config: ModelConfig, num_layers: int, name: str, rope: bool) -> MultiHeadAttention:
  """One attention sub-layer of a stack of `num_layers` (for the init scheme's stds)."""
  stds = config.init_stds(num_layers)
  return MultiHeadAttention(config.num_heads, config.compute_dtype,
                            config.attention_dropout_rate, config.attention_impl,
                            use_rope=rope, dropout_rng_impl=config.dropout_rng_impl,
                            init_std=stds.kernel, out_init_std=stds.residual,
                            matmul=config.projection_matmul, name=name)


def _ffn(config: ModelConfig, num_layers: int) -> FeedForward:
  stds = config.init_stds(num_layers)
  return FeedForward(config.d_ff, config.activation, config.compute_dtype, stds.kernel,
                     stds.residual, config.projection_matmul, name='ffn')


def _embed(config: ModelConfig, name: str) -> Embed:
  """The token embedding module of `config` (init and sqrt(d_model) scaling included)."""
  return Embed(config.vocab_size, config.d_model, config.residual_stream_dtype,
               config.init_stds(1).embedding, config.scale_embeddings, name=name)


def _layer_class(cls, config: ModelConfig):
  # Rematerialisation trades compute for activation memory in the backward pass.
  return nn.remat(cls) if config.remat else cls


def _run_layers(config: ModelConfig, make_layer, num_layers: int, x: Array, *args) -> Array:
  """`x` through `num_layers` layers built by `make_layer(name)`, each called `(x, *args)`.

  Unrolled, the layers are `layer_0 ... layer_{N-1}`. With `config.scan_layers` one layer
  named `layers` runs under `nn.scan` with its parameters stacked on a leading `[N]` axis:
  XLA compiles one layer instead of N (compile time and program size stay flat in depth).
  `stack_layer_params` / `unstack_layer_params` convert between the two layouts.
  """
  if not config.scan_layers:
    for i in range(num_layers):
      x = make_layer(f'layer_{i}')(x, *args)
    return x
  scan = nn.scan(lambda layer, carry, *a: (layer(carry, *a), None),
                 variable_axes={'params': 0, 'cache': 0, 'intermediates': 0},
                 split_rngs={'params': True, 'dropout': True},
                 metadata_params={nn.PARTITION_NAME: 'layers'},
                 in_axes=(nn.broadcast,) * len(args), length=num_layers)
  return scan(make_layer('layers'), x, *args)[0]


def _layer_groups(params) -> list[dict]:
  """The parameter dicts that hold a stack of layers (the encoder's and the decoder's)."""
  return [params[k] for k in ('encoder', 'decoder') if k in params]


def stack_layer_params(params):
  """Unrolled layout (`layer_0`, `layer_1`, ...) -> the `scan_layers` layout (`layers`,
  every leaf `[num_layers, ...]`). Other parameters are shared, not copied."""
  params = jax.tree.map(lambda x: x, dict(params))  # new dicts, same leaves
  for group in _layer_groups(params):
    names = sorted((k for k in group if k.startswith('layer_')), key=lambda k: int(k[6:]))
    if names:
      group['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *[group.pop(k) for k in names])
  return params


def unstack_layer_params(params):
  """The `scan_layers` layout -> the unrolled layout (the inverse of `stack_layer_params`)."""
  params = jax.tree.map(lambda x: x, dict(params))
  for group in _layer_groups(params):
    if 'layers' in group:
      stacked = group.pop('layers')
      for i in range(jax.tree.leaves(stacked)[0].shape[0]):
        group[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return params


def with_options(module: nn.Module, **changes) -> nn.Module:
  """The same model class with these config fields changed (`module` itself if none changes)."""
  if all(getattr(module.config, name) == value for name, value in changes.items()):
    return module
  return type(module)(dataclasses.replace(module.config, **changes))


def unrolled(module: nn.Module, params):
  """(module, params) with `scan_layers` -> the same model unrolled, and its params.
  Decoding and attention plots use this: their KV caches and sown weights are per layer."""
  if not module.config.scan_layers:
    return module, params
  return with_options(module, scan_layers=False), unstack_layer_params(params)


class Encoder(nn.Module):
  """Embedding + positions + N encoder layers (+ final LayerNorm for pre-norm)."""
  config: ModelConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, deterministic: bool = True) -> Array:
    """tokens `[batch, len]` (segment ids and positions `[batch, len]` for packed rows) ->
    `[batch, len, d_model]`."""
    cfg = self.config
    valid = tokens > 0
    mask = attn.FactoredMask(query_valid=valid, key_valid=valid,
                             query_segment_ids=segment_ids, key_segment_ids=segment_ids)
    x = AddPositions(cfg.positional_encoding, cfg.max_len, name='positions')(
        self.embed(tokens), positions)
    x = Dropout(cfg.dropout_rate, cfg.dropout_rng_impl)(x, deterministic)
    layer = _layer_class(EncoderLayer, cfg)
    x = _run_layers(cfg, lambda name: layer(cfg, deterministic, name=name),
                    cfg.num_encoder_layers, x, mask, positions)
    if cfg.norm_position == 'pre':
      x = LayerNorm(cfg.compute_dtype, name='final_norm')(x)
    return x.astype(cfg.compute_dtype)  # a float32 stream (residual_dtype) leaves in `dtype`


class Decoder(nn.Module):
  """Shifted target embedding + positions + N decoder layers + output logits.

  Without `encoded` (decoder-only) the layers have no encoder-decoder attention.
  With `use_cache=True`, `tokens` are the decoder *inputs* for the next positions (already
  shifted: the first call gets the start token 0) and the KV cache advances.
  """
  config: ModelConfig
  embed: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, encoded: Array | None = None,
               encoder_valid: Array | None = None, *, segment_ids: Array | None = None,
               positions: Array | None = None, encoder_segment_ids: Array | None = None,
               deterministic: bool = True, use_cache: bool = False,
               cache_mask: Array | None = None) -> Array:
    """tokens `[batch, len]`, encoded `[batch, src_len, d_model]` -> logits `[batch, len, vocab]`.

    `encoder_valid` `[batch, src_len]` marks the non-pad source positions; `segment_ids`
    `[batch, len]` and `encoder_segment_ids` `[batch, src_len]` those of packed rows.
    With `use_cache` only: `positions` `[batch, len]` override the count of decoded tokens, and
    `cache_mask` `[batch, 1, len, cache_len]` restricts which cached positions each query
    sees (beam search runs a sentence's hypotheses as the `len` queries of one row, all at
    the same position, each seeing only its ancestors' keys).
    """
    cfg = self.config
    if use_cache:
      counted = self._cache_positions(tokens.shape[1])  # always: keeps the cache's structure
      positions = counted if positions is None else positions
      decoder_inputs = tokens
      # Causality over the cache is added by the attention module from its cache index.
      self_mask = cache_mask
      query_valid = jnp.ones(tokens.shape, jnp.bool_)
    else:
      decoder_inputs = shift_right(tokens, segment_ids)
      valid = tokens > 0
      query_valid = valid
      self_mask = attn.FactoredMask(causal=True, query_valid=valid, key_valid=valid,
                                    query_segment_ids=segment_ids, key_segment_ids=segment_ids)
    cross_mask = None
    if encoded is not None:
      packed = segment_ids is not None and encoder_segment_ids is not None
      cross_mask = attn.FactoredMask(
          query_valid=query_valid, key_valid=encoder_valid,
          query_segment_ids=segment_ids if packed else None,
          key_segment_ids=encoder_segment_ids if packed else None)

    x = AddPositions(cfg.positional_encoding, cfg.max_len, name='positions')(
        self.embed(decoder_inputs), positions)
    x = Dropout(cfg.dropout_rate, cfg.dropout_rng_impl)(x, deterministic)
    layer = _layer_class(DecoderLayer, cfg)
    x = _run_layers(cfg, lambda name: layer(cfg, deterministic, use_cache, name=name),
                    cfg.num_decoder_layers, x, encoded, self_mask, cross_mask, positions)
    if cfg.norm_position == 'pre':
      x = LayerNorm(cfg.compute_dtype, name='final_norm')(x)
    x = x.astype(cfg.compute_dtype)  # a float32 stream (residual_dtype) leaves in `dtype`
    if cfg.logits_via_embedding:
      return self.embed.attend(x)
    std = cfg.init_stds(cfg.num_decoder_layers).kernel
    init = nn.initializers.xavier_uniform() if std is None else nn.initializers.normal(std)
    return nn.Dense(cfg.vocab_size, dtype=jnp.float32, param_dtype=jnp.float32,
                    kernel_init=with_axes(init, ('embed', 'vocab')),
                    bias_init=with_axes(nn.initializers.zeros_init(), ('vocab',)),
                    name='logits')(x)

  def _cache_positions(self, num_new: int) -> Array:
    """Absolute positions of this call's tokens: the count decoded so far, kept in the cache."""
    initializing = not self.has_variable('cache', 'num_decoded')
    num_decoded = self.variable('cache', 'num_decoded', lambda: jnp.array(0, jnp.int32))
    start = num_decoded.value
    if not initializing:
      num_decoded.value = start + num_new
    return start + jnp.arange(num_new)[None, :]


class EncoderDecoder(nn.Module):
  """The paper's model: `apply(variables, inputs, targets)` -> logits `[batch, tgt_len, vocab]`."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.source_embed = _embed(cfg, 'embed')
    self.target_embed = (self.source_embed if cfg.share_embeddings else
                         _embed(cfg, 'target_embed'))
    self.encoder = Encoder(cfg, self.source_embed, name='encoder')
    self.decoder = Decoder(cfg, self.target_embed, name='decoder')

  def encode(self, inputs: Array, *, inputs_segmentation: Array | None = None,
             inputs_position: Array | None = None, deterministic: bool = True) -> Array:
    """inputs `[batch, src_len]` -> encoded `[batch, src_len, d_model]`."""
    return self.encoder(inputs, segment_ids=inputs_segmentation, positions=inputs_position,
                        deterministic=deterministic)

  def decode(self, encoded: Array, inputs: Array, targets: Array, *,
             inputs_segmentation: Array | None = None, targets_segmentation: Array | None = None,
             targets_position: Array | None = None, deterministic: bool = True,
             use_cache: bool = False, cache_mask: Array | None = None) -> Array:
    """The decoder half: encoded `[batch, src_len, d_model]`, inputs `[batch, src_len]` (for
    the source padding mask), targets `[batch, tgt_len]` -> logits `[batch, tgt_len, vocab]`
    (float32). `use_cache`, `cache_mask`: see `Decoder`."""
    return self.decoder(targets, encoded, inputs > 0, segment_ids=targets_segmentation,
                        positions=targets_position, encoder_segment_ids=inputs_segmentation,
                        deterministic=deterministic, use_cache=use_cache, cache_mask=cache_mask)

  def __call__(self, inputs: Array, targets: Array, *, inputs_segmentation: Array | None = None,
               targets_segmentation: Array | None = None, inputs_position: Array | None = None,
               targets_position: Array | None = None, deterministic: bool = True) -> Array:
    encoded = self.encode(inputs, inputs_segmentation=inputs_segmentation,
                          inputs_position=inputs_position, deterministic=deterministic)
    return self.decode(encoded, inputs, targets, inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation,
                       targets_position=targets_position, deterministic=deterministic)


class DecoderOnly(nn.Module):
  """Language model: `apply(variables, tokens)` -> logits; `logits[:, t]` predicts
  `tokens[:, t]`."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embed = _embed(cfg, 'embed')
    self.decoder = Decoder(cfg, self.embed, name='decoder')

  def __call__(self, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, deterministic: bool = True,
               use_cache: bool = False, cache_mask: Array | None = None) -> Array:
    """tokens `[batch, len]` -> logits `[batch, len, vocab]` (float32); `segment_ids`,
    `positions`, `use_cache`, `cache_mask`: see `Decoder`."""
    return self.decoder(tokens, segment_ids=segment_ids, positions=positions,
                        deterministic=deterministic, use_cache=use_cache, cache_mask=cache_mask)


class EncoderOnly(nn.Module):
  """Bidirectional encoder: `apply(variables, tokens)` -> `[batch, len, d_model]`."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embed = _embed(cfg, 'embed')
    self.encoder = Encoder(cfg, self.embed, name='encoder')

  def __call__(self, tokens: Array, *, segment_ids: Array | None = None,
               positions: Array | None = None, deterministic: bool = True) -> Array:
    """tokens `[batch, len]` -> `[batch, len, d_model]`; `segment_ids`, `positions`: see
    `Encoder`."""
    return self.encoder(tokens, segment_ids=segment_ids, positions=positions,
                        deterministic=deterministic)

