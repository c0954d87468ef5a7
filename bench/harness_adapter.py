"""Our model behind the peers' harness interface (`../shared/bench/peers/jax_encdec_bench.py`).

    python ../shared/bench/peers/jax_encdec_bench.py --impl bench.harness_adapter:make \\
        --impl-path . --configs small --steps small=20 --decode ''

Lets the harness time the Flax WMT example and this codebase with identical batches,
optimizer, loss and timing, so the ratio compares model code only.
"""

import jax.numpy as jnp

from autoregressive import decoding
from model import build_model
from training.losses import smoothed_cross_entropy


class Harnessed:
  def __init__(self, cfg, **model_overrides):
    assert cfg['d'] == cfg['q'], 'our heads are d_model / num_heads'
    self.module = build_model(dict(
        kind='encoder_decoder', vocab_size=cfg['vocab'], num_encoder_layers=cfg['enc_layers'],
        num_decoder_layers=cfg['dec_layers'], d_model=cfg['d'], num_heads=cfg['heads'],
        d_ff=cfg['f'], dropout_rate=cfg['dropout'], attention_dropout_rate=cfg['dropout'],
        max_len=cfg['max_len'], share_embeddings=cfg.get('share_embeddings', True),
        logits_via_embedding=cfg.get('logits_via_embedding', True), **model_overrides))
    self.src = 'this checkout (model/transformer.py)'

  def init(self, rng, inputs, targets):
    return self.module.init(rng, inputs, targets)['params']

  def apply(self, params, inputs, targets, dropout_rng):
    return self.module.apply({'params': params}, inputs, targets, deterministic=False,
                             rngs={'dropout': dropout_rng})

  def loss(self, logits, targets, label_smoothing):
    weights = (targets > 0).astype(jnp.float32)
    losses = smoothed_cross_entropy(logits, targets, label_smoothing)
    return (losses * weights).sum() / weights.sum()

  def beam_search(self, params, inputs, beam_size, max_decode_len, eos_id):
    tokens, _ = decoding.beam_search_decode(self.module, params, inputs, beam_size=beam_size,
                                            alpha=0.6, max_new_tokens=max_decode_len,
                                            eos_id=eos_id)
    return tokens


def make(cfg):
  return Harnessed(cfg)
