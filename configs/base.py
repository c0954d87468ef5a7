"""The full config schema shared by every preset.

Every preset starts from `base_config()` and overrides fields, so each one has
every section (model, data, optimizer, train, decode) and every field can be
overridden from the command line (`--config.model.num_heads=4`).
"""

import dataclasses

import ml_collections
from ml_collections import config_dict

from common.tokens import DEFAULT_MIN_NEW_TOKENS
from model.config import ModelConfig
from model.partitioning import DEFAULT_RULES


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # Model: every field, its default and its choices are `model.config.ModelConfig`'s.
  config.model = ml_collections.ConfigDict(dataclasses.asdict(ModelConfig()))
  config.data = _data()
  config.optimizer = _optimizer()
  config.train = _train()
  config.decode = _decode()
  config.mesh = _mesh()
  return config


def _data() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.dataset = 'multi30k'
  d.data_dir = config_dict.placeholder(str)  # default: $TFDS_DATA_DIR or ~/tensorflow_datasets
  d.source_lang = 'en'
  d.target_lang = 'de'
  d.tokenizer = 'sentencepiece'  # 'sentencepiece' | 'char'
  d.vocab_size = 8000
  d.max_length = 64  # tokens per example (per packed row when packing)
  d.packing = True
  d.eval_split = 'validation'
  d.test_split = 'test'
  d.train_files = config_dict.placeholder(str)  # parallel_text: 'SRC_FILE,TGT_FILE'
  d.eval_files = config_dict.placeholder(str)
  d.test_files = config_dict.placeholder(str)
  d.num_workers = 0  # Grain worker processes (0 = in-process)
  d.packing_window = 1024  # examples packed together (first-fit decreasing), per process
  d.tokenizer_model_type = 'bpe'  # sentencepiece model: 'bpe' (the paper) | 'unigram'
  d.tokenizer_max_sentences = 1_000_000  # train examples sampled to train sentencepiece (0 = all)
  return d


def _optimizer() -> ml_collections.ConfigDict:
  o = ml_collections.ConfigDict()
  o.name = 'adam'  # 'adam' | 'adamw'
  o.learning_rate = 1.0  # multiplies the schedule ('rsqrt' is the paper's)
  o.schedule = 'rsqrt'  # 'rsqrt' | 'cosine' | 'constant'
  o.warmup_steps = 4000
  o.b1 = 0.9
  o.b2 = 0.98
  o.eps = 1e-9
  o.weight_decay = 0.0
  o.weight_decay_mask = 'ndim'  # AdamW decays: 'ndim' (>= 2-D) | 'matrices' (training/optim.py)
  o.grad_clip_norm = 0.0  # 0 = no clipping
  o.min_learning_rate_ratio = 0.1  # cosine floor, as a fraction of the peak
  return o


def _train() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.num_steps = 100_000
  t.batch_size = 256  # global, in sequences (packed rows when packing)
  t.grad_accum_steps = 1
  t.label_smoothing = 0.1
  t.eval_every_steps = 1000
  t.num_eval_batches = config_dict.placeholder(int)  # None = the whole split
  t.checkpoint_every_steps = 1000
  t.max_checkpoints = 3
  t.log_every_steps = 50
  t.seed = 0
  # Resume from a checkpoint whose data-iterator state is missing, with a fresh iterator (the
  # batches then differ from an uninterrupted run); False: such a checkpoint stops the run.
  t.allow_fresh_data_iterator = False
  # float32 matmul precision on GPU/TPU: 'default' (the backend's fast TF32/bf16-pass default,
  # or $JAX_DEFAULT_MATMUL_PRECISION when set) | 'high' | 'highest' (true float32). CPU: ignored.
  t.matmul_precision = 'default'
  t.deterministic = False  # GPU: deterministic XLA ops, so a resume is bitwise exact (slower)
  t.profile_steps = ''  # 'START,END': a JAX profiler trace of those steps in DIR/profile
  t.dry_run = False  # True: print the per-device memory of the train step and exit (no data)
  return t


def _decode() -> ml_collections.ConfigDict:
  dec = ml_collections.ConfigDict()
  dec.beam_size = 4
  dec.alpha = 0.6
  dec.max_new_tokens = 128  # tokens decoding may generate (at most model.max_len)
  dec.min_new_tokens = DEFAULT_MIN_NEW_TOKENS  # tokens before EOS may end an output (0: any)
  dec.num_eval_sentences = 1014
  dec.batch_size = 64
  dec.temperature = 1.0
  dec.top_k = 0  # 0 = no top-k
  return dec


def _mesh() -> ml_collections.ConfigDict:
  """Devices as (data, fsdp, tensor): see training/mesh.py and the README's Scaling section."""
  m = ml_collections.ConfigDict()
  m.data = -1  # -1: every device not used by the other axes
  m.fsdp = 1  # parameters, gradients and optimizer state split along 'embed'
  m.tensor = 1  # heads, feed-forward units and vocabulary split (Megatron style)
  # Logical axis name -> mesh axes ('' none, 'data,fsdp' both), e.g. --config.mesh.rules.vocab=''
  m.rules = ml_collections.ConfigDict(dict(DEFAULT_RULES))
  return m

