"""One adapter per model kind: everything outside the NNX modules that depends on the kind.

A model's kind is its name (`config.model.kind`, a string: 'encoder_decoder', ...); its adapter
is the object here that knows how to handle it (`adapter_of(module_or_config)`,
`ADAPTERS[kind]`).

As t5x's model classes do, an adapter says how a model of its kind is called (example inputs,
a training batch, a teacher-forced pass for scoring and attention plots), how it
decodes (encoding the source, the KV cache, one decoder step) and what it costs (analytic
FLOPs). Training, decoding, plotting and `decode.py` ask `adapter_of(...)` instead of branching
on `config.kind`; a new kind is a module class in `model/transformer.py` plus an adapter here
in `ADAPTERS`.

Batches are dicts of `[batch, len]` int32 arrays: `targets` (the decoder's tokens; for a
language model, the text) and, with a source, `inputs`; packed rows add `*_segmentation` and
`*_position`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from model import transformer

Array = jax.Array


class ModelAdapter:
  """The kind-independent part; subclasses fill in what differs."""
  kind: str  # the kind's name, `config.model.kind`
  module_class: type
  has_source: bool  # the model reads `inputs` (a source sentence) besides its tokens
  has_decoder: bool  # it predicts tokens: trains on a loss, decodes
  layer_fields: tuple[str, ...]  # the config.model fields that count its layers (each > 0)
  # The training batches it reads, by the input pipeline's name for them
  # (`input_pipeline.pipeline.LAYOUTS`: the pipeline knows layouts, not kinds).
  batch_layout: str

  def target_length(self, max_length: int) -> int:
    """Positions the decoder needs for examples of `config.data.max_length` tokens."""
    return max_length

  def train_batch_shapes(self, batch_size: int, max_length: int, packed: bool
                         ) -> dict[str, tuple[tuple[int, ...], Any]]:
    """What the input pipeline gives a train step: name -> (shape, dtype)."""
    shape = (batch_size, self.target_length(max_length))
    out = {'targets': (shape, jnp.int32)}
    if packed:
      out.update(targets_segmentation=(shape, jnp.int32), targets_position=(shape, jnp.int32))
    return out

  def apply_batch(self, model, batch: Mapping[str, Array], *, deterministic: bool,
                  dropout_rng: Array | None = None):
    """A training/eval batch -> the model's output (logits `[batch, len, vocab]`)."""
    return model(batch['targets'], segment_ids=batch.get('targets_segmentation'),
                 positions=batch.get('targets_position'), deterministic=deterministic,
                 dropout_rng=dropout_rng)

  def teacher_forced(self, model, source, tokens):
    """Unpacked forward pass over `tokens` `[batch, len]` (and the `source`, if any)."""
    return model(source, tokens) if self.has_source else model(tokens)

  # -- decoding -----------------------------------------------------------------------------
  def encode(self, model, inputs):
    """The decoder's fixed context: encoded source `[batch, src_len, d_model]`, or None."""
    del model, inputs
    return None

  def init_cache(self, model, encoded, inputs, batch: int, cache_len: int):
    """An empty KV cache for `batch` rows and `cache_len` positions (with the encoder's keys
    and values, projected once, for a model with a source)."""
    return model.init_cache(batch, cache_len, encoded, inputs)

  def decoder_step(self, model, cache, inputs, tokens, positions=None, mask=None):
    """Decoder inputs `[batch, n]` -> (logits `[batch, n, vocab]` float32, new cache).

    `inputs` `[batch, src_len]` (the source, for its padding mask; None without one),
    `positions` `[batch, n]` and `mask` `[batch, 1, n, cache_len]` (`cache_mask`: see
    `Decoder.step`)."""
    logits, cache = model.step(cache, inputs, tokens, positions=positions, cache_mask=mask)
    return logits.astype(jnp.float32), cache

  # -- cost ---------------------------------------------------------------------------------
  def forward_flops(self, config, shapes: Mapping[str, Sequence[int]]) -> int:
    """Matmul FLOPs of one forward pass over a batch of these `[batch, len]` shapes."""
    b, t = shapes['targets'][:2]
    return b * t * config.num_decoder_layers * _layer_flops(config, t) + _logits(config, b, t)


def _layer_flops(c, length: int) -> int:
  """Per token of one self-attention + feed-forward layer: projections (Q, K, V, W^O), the
  feed-forward, and the attention's scores and values over `length` keys."""
  return 2 * (4 * c.d_model * c.d_model + 2 * c.d_model * c.d_ff) + 4 * length * c.d_model


def _logits(c, b: int, t: int) -> int:
  return b * t * 2 * c.d_model * c.vocab_size


class EncoderDecoderAdapter(ModelAdapter):
  kind, module_class = 'encoder_decoder', transformer.EncoderDecoder
  has_source, has_decoder = True, True
  layer_fields = ('num_encoder_layers', 'num_decoder_layers')
  batch_layout = 'sentence_pairs'

  def apply_batch(self, model, batch, *, deterministic, dropout_rng=None):
    return model(batch['inputs'], batch['targets'],
                 inputs_segmentation=batch.get('inputs_segmentation'),
                 targets_segmentation=batch.get('targets_segmentation'),
                 inputs_position=batch.get('inputs_position'),
                 targets_position=batch.get('targets_position'),
                 deterministic=deterministic, dropout_rng=dropout_rng)

  def train_batch_shapes(self, batch_size, max_length, packed):
    out = super().train_batch_shapes(batch_size, max_length, packed)
    out.update({k.replace('targets', 'inputs'): v for k, v in out.items()})
    return out

  def encode(self, model, inputs):
    return model.encode(inputs)

  def forward_flops(self, config, shapes):
    c = config
    b, t = shapes['targets'][:2]
    s = shapes['inputs'][1]
    d = c.d_model
    encoder = b * s * c.num_encoder_layers * _layer_flops(c, s)
    # Cross-attention: Q and W^O per target token, K and V per source token, scores/values.
    cross = b * t * (2 * 2 * d * d + 4 * s * d) + b * s * 2 * 2 * d * d
    decoder = c.num_decoder_layers * (b * t * _layer_flops(c, t) + cross)
    return encoder + decoder + _logits(c, b, t)


class DecoderOnlyAdapter(ModelAdapter):
  kind, module_class = 'decoder_only', transformer.DecoderOnly
  has_source, has_decoder = False, True
  layer_fields = ('num_decoder_layers',)
  batch_layout = 'text_blocks'

  def target_length(self, max_length: int) -> int:
    return max_length + 1  # the decoder reads the start token before the text

  def train_batch_shapes(self, batch_size, max_length, packed):
    out = super().train_batch_shapes(batch_size, max_length, packed=False)
    out['targets_weights'] = (out['targets'][0], jnp.float32)  # blocks of a stream: no packing
    return out


class EncoderOnlyAdapter(ModelAdapter):
  kind, module_class = 'encoder_only', transformer.EncoderOnly
  has_source, has_decoder = False, False
  layer_fields = ('num_encoder_layers',)
  batch_layout = 'sentence_pairs'  # (not trained by train.py: it predicts no tokens)

  def forward_flops(self, config, shapes):
    b, t = shapes['targets'][:2]
    return b * t * config.num_encoder_layers * _layer_flops(config, t)


ADAPTERS: dict[str, ModelAdapter] = {
    a.kind: a for a in (EncoderDecoderAdapter(), DecoderOnlyAdapter(), EncoderOnlyAdapter())}


def adapter_of(module_or_config) -> ModelAdapter:
  """The adapter of a module (anything with `.config.kind`) or of a model config."""
  config = getattr(module_or_config, 'config', module_or_config)
  return ADAPTERS[config.kind]
