"""`ModelConfig`: the validated, hashable form of `config.model`."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from common.errors import ConfigError
from common.schema import Schema, documented
from model.attention import DROPOUT_RNGS, IMPLEMENTATIONS
from model.kinds import ADAPTERS
from model.layers import ACTIVATIONS, GATED_ACTIVATIONS, LAYER_NORM_EPS, NORMS

POSITIONAL_ENCODINGS = ('sinusoidal', 'learned', 'rope')
NORM_POSITIONS = ('post', 'pre')
# Parameter initialisation (ModelConfig.init_stds): 'paper' = T2T / the Flax WMT example
# (Glorot uniform kernels, embeddings normal(d_model^-0.5)); 'gpt2' = GPT-2 / nanoGPT.
INIT_SCHEMES = ('paper', 'gpt2')
GPT2_INIT_STD = 0.02
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# The residual stream's dtype (token + position embeddings and every x + Sublayer(x)):
# 'compute' = `dtype` (MaxText, t5x: half the bytes in bfloat16); 'float32' = float32 while
# the matmuls run in `dtype`, as PyTorch autocast (nanoGPT) and Megatron's
# --fp32-residual-connection keep it: in bfloat16 every sub-layer's update is rounded to the
# stream's 8-bit significand, so updates much smaller than the stream are partly lost.
RESIDUAL_DTYPES = ('compute', 'float32')
# attention_impl: the rows of `attention.IMPLEMENTATIONS` ('reference', 'xla', 'cudnn',
# 'chunked'), each with its function and what it can compute (the refusals come from there).
ATTENTION_IMPLS = tuple(IMPLEMENTATIONS)
# How a projection with several input/output axes (the fused [d_model, 3, heads, head_dim]
# QKV kernel) is multiplied: 'flat' = one 2-D matmul on the flattened kernel (XLA:CPU: see
# layers.Dense), 'general' = dot_general over the axes as they are (a heads axis split over
# 'tensor' stays split), 'auto' = 'flat' on CPU unless the heads are split, 'general' on
# GPU/TPU. Same values.
PROJECTION_MATMULS = ('auto', 'flat', 'general')


class InitStds(NamedTuple):
  """Normal init stds; None = Glorot uniform (see ModelConfig.init_stds)."""
  kernel: float | None  # every dense kernel but the residual projections
  residual: float | None  # attention output and FFN output kernels
  embedding: float  # token embeddings


# A parameter table (embedding, positions, feed-forward) larger than int32 indexing reaches:
# refused up front instead of a multi-TiB allocation failing deep in XLA.
MAX_TABLE_ELEMENTS = 2**31 - 1

@dataclasses.dataclass(frozen=True)
class ModelConfig(Schema):
  """`config.model`: every field and its default (configs/base.py takes them from here).
  Names follow the paper (Vaswani et al. 2017, Table 3); the defaults are its base model.
  `ModelConfig.from_config(config.model)` builds and validates one (common.schema.Schema)."""
  SECTION = 'model'
  kind: str = documented('encoder_decoder', 'which stack (one adapter each: model/kinds.py)',
                         choices=ADAPTERS)
  vocab_size: int = documented(8000, 'token ids the embedding and the output layer cover')
  num_encoder_layers: int = documented(6, 'N of the encoder (0 for decoder_only)')
  num_decoder_layers: int = documented(6, 'N of the decoder (0 for encoder_only)')
  d_model: int = documented(512, 'width of the residual stream and the embeddings')
  num_heads: int = documented(8, 'h: attention heads (d_model must divide by it)')
  d_ff: int = documented(2048, 'inner width of the feed-forward sub-layers')
  dropout_rate: float = documented(0.1, 'P_drop: sub-layer outputs and embedding sums')
  attention_dropout_rate: float = documented(
      0.0, 'dropout on the attention weights (not in the paper)')
  activation_dropout_rate: float = documented(
      0.0, "dropout on the feed-forward's hidden units (fairseq's --activation-dropout; not in "
      'the paper)')
  max_len: int = documented(256, 'positions of the position table (the longest sequence)')
  share_embeddings: bool = documented(True, 'one source/target embedding matrix (§3.4)')
  logits_via_embedding: bool = documented(
      True, 'the pre-softmax projection is the embedding matrix (§3.4)')
  positional_encoding: str = documented('sinusoidal', 'position information (§3.5: sinusoidal)',
                                        choices=POSITIONAL_ENCODINGS)
  norm_position: str = documented('post', "LayerNorm(x + Sublayer(x)) (the paper's 'post') or "
                                  "x + Sublayer(LayerNorm(x)) ('pre')", choices=NORM_POSITIONS)
  activation: str = documented('relu', 'feed-forward activation (the paper: relu; gelu is '
                               'the tanh form, gelu_exact the erf form, silu = swish, relu2 = '
                               'relu(x)^2; swiglu: gated, 3 matrices: d_ff 2/3 as wide keeps '
                               'the parameters)', choices=(*ACTIVATIONS, *GATED_ACTIVATIONS))
  norm: str = documented('layer_norm', "every normalisation layer: 'layer_norm' (the paper) "
                         "or 'rms_norm' (no centring, no bias)", choices=NORMS)
  qk_norm: bool = documented(False, "RMSNorm of each head's queries and keys before the dot "
                             'product (a learned [head_dim] scale each)')
  zero_init_out: bool = documented(False, 'the attention output and FFN output projections '
                                   '(the residual writes) start at zero')
  layer_norm_epsilon: float = documented(LAYER_NORM_EPS, "every LayerNorm's epsilon (1e-5: "
                                         "torch's, Marian's and GPT-2's; BERT's 1e-12)")
  final_logits_bias: bool = documented(
      False, 'a learned [vocab] bias added to the tied logits (Marian)')
  embedding_norm: bool = documented(
      False, 'LayerNorm on the embeddings + positions, before the first layer (BERT)')
  dtype: str = documented('float32', 'compute dtype; parameters stay float32', choices=DTYPES)
  residual_dtype: str = documented('compute', "the residual stream's dtype ('compute': dtype)",
                                   choices=RESIDUAL_DTYPES)
  attention_impl: str = documented('reference', 'attention function (all compute the same '
                                   'values)', choices=IMPLEMENTATIONS)
  remat: bool = documented(False, 'rematerialise each layer in the backward pass')
  scan_layers: bool = documented(
      False, 'jax.lax.scan over layers: one compiled layer, params [layers, ...]')
  dropout_rng_impl: str = documented('hash', "dropout bits ('hash': a fused integer hash)",
                                     choices=DROPOUT_RNGS)
  init: str = documented('paper', 'parameter initialisation (see init_stds)',
                         choices=INIT_SCHEMES)
  scale_embeddings: bool = documented(
      True, 'token embeddings times sqrt(d_model) (§3.4); GPT-2: False')
  projection_matmul: str = documented('auto', 'how the fused QKV projection multiplies (auto: '
                                      'by device)', choices=PROJECTION_MATMULS)

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def residual_stream_dtype(self):
    return jnp.float32 if self.residual_dtype == 'float32' else self.compute_dtype

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  def init_stds(self, num_layers: int) -> InitStds:
    """Initial standard deviations of `init` for a stack of `num_layers` layers.

    'paper': kernels Glorot uniform (None), token embeddings normal(d_model^-0.5), which
      `scale_embeddings` brings to unit size at the input.
    'gpt2' (GPT-2, nanoGPT's model.py): normal(0.02) for every kernel and the embeddings;
      the projections that write into the residual stream (attention output, the FFN's
      second layer) get 0.02 / sqrt(2 x num_layers), two per layer, so the stream's
      variance at init does not grow with depth. Biases are zero in both.
    `zero_init_out` sets the residual projections to zero under either (modded-nanogpt):
    each sub-layer then starts by adding nothing to the residual stream.
    """
    if self.init == 'gpt2':
      stds = InitStds(GPT2_INIT_STD, GPT2_INIT_STD / (2 * num_layers) ** 0.5, GPT2_INIT_STD)
    else:
      stds = InitStds(None, None, self.d_model ** -0.5)
    return stds._replace(residual=0.0) if self.zero_init_out else stds

  def validate(self) -> None:
    super().validate()  # the choices, in field order
    for field in ('scale_embeddings', 'final_logits_bias', 'embedding_norm', 'qk_norm',
                  'zero_init_out'):
      if not isinstance(getattr(self, field), bool):
        raise ConfigError(f'config.model.{field}={getattr(self, field)!r} must be True or False')
    eps = self.layer_norm_epsilon
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
      raise ConfigError(f'config.model.layer_norm_epsilon={eps!r} must be in (0, 1)')
    if self.final_logits_bias and not self.logits_via_embedding:
      raise ConfigError('config.model.final_logits_bias=True needs logits_via_embedding=True '
                        '(an untied output layer has a bias of its own)')
    for field in ('vocab_size', 'd_model', 'num_heads', 'd_ff', 'max_len'):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f'config.model.{field}={value!r} must be a positive integer')
    for field in ADAPTERS[self.kind].layer_fields:
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f'config.model.{field}={value!r} must be a positive integer '
                          f'for kind={self.kind!r}')
    for rows in ('vocab_size', 'max_len', 'd_ff'):  # the model's largest tables
      elements = getattr(self, rows) * self.d_model
      if elements > MAX_TABLE_ELEMENTS:
        raise ConfigError(f'config.model.{rows}={getattr(self, rows)} x d_model={self.d_model} '
                          f'is a table of {elements:,} numbers: more than {MAX_TABLE_ELEMENTS:,} '
                          '(2^31 - 1, the most an int32 index reaches) cannot be allocated '
                          'and indexed on every backend')
    if self.d_model % self.num_heads:
      raise ConfigError(f'config.model.d_model={self.d_model} is not divisible by '
                        f'config.model.num_heads={self.num_heads}')
    if self.positional_encoding == 'rope' and self.head_dim % 2:
      raise ConfigError(f'config.model.positional_encoding=rope needs an even head size, '
                        f'got d_model/num_heads={self.head_dim}')
    for field in ('dropout_rate', 'attention_dropout_rate', 'activation_dropout_rate'):
      value = getattr(self, field)
      if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f'config.model.{field}={value!r} must be in [0, 1)')
    self._validate_attention_impl()

  def _validate_attention_impl(self) -> None:
    """Refuses attention_impl combinations its row of `attention.IMPLEMENTATIONS` cannot
    compute exactly (the masks are checked when the layer sees them)."""
    dropout = self.dropout_rng_impl if self.attention_dropout_rate > 0.0 else None
    problem = IMPLEMENTATIONS[self.attention_impl].refusal(
        f'config.model.attention_impl={self.attention_impl!r}', dtype=self.dtype,
        dropout_rng_impl=dropout, head_dim=self.head_dim)
    if problem:
      raise ConfigError(problem)
