"""The schema of every config section but the model's (`model.ModelConfig`): one dataclass per
section with each field's default, one-line doc and bounds, and the checks between sections.

configs/base.py builds the ConfigDict every preset starts from out of these defaults;
`validate_sections(config)` turns a config into the section objects (an unknown field gets a
'did you mean', a bad value one line naming it) and `check_across` holds the rules that join
two sections. What depends on the machine (devices, processes) is workdir.config_io's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from autoregressive import strategies
from common.accelerator import MATMUL_PRECISIONS
from common.dtype_limits import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX, UINT32_MAX
from common.errors import ConfigError
from common.schema import (
  DOC,
  Schema,
  did_you_mean,
  documented,
  in_unit,
  is_int,
  is_number,
  require,
)
from common.tokens import PRETRAINED_TOKENIZERS, SENTENCEPIECE_MODEL_TYPES, TOKENIZERS
from model.config import ModelConfig
from model.kinds import adapter_of
from model.partitioning import DEFAULT_RULES, LOGICAL_AXES, MESH_AXES, Rules
from optim import DECAYING, OPTIMIZERS, SCHEDULES, WEIGHT_DECAY_MASKS  # the tables' rows

MIN_MAX_LENGTH = 2  # a token and its EOS
UINT32 = 'uint32'  # field metadata: an int used as a uint32 (a PRNG seed), not an int32


def _check_bools(section: Schema) -> None:
  for field in dataclasses.fields(section):
    value = getattr(section, field.name)
    require(field.type != 'bool' or isinstance(value, bool),
            f'{section.dotted(field.name)}={value!r} must be True or False')


def _check_positive(section: Schema, names) -> None:
  for name in names:
    value = getattr(section, name)
    require(is_int(value) and value > 0,
            f'{section.dotted(name)}={value!r} must be a positive integer')


# The fields that name your own files, one per split, and the datasets that read them.
PARALLEL_TEXT_FILES = ('train_files', 'eval_files', 'test_files')
FILE_DATASETS = ('parallel_text', 'text_files')


@dataclasses.dataclass(frozen=True)
class DataConfig(Schema):
  """`config.data`: the dataset, the tokenizer and how examples become rows."""
  SECTION = 'data'
  dataset: str = documented('multi30k', "a tfds name, a bundled corpus (multi30k, "
                            "tiny_shakespeare), or your own files: 'parallel_text' "
                            "(translation) or 'text_files' (a language model), the *_files")
  data_dir: str | None = documented(None, 'tfds data dir (None: $TFDS_DATA_DIR or '
                                    '~/tensorflow_datasets)')
  source_lang: str = documented('en', "the source side's feature (translation)")
  target_lang: str = documented('de', "the target side's feature (translation)")
  tokenizer: str = documented('sentencepiece', 'trained on the train split and saved in the '
                              "workdir; marian, huggingface: an imported model's",
                              choices=TOKENIZERS + PRETRAINED_TOKENIZERS)
  vocab_size: int = documented(8000, 'sentencepiece pieces (at most model.vocab_size)')
  max_length: int = documented(64, 'tokens per example (per packed row when packing)')
  packing: bool = documented(True, 'several examples per row, apart by segment ids')
  eval_split: str = documented('validation', 'the split evaluated during training')
  test_split: str = documented('test', 'the held-out split')
  train_files: str | None = documented(None, "parallel_text: 'SRC_FILE,TGT_FILE'; "
                                       "text_files: 'FILE[,FILE...]'")
  eval_files: str | None = documented(None, 'the same for eval_split')
  test_files: str | None = documented(None, 'the same for test_split')
  num_workers: int = documented(0, 'Grain worker processes (0 = in-process)')
  packing_window: int = documented(1024, 'examples packed together (first-fit decreasing), '
                                   'per process')
  tokenizer_model_type: str = documented('bpe', "sentencepiece model ('bpe': the paper's)",
                                         choices=SENTENCEPIECE_MODEL_TYPES)
  tokenizer_max_sentences: int = documented(1_000_000, 'sentences sampled to train '
                                            'sentencepiece (a pair gives two; 0 = all)')
  subword_sampling_alpha: float = documented(
      0.0, 'sample a segmentation of each training example each time it is read (Kudo 2018; '
      'BPE-dropout for bpe: the merge-dropout rate); 0 = off, the cached ids')
  subword_sampling_nbest: int = documented(-1, 'unigram sampling: from the n best (-1 = all)')

  def validate(self) -> None:
    super().validate()
    _check_bools(self)
    require(is_int(self.max_length) and self.max_length >= MIN_MAX_LENGTH,
            f'config.data.max_length={self.max_length!r} must be an integer >= {MIN_MAX_LENGTH}')
    _check_positive(self, ('packing_window',))
    for name in ('num_workers', 'tokenizer_max_sentences'):
      value = getattr(self, name)
      require(is_int(value) and value >= 0, f'config.data.{name}={value!r} must be an integer >= 0')
    for name in PARALLEL_TEXT_FILES:  # read by no other dataset: a typo'd run trained on it
      require(self.dataset in FILE_DATASETS or getattr(self, name) is None,
              f'config.data.{name} applies only to dataset=parallel_text or text_files '
              f'(dataset={self.dataset!r} reads no files)')
    alpha = self.subword_sampling_alpha
    require(is_number(alpha) and 0 <= alpha < 1,
            f'config.data.subword_sampling_alpha={alpha!r} must be in [0, 1)')
    nbest = self.subword_sampling_nbest
    require(is_int(nbest) and (nbest == -1 or nbest >= 1),
            f'config.data.subword_sampling_nbest={nbest!r} must be -1 (all) or >= 1')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Schema):
  """`config.optimizer`: Adam(W), its learning-rate schedule and gradient clipping."""
  SECTION = 'optimizer'
  name: str = documented('adam', 'Adam (the paper), AdamW (decoupled weight decay), or Muon '
                         'for the layers\' matrices and Adam for the rest (optim/optimizers.py)',
                         choices=OPTIMIZERS)
  learning_rate: float = documented(1.0, "the peak, or the factor of 'rsqrt' (the paper: 1)")
  schedule: str = documented('rsqrt', "'rsqrt': d_model^-0.5 * min(step^-0.5, "
                             'step * warmup^-1.5), the paper', choices=SCHEDULES)
  warmup_steps: int = documented(4000, 'steps of warm-up to the peak')
  b1: float = documented(0.9, "Adam's beta1")
  b2: float = documented(0.98, "Adam's beta2 (the paper: 0.98)")
  eps: float = documented(1e-9, "Adam's epsilon (the paper: 1e-9)")
  weight_decay: float = documented(0.0, 'decoupled weight decay (needs name='
                                   f'{" or ".join(DECAYING)})')
  weight_decay_mask: str = documented('ndim', "what decays: 'ndim' (>= 2-D) or 'matrices' "
                                      '(optim/optimizers.py)', choices=WEIGHT_DECAY_MASKS)
  grad_clip_norm: float = documented(0.0, 'clip the global gradient norm (0 = no clipping)')
  min_learning_rate_ratio: float = documented(0.1, 'cosine and wsd floor, as a fraction of '
                                              'the peak')
  decay_fraction: float = documented(0.2, "wsd: the last share of num_steps, decaying "
                                     'linearly from the peak to the floor')

  def validate(self) -> None:
    super().validate()
    require(is_number(self.learning_rate) and self.learning_rate >= FLOAT32_TINY,
            f'config.optimizer.learning_rate={self.learning_rate!r} must be a positive number '
            f'(at least {FLOAT32_TINY:.4g}, the smallest normal float32)')
    require(is_int(self.warmup_steps) and self.warmup_steps >= 0,
            f'config.optimizer.warmup_steps={self.warmup_steps!r} must be an integer >= 0')
    require(self.schedule != 'rsqrt' or self.warmup_steps > 0,
            'config.optimizer.warmup_steps must be > 0 for schedule=rsqrt')
    for name in ('b1', 'b2'):
      value = getattr(self, name)
      require(in_unit(value), f'config.optimizer.{name}={value!r} must be in [0, 1) (also as a '
                              'float32, where 1 - 1e-9 is 1)')
    require(is_number(self.eps) and self.eps >= FLOAT32_TINY,
            f'config.optimizer.eps={self.eps!r} must be at least {FLOAT32_TINY:.4g} (the '
            'smallest normal float32; a smaller one is 0 there)')
    for name in ('weight_decay', 'grad_clip_norm'):
      value = getattr(self, name)
      require(is_number(value) and value >= 0,
              f'config.optimizer.{name}={value!r} must be a number >= 0')
    require(OPTIMIZERS[self.name].decays or not self.weight_decay,
            f'config.optimizer.weight_decay={self.weight_decay!r} needs '
            f'config.optimizer.name={" or ".join(DECAYING)}')
    require(is_number(self.decay_fraction) and 0 < self.decay_fraction <= 1,
            f'config.optimizer.decay_fraction={self.decay_fraction!r} must be in (0, 1]')
    require(in_unit(self.min_learning_rate_ratio, closed=True),
            f'config.optimizer.min_learning_rate_ratio={self.min_learning_rate_ratio!r} '
            'must be in [0, 1]')


@dataclasses.dataclass(frozen=True)
class TrainConfig(Schema):
  """`config.train`: the loop (steps, batch, evaluation, checkpoints, logs) and its devices."""
  SECTION = 'train'
  num_steps: int = documented(100_000, 'optimizer updates of the run')
  batch_size: int = documented(256, 'global, in sequences (packed rows when packing)')
  grad_accum_steps: int = documented(1, 'micro-batches summed into one update')
  label_smoothing: float = documented(0.1, 'epsilon_ls of the loss (the paper: 0.1)')
  z_loss: float = documented(0.0, 'weight of log(Z)^2 added to the loss per token (PaLM: '
                             '1e-4); 0 = none')
  rdrop_alpha: float = documented(0.0, 'R-Drop: two dropout passes per batch, alpha x the '
                                  'symmetric KL between them added (the paper: 5 for '
                                  'translation); 0 = one pass')
  ema_decay: float = documented(0.0, 'a moving average of the parameters (e.g. 0.999), kept '
                                'and checkpointed; evaluation and decoding use it; 0 = none')
  eval_every_steps: int = documented(1000, 'steps between evaluations (loss, BLEU)')
  num_eval_batches: int | None = documented(None, 'batches an evaluation reads (None = the '
                                            'whole split)')
  checkpoint_every_steps: int = documented(1000, 'steps between checkpoints')
  max_checkpoints: int = documented(3, 'checkpoints kept (the newest)')
  log_every_steps: int = documented(50, 'steps between progress lines')
  seed: int = documented(0, 'PRNG seed of the parameters, dropout and data order',
                         **{UINT32: True})
  # A checkpoint whose data-iterator state is missing resumes with a fresh iterator (the batches
  # then differ from an uninterrupted run); False: such a checkpoint stops the run.
  allow_fresh_data_iterator: bool = documented(False, 'resume a checkpoint that lacks the data '
                                               "iterator's position (other batches)")
  # 'default' leaves the backend's fast TF32/bf16-pass default (or
  # $JAX_DEFAULT_MATMUL_PRECISION) alone; CPUs compute float32 matmuls in float32 anyway.
  matmul_precision: str = documented('default', 'float32 matmuls on GPU/TPU (highest: true '
                                     'float32)', choices=MATMUL_PRECISIONS)
  deterministic: bool = documented(False, 'GPU: deterministic XLA ops, so a resume is bitwise '
                                   'exact (slower)')
  profile_steps: str = documented('', "'START,END': a JAX profiler trace of those steps in "
                                  'DIR/profile')
  dry_run: bool = documented(False, 'print the per-device memory of the train step and exit '
                             '(no data)')
  init_from: str = documented('', "a workdir (import.py's, or a trained one) whose model, "
                              'tokenizer and newest parameters start this run')

  def validate(self) -> None:
    super().validate()
    _check_positive(self, ('num_steps', 'batch_size', 'grad_accum_steps', 'eval_every_steps',
                           'checkpoint_every_steps', 'max_checkpoints', 'log_every_steps'))
    require(is_int(self.seed) and 0 <= self.seed <= UINT32_MAX,
            f'config.train.seed={self.seed!r} must be an integer in [0, {UINT32_MAX}] (a 32-bit '
            'PRNG seed)')
    least = self.num_eval_batches
    require(least is None or (is_int(least) and least > 0),
            f'config.train.num_eval_batches={least!r} must be a positive integer or None (the '
            'whole split)')
    _check_bools(self)
    try:
      parse_profile_steps(self.profile_steps)
    except ValueError as e:
      raise ConfigError(f'config.train.profile_steps: {e}') from None
    require(in_unit(self.label_smoothing),
            f'config.train.label_smoothing={self.label_smoothing!r} must be in [0, 1) (also as '
            'a float32)')
    require(is_number(self.z_loss) and self.z_loss >= 0,
            f'config.train.z_loss={self.z_loss!r} must be a number >= 0')
    require(is_number(self.rdrop_alpha) and 0 <= self.rdrop_alpha < float('inf'),
            f'config.train.rdrop_alpha={self.rdrop_alpha!r} must be a finite number >= 0')
    require(in_unit(self.ema_decay),
            f'config.train.ema_decay={self.ema_decay!r} must be in [0, 1) (also as a float32)')


def parse_profile_steps(value: str) -> tuple[int, int] | None:
  """'START,END' -> (START, END), 1 <= START <= END; '' -> None. Raises ValueError."""
  if value is None or (isinstance(value, str) and not value.strip()):
    return None
  if not isinstance(value, str):
    raise ValueError(f'{value!r} is not START,END (two step numbers)')
  parts = value.split(',')
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f'{value!r} is not START,END (two step numbers)')
  start, end = (int(p) for p in parts)
  if not 1 <= start <= end:
    raise ValueError(f'{value!r} needs 1 <= START <= END')
  return start, end


class _DecodeRules(Schema):
  """What config.decode checks beyond each field's bounds."""
  SECTION = 'decode'

  def validate(self) -> None:
    super().validate()
    require(is_int(self.num_eval_sentences) and self.num_eval_sentences >= 0,
            f'config.decode.num_eval_sentences={self.num_eval_sentences!r} must be an integer '
            '>= 0')
    values = dataclasses.asdict(self)
    try:  # every strategy's settings: the one config.decode chooses, and the others'
      for name in strategies.TABLE:
        strategies.from_config(values, strategy=name)
    except ValueError as e:
      raise ConfigError(str(e)) from None


# `config.decode`: the validation BLEU's decoding, and decode.py's defaults. Its fields are made
# from the decoding settings of `autoregressive.strategies` that a config holds (defaults, docs
# and bounds live there; decode.py's flags and `Session` read them too), plus
# num_eval_sentences: a new row's `in_config` setting is a field here with nothing written.
DecodeConfig = dataclasses.make_dataclass(
    'DecodeConfig',
    [(name, field.type, documented(field.default, field.metadata[DOC]))
     for name, (_, field) in strategies.config_fields().items()]
    + [('num_eval_sentences', int, documented(1014, 'sentences the validation BLEU decodes'))],
    bases=(_DecodeRules,), frozen=True)
DecodeConfig.__module__ = __name__  # (make_dataclass's `module=` is Python 3.12's)


@dataclasses.dataclass(frozen=True)
class MeshConfig(Schema):
  """`config.mesh`: devices as (data, fsdp, tensor) and the logical-axis rules (training/mesh.py
  builds the mesh; docs/guide.md's "Scaling" says when to use which)."""
  SECTION = 'mesh'
  data: int = documented(-1, 'devices splitting the batch (-1: every device the others leave)')
  fsdp: int = documented(1, "devices splitting the batch and the parameters, gradients and "
                         "optimizer state (along 'embed')")
  tensor: int = documented(1, 'devices splitting heads, feed-forward units and the vocabulary '
                           '(Megatron style)')
  rules: Mapping[str, str] = documented(
      doc="logical axis -> mesh axes ('' none, 'data,fsdp' both)", factory=lambda: dict(
          DEFAULT_RULES))

  @property
  def sizes(self) -> tuple[int, int, int]:
    return self.data, self.fsdp, self.tensor

  def validate(self) -> None:
    super().validate()
    for axis, size in zip(MESH_AXES, self.sizes, strict=True):
      require(is_int(size) and (size >= 1 or size == -1),
              f'config.mesh.{axis}={size!r} must be a positive integer or -1')
    require(self.sizes.count(-1) <= 1,
            f'config.mesh: only one of data/fsdp/tensor may be -1, got {list(self.sizes)}')
    for name, value in dict(self.rules or {}).items():
      require(name in LOGICAL_AXES,
              f'config.mesh.rules.{name}: unknown logical axis; known: {list(LOGICAL_AXES)}')
      require(isinstance(value, str), f'config.mesh.rules.{name}={value!r} must be a string of '
                                      "mesh axes (e.g. 'fsdp', 'data,fsdp' or '' for none)")
      unknown = [a for a in _axes(value) if a not in MESH_AXES]
      require(not unknown, f'config.mesh.rules.{name}={value!r}: {unknown} are not mesh axes '
                           f'{list(MESH_AXES)}')

  def rule_table(self) -> Rules:
    """((logical name, mesh axes or None), ...): the rules, unset names as DEFAULT_RULES."""
    table = {**DEFAULT_RULES, **dict(self.rules or {})}
    return tuple((name, _axes(value) or None) for name, value in table.items())


def _axes(value: str) -> tuple[str, ...]:
  return tuple(a.strip() for a in value.split(',') if a.strip())


# Every section, in the order of configs/base.py and of --show_config.
SECTIONS: dict[str, type[Schema]] = {
    'model': ModelConfig, 'data': DataConfig, 'optimizer': OptimizerConfig,
    'train': TrainConfig, 'decode': DecodeConfig, 'mesh': MeshConfig,
}
OPTIONAL_SECTIONS = ('mesh',)  # absent: every device on 'data' (configs from before the mesh)


def validate_sections(config) -> dict[str, Schema]:
  """Every section of `config` (a ConfigDict or dict) through its schema -> {name: section};
  raises `ConfigError` naming the first bad field. Checks no rule between sections."""
  for name in SECTIONS:
    require(name in config or name in OPTIONAL_SECTIONS,
            f'config has no {name!r} section (start from configs/base.py)')
  unknown = sorted(set(config.keys()) - set(SECTIONS))
  if unknown:
    hint = did_you_mean(unknown[0], [(name,) for name in SECTIONS]) or f'known: {list(SECTIONS)}'
    raise ConfigError(f'config has unknown section(s) {unknown}; {hint}')
  check_numbers(config.to_dict() if hasattr(config, 'to_dict') else dict(config))
  return {name: schema.from_config(config.get(name)) for name, schema in SECTIONS.items()}


def check_across(sections: Mapping[str, Schema]) -> None:
  """The rules between sections that need no devices (those are workdir.config_io's)."""
  model, data = sections['model'], sections['data']
  target_len = adapter_of(model).target_length(data.max_length)
  require(model.positional_encoding == 'rope' or target_len <= model.max_len,
          f'config.data.max_length={data.max_length} needs config.model.max_len >= {target_len} '
          f'(positional_encoding={model.positional_encoding!r})')
  optimizer, train = sections['optimizer'], sections['train']
  decay = round(optimizer.decay_fraction * train.num_steps)
  require(optimizer.schedule != 'wsd' or optimizer.warmup_steps + decay <= train.num_steps,
          f'config.optimizer.warmup_steps={optimizer.warmup_steps} and decay_fraction='
          f'{optimizer.decay_fraction} ({decay} steps) do not fit in config.train.num_steps='
          f'{train.num_steps} (schedule=wsd)')
  require(is_int(data.vocab_size) and 0 < data.vocab_size <= model.vocab_size,
          f'config.data.vocab_size={data.vocab_size!r} must be in [1, config.model.vocab_size='
          f'{model.vocab_size}]')
  # Sampled segmentations: a sentencepiece model's, for translation's sentence pairs (a
  # language model's stream is cut into blocks wherever the pieces fall).
  require(not data.subword_sampling_alpha or (
      data.tokenizer == 'sentencepiece' and adapter_of(model).batch_layout == 'sentence_pairs'),
          f'config.data.subword_sampling_alpha={data.subword_sampling_alpha} needs '
          f"config.data.tokenizer='sentencepiece' and a translation model (tokenizer="
          f'{data.tokenizer!r}, model.kind={model.kind!r})')


def check_numbers(values: Mapping[str, Any], prefix: str = 'config') -> None:
  """Every number in the config fits the type it is used in: floats finite as a float32
  (`1e308` is finite in Python, inf there: `learning_rate=1e308` would stop at step 2 on a
  NaN loss), ints within int32 (steps, sizes and indices are int32 arrays; a field marked
  UINT32, the seed, is checked by its section)."""
  wide = {f'config.{name}.{f.name}' for name, schema in SECTIONS.items()
          for f in dataclasses.fields(schema) if f.metadata.get(UINT32)}
  for key, value in values.items():
    name = f'{prefix}.{key}'
    if isinstance(value, Mapping):
      check_numbers(value, name)
    elif isinstance(value, float) and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
      raise ConfigError(f'{name}={value!r} must be a finite number (as a float32: at most '
                        f'{FLOAT32_MAX:.4g} in magnitude)')
    elif is_int(value) and name not in wide and abs(value) > INT32_MAX:
      raise ConfigError(f'{name}={value} is out of range: at most {INT32_MAX} (an int32)')
