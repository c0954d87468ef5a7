"""The bundled-data CPU run: Multi30k En->De, a small Transformer.

700 steps of 32 packed rows of 64 tokens (~125 sentence pairs, ~2000 target tokens a step,
about 3 epochs): sized for ~15 minutes on a 2-core CPU with a ~110 GFLOP/s f32 matmul.
`configs/multi30k.py` trains a smaller model longer, and better.

`python train.py --workdir=DIR` uses this file. Presets:
  (none)  the default run
  tiny    a seconds-long run for tests and smoke checks
"""

from configs.base import base_config


def get_config(preset=None):
  config = base_config()
  m = config.model
  m.kind = 'encoder_decoder'
  m.vocab_size = 8000
  m.num_encoder_layers = m.num_decoder_layers = 3
  m.d_model, m.d_ff, m.num_heads = 256, 1024, 4
  m.dropout_rate = 0.1
  m.attention_dropout_rate = 0.0
  m.max_len = 128
  m.share_embeddings = m.logits_via_embedding = True
  d = config.data
  d.dataset = 'multi30k'
  d.source_lang, d.target_lang = 'en', 'de'
  d.tokenizer = 'sentencepiece'
  d.vocab_size = 8000
  d.max_length = 64
  d.packing = True
  o = config.optimizer
  o.name = 'adam'
  o.schedule = 'rsqrt'
  o.learning_rate = 0.5  # peak 0.5 * 256^-0.5 * 250^-0.5 = 2.0e-3 at step 250
  o.warmup_steps = 250
  t = config.train
  t.num_steps = 700
  t.batch_size = 32
  t.label_smoothing = 0.1
  t.eval_every_steps = 350
  t.checkpoint_every_steps = 100
  t.max_checkpoints = 3
  t.log_every_steps = 25
  dec = config.decode
  dec.beam_size, dec.alpha = 4, 0.6
  dec.max_new_tokens = 64
  dec.num_eval_sentences = 256

  if preset == 'tiny':
    m.vocab_size = d.vocab_size = 512
    # One layer each: a smoke run's train.py takes ~2/3 the CPU of two layers' (its train
    # step, initialisation and beam search compile faster). Stacking has its own tests
    # (tests/model/test_model.py's 2+2 model; the suite's scan_layers workdir trains 2+2).
    m.num_encoder_layers = m.num_decoder_layers = 1
    m.d_model, m.d_ff, m.num_heads = 32, 64, 4
    m.max_len = 64
    d.max_length = 32
    o.warmup_steps = 10
    t.num_steps = 20
    t.batch_size = 16
    t.eval_every_steps = 10
    t.num_eval_batches = 2
    t.checkpoint_every_steps = 10
    t.log_every_steps = 5
    dec.beam_size = 2
    dec.max_new_tokens = 32
    dec.num_eval_sentences = 16
  elif preset is not None:
    raise ValueError(f'configs/default.py: unknown preset {preset!r}; known: tiny')
  return config
