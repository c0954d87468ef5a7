"""`ModelConfig`: the validated, hashable form of `config.model`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from model.attention import DROPOUT_RNGS

KINDS = ('encoder_decoder', 'decoder_only', 'encoder_only')
POSITIONAL_ENCODINGS = ('sinusoidal', 'learned', 'rope')
NORM_POSITIONS = ('post', 'pre')
ACTIVATIONS = ('relu', 'gelu')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
ATTENTION_IMPLS = ('reference', 'xla')


class ConfigError(ValueError):
  """A bad configuration value; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  kind: str = 'encoder_decoder'
  vocab_size: int = 8000
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  max_len: int = 256
  share_embeddings: bool = True
  logits_via_embedding: bool = True
  positional_encoding: str = 'sinusoidal'
  norm_position: str = 'post'
  activation: str = 'relu'
  dtype: str = 'float32'
  attention_impl: str = 'reference'
  remat: bool = False
  scan_layers: bool = False
  dropout_rng: str = 'hash'

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @classmethod
  def from_config(cls, model_config: Mapping[str, Any]) -> 'ModelConfig':
    """Builds from a ConfigDict/dict (unknown fields are an error) and validates."""
    values = dict(model_config.items())
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ConfigError(f'config.model has unknown field(s) {unknown}; known: {sorted(known)}')
    config = cls(**values)
    config.validate()
    return config

  def validate(self) -> None:
    def choice(field, options):
      value = getattr(self, field)
      if value not in options:
        raise ConfigError(f'config.model.{field}={value!r} is not one of {list(options)}')

    choice('kind', KINDS)
    choice('positional_encoding', POSITIONAL_ENCODINGS)
    choice('norm_position', NORM_POSITIONS)
    choice('activation', ACTIVATIONS)
    choice('dtype', DTYPES)
    choice('attention_impl', ATTENTION_IMPLS)
    choice('dropout_rng', DROPOUT_RNGS)
    for field in ('vocab_size', 'd_model', 'num_heads', 'd_ff', 'max_len'):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f'config.model.{field}={value!r} must be a positive integer')
    layer_fields = {'encoder_decoder': ('num_encoder_layers', 'num_decoder_layers'),
                    'decoder_only': ('num_decoder_layers',),
                    'encoder_only': ('num_encoder_layers',)}[self.kind]
    for field in layer_fields:
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f'config.model.{field}={value!r} must be a positive integer '
                          f'for kind={self.kind!r}')
    if self.d_model % self.num_heads:
      raise ConfigError(f'config.model.d_model={self.d_model} is not divisible by '
                        f'config.model.num_heads={self.num_heads}')
    if self.positional_encoding == 'rope' and self.head_dim % 2:
      raise ConfigError(f'config.model.positional_encoding=rope needs an even head size, '
                        f'got d_model/num_heads={self.head_dim}')
    for field in ('dropout_rate', 'attention_dropout_rate'):
      value = getattr(self, field)
      if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f'config.model.{field}={value!r} must be in [0, 1)')
