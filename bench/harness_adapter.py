"""Our model behind the peers' harness interface (`../shared/bench/peers/jax_encdec_bench.py`).

    python ../shared/bench/peers/jax_encdec_bench.py --impl bench.harness_adapter:make \\
        --impl-path . --configs small --steps small=20 --decode ''

Lets the harness time the Flax WMT example and this codebase with identical batches,
optimizer, loss and timing, so the ratio compares model code only.
"""

import jax.numpy as jnp
from flax import nnx

from autoregressive.strategies.beam import beam_search_decode
from model import ModelConfig, bind, build_model, params_of
from training.losses import smoothed_cross_entropy


class Harnessed:
  """The harness's (params, ...) functions over our NNX model: `params` is the pure dict
  (`model.params_of`), bound to the model inside the harness's jitted functions."""

  def __init__(self, cfg, **model_overrides):
    assert cfg['d'] == cfg['q'], 'our heads are d_model / num_heads'
    self.config = ModelConfig.from_config(dict(
        kind='encoder_decoder', vocab_size=cfg['vocab'], num_encoder_layers=cfg['enc_layers'],
        num_decoder_layers=cfg['dec_layers'], d_model=cfg['d'], num_heads=cfg['heads'],
        d_ff=cfg['f'], dropout_rate=cfg['dropout'], attention_dropout_rate=cfg['dropout'],
        max_len=cfg['max_len'], share_embeddings=cfg.get('share_embeddings', True),
        logits_via_embedding=cfg.get('logits_via_embedding', True), **model_overrides))
    self.src = 'this checkout (model/transformer.py)'

  def init(self, rng, inputs, targets):
    del inputs, targets  # NNX modules initialise from their config alone
    return params_of(build_model(self.config, rngs=nnx.Rngs(params=rng)))

  def apply(self, params, inputs, targets, dropout_rng):
    return bind(self.config, params)(inputs, targets, deterministic=False,
                                     dropout_rng=dropout_rng)

  def loss(self, logits, targets, label_smoothing):
    weights = (targets > 0).astype(jnp.float32)
    losses = smoothed_cross_entropy(logits, targets, label_smoothing)
    return (losses * weights).sum() / weights.sum()

  def beam_search(self, params, inputs, beam_size, max_decode_len, eos_id):
    # The beam row's loop, not its `search`: the harness jits this method, and `search`
    # returns NumPy arrays (the token door is for eager callers).
    tokens, _ = beam_search_decode(bind(self.config, params), inputs,
                                   beam_size=beam_size, alpha=0.6,
                                   max_new_tokens=max_decode_len, eos_id=eos_id)
    return tokens


def make(cfg):
  return Harnessed(cfg)
