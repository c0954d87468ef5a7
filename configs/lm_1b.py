"""A ~1B-parameter decoder-only language model on LM1B, sized to be sharded over many devices.

GPT-3 XL's width at 18 layers (it has 24): d_model 2048, 16 heads of 128, d_ff 8192, pre-LN,
GELU, GPT-2 init (normal 0.02, residual projections 0.02/sqrt(2 x layers), no sqrt(d_model)
on the token embeddings), tied input/output embedding, learned positions, a 32768-piece
sentencepiece vocabulary: 975,659,008 parameters, 10.9 GiB of float32 parameters + Adam
moments per replica, which `config.mesh.fsdp` and `tensor` split (per-device memory:
bench/results/sharding.md).
bfloat16 compute (parameters stay float32), `scan_layers` (one compiled layer: the compile time
does not grow with depth, and the stacked [layers, ...] parameters shard like one layer's),
`remat` (the activations of 32 rows of 1024 would take 247 GiB a device at fsdp=8).

Every dimension a mesh axis splits is a power of two (vocab 32768, d_model 2048 and d_ff 8192
divide by any fsdp or tensor size up to 2048, the 16 heads by tensor up to 16), and the batch of
256 rows divides over up to 256 data x fsdp devices. Rows are 1024
tokens (`data.max_length` 1023 + the start token), the LM pipeline's random blocks of the
concatenated stream: 262k tokens a step.

Data: tfds `lm1b` (~0.8B words; train / test; its one feature `text` makes it a language-model
dataset), prepared once with TensorFlow:
`tfds build lm1b --data_dir=$TFDS_DATA_DIR --file_format=array_record`. The LM pipeline
tokenizes a whole split into one in-memory stream when it starts (about 1B tokens, 4 GB a
process, for the train split). See docs/guide.md's
"Scaling" for the mesh flags, and check the memory first:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python train.py \\
      --config=configs/lm_1b.py --config.mesh.fsdp=8 --config.train.dry_run=True
"""

from configs.base import base_config


def get_config(preset=None):
  if preset is not None:
    raise ValueError(f'configs/lm_1b.py: unknown preset {preset!r}; it has none')
  config = base_config()
  m = config.model
  m.kind = 'decoder_only'
  m.vocab_size = 32768
  m.num_encoder_layers = 0
  m.num_decoder_layers = 18
  m.d_model, m.num_heads, m.d_ff = 2048, 16, 8192
  m.dropout_rate = m.attention_dropout_rate = 0.0  # one pass over the data: no dropout
  m.max_len = 1024
  m.share_embeddings = m.logits_via_embedding = True
  m.positional_encoding = 'learned'
  m.norm_position = 'pre'
  m.activation = 'gelu'
  m.init = 'gpt2'
  m.scale_embeddings = False
  m.dtype = 'bfloat16'
  m.scan_layers = True
  m.remat = True  # recompute each layer in the backward pass: 18.7 GiB of temporaries, not 247
  d = config.data
  d.dataset = 'lm1b'  # source_lang / target_lang stay unset ('en' / 'de'), so 'text' is read
  d.tokenizer = 'sentencepiece'
  d.vocab_size = 32768
  d.max_length = 1023  # + the start token = rows of 1024, the position table's size
  d.packing = False  # the LM pipeline cuts blocks from one stream: nothing to pack
  d.eval_split = d.test_split = 'test'  # lm1b has train and test only
  _optimizer(config.optimizer)
  t = config.train
  t.num_steps = 20_000  # 5.2B tokens, ~6 passes over lm1b's train split
  t.batch_size = 256
  t.label_smoothing = 0.0
  t.eval_every_steps = 1000
  t.num_eval_batches = 20
  t.checkpoint_every_steps = 1000
  t.log_every_steps = 50
  dec = config.decode
  dec.max_new_tokens = 256
  dec.temperature = 0.8
  dec.top_k = 40
  return config


def _optimizer(o) -> None:
  """GPT-3's for its 1.3B model (Brown et al. 2020, Table 2.1, Appendix B): AdamW(0.9, 0.95),
  peak 2e-4, cosine to 10%, weight decay 0.1 (here on matrices only), clip 1.0."""
  o.name = 'adamw'
  o.schedule = 'cosine'
  o.learning_rate = 2e-4
  o.min_learning_rate_ratio = 0.1
  o.warmup_steps = 1000
  o.b1, o.b2, o.eps = 0.9, 0.95, 1e-8
  o.weight_decay = 0.1
  o.weight_decay_mask = 'matrices'
  o.grad_clip_norm = 1.0
