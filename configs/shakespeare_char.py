"""Character-level language model on Tiny Shakespeare (decoder-only).

Presets:
  (none)  nanoGPT's small-CPU settings: 4 layers, 4 heads, d_model 128, block 64, batch 12,
          2000 steps, no dropout, lr 1e-3 cosine to 1e-4 with 100 warmup steps, AdamW
          (0.9, 0.99), weight decay 0.1, grad clip 1.0, pre-norm, GELU, learned positions.
  modern  the same budget with what the language model's ladder kept (`MODERN`; issue 76):
          the warmup-stable-decay schedule, Muon for the layers' matrices and the squared ReLU
          (its figures: bench/results/sweeps.md, "The language model's ladder")
  large   nanoGPT's GPU settings: 6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2,
          5000 steps, and nanoGPT's model choices (see the comment in the preset).
  tiny    seconds-long, for tests.
"""

from configs.base import base_config, set_fields

# What the ladder kept (configs/sweeps/ladder_shakespeare.py, 3 seeds): WSD at the cosine's
# peak, decaying to a tenth over the last fifth of the steps; Muon; ReLU². Dropout and R-Drop
# on top cost more than they gave at ~1.5 passes over the data.
MODERN = {'optimizer.schedule': 'wsd', 'optimizer.name': 'muon', 'model.activation': 'relu2'}
OVERRIDES = {'modern': MODERN}  # the presets that are sweep overrides


def get_config(preset=None):
  config = base_config()
  m = config.model
  m.kind = 'decoder_only'
  m.vocab_size = 66  # 65 characters + pad (id 0)
  m.num_encoder_layers = 0
  m.num_decoder_layers = 4
  m.d_model, m.num_heads, m.d_ff = 128, 4, 512
  m.dropout_rate = 0.0
  m.max_len = 65  # block 64 + the start position
  m.share_embeddings = True
  m.logits_via_embedding = True
  m.positional_encoding = 'learned'
  m.norm_position = 'pre'
  m.activation = 'gelu'
  d = config.data
  d.dataset = 'tiny_shakespeare'
  d.tokenizer = 'char'
  d.vocab_size = 66
  d.max_length = 64
  d.packing = False
  d.source_lang = d.target_lang = 'text'
  o = config.optimizer
  o.name = 'adamw'
  o.schedule = 'cosine'
  o.learning_rate = 1e-3
  o.min_learning_rate_ratio = 0.1
  o.warmup_steps = 100
  o.b1, o.b2, o.eps = 0.9, 0.99, 1e-8
  o.weight_decay = 0.1
  o.grad_clip_norm = 1.0
  t = config.train
  t.num_steps = 2000
  t.batch_size = 12
  t.label_smoothing = 0.0
  t.eval_every_steps = 500
  t.num_eval_batches = 20
  t.checkpoint_every_steps = 500
  t.log_every_steps = 100
  dec = config.decode
  dec.max_new_tokens = 500
  dec.temperature = 0.8
  dec.top_k = 0

  if preset == 'large':
    _large(config)
  elif preset == 'tiny':
    _tiny(config)
  elif preset in OVERRIDES:
    set_fields(config, OVERRIDES[preset])
  elif preset is not None:
    raise ValueError(f'configs/shakespeare_char.py: unknown preset {preset!r}; known: large, '
                     f'tiny, {", ".join(OVERRIDES)}')
  return config


def _large(config) -> None:
  m, d, o, t = config.model, config.data, config.optimizer, config.train
  m.num_decoder_layers, m.num_heads, m.d_model, m.d_ff = 6, 6, 384, 1536
  m.dropout_rate = 0.2
  # nanoGPT's model.py choices, where ours (the paper's) learned slower on a GPU (the CPU
  # proxy in bench/results/shakespeare.md). 'gpt2' init: normal(0.02) kernels and
  # embeddings, residual projections 0.02/sqrt(2 x layers); no sqrt(d_model) on the token
  # embeddings: with it the tokens enter at unit size while the learned positions start at
  # 0.02, so the model is nearly position-blind for its first hundreds of steps; dropout on
  # the attention weights too; AdamW decays kernels and embeddings only (not the fused Q/K/V
  # bias).
  m.init = 'gpt2'
  m.scale_embeddings = False
  m.attention_dropout_rate = 0.2
  # nanoGPT trains in bfloat16 under torch.autocast, which rounds the matmuls' inputs but keeps
  # the residual stream float32; ours in bfloat16 (`--config.model.dtype=bfloat16`, as on a
  # GPU) does the same with this (no effect in float32).
  m.residual_dtype = 'float32'
  o.weight_decay_mask = 'matrices'
  m.max_len = 257
  d.max_length = 256
  t.batch_size = 64
  t.num_steps = 5000
  t.eval_every_steps = 250
  t.num_eval_batches = 200


def _tiny(config) -> None:
  m, d, o, t, dec = config.model, config.data, config.optimizer, config.train, config.decode
  m.num_decoder_layers, m.num_heads, m.d_model, m.d_ff = 2, 2, 32, 64
  m.max_len = 33
  d.max_length = 32
  t.num_steps = 20
  t.batch_size = 8
  t.eval_every_steps = 10
  t.num_eval_batches = 2
  t.checkpoint_every_steps = 10
  t.log_every_steps = 5
  o.warmup_steps = 5
  dec.max_new_tokens = 16
