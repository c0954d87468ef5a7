"""The paper's base model on WMT14 En->De (Vaswani et al. 2017, Table 3, row 'base').

N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, label smoothing 0.1, shared 37000-token
vocabulary, Adam(0.9, 0.98, 1e-9), warmup 4000 with the rsqrt schedule, 100k steps of
about 25000 source + 25000 target tokens (here: 104 packed rows of 256 tokens; set
`train.batch_size`, `train.grad_accum_steps` and `data.max_length` for your hardware).
"""

from configs.base import base_config


def get_config(preset=None):
  config = base_config()
  m = config.model
  m.kind = 'encoder_decoder'
  m.vocab_size = 37000
  m.num_encoder_layers = m.num_decoder_layers = 6
  m.d_model, m.d_ff, m.num_heads = 512, 2048, 8
  m.dropout_rate = 0.1
  m.max_len = 256
  m.share_embeddings = m.logits_via_embedding = True
  d = config.data
  d.dataset = 'wmt14_translate/de-en'
  d.source_lang, d.target_lang = 'en', 'de'
  d.vocab_size = 37000
  d.max_length = 256
  d.eval_split = 'validation'
  d.test_split = 'test'
  o = config.optimizer
  o.learning_rate, o.schedule, o.warmup_steps = 1.0, 'rsqrt', 4000
  o.b1, o.b2, o.eps = 0.9, 0.98, 1e-9
  t = config.train
  t.num_steps = 100_000
  # 104 rows x 256 = 26.6k token slots, ~25k real tokens per side at the ~96% packing
  # efficiency measured on Multi30k (the paper: ~25k); divisible by 8 devices.
  t.batch_size = 104
  t.label_smoothing = 0.1
  t.eval_every_steps = 5000
  t.checkpoint_every_steps = 5000
  t.max_checkpoints = 20  # the paper averages the last 5 (base) / 20 (big) checkpoints
  config.decode.beam_size, config.decode.alpha = 4, 0.6
  config.decode.max_new_tokens = 256
  config.decode.num_eval_sentences = 3000
  return config
