"""`get_datasets(config, workdir=...)`: the trainer's one entry point to data."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax

from input_pipeline import pipeline, sources, token_cache, tokenizers
from input_pipeline.errors import DataError


@dataclasses.dataclass
class Datasets:
  """Tokenizer, training iterator and evaluation data of one process.

  Attributes:
    tokenizer: see `input_pipeline.tokenizers`.
    train_iter: infinite `TrainIterator` of per-process batches (dicts of numpy
      arrays `[batch_size // process_count, length]`) with `get_state()` /
      `set_state(state)`.
    batch_size: rows per batch on this process.
    layout: the batches' layout, one of `pipeline.LAYOUTS`.
  """

  tokenizer: tokenizers.Tokenizer
  train_iter: pipeline.TrainIterator
  batch_size: int
  config: Any  # the full ml_collections config
  process_index: int
  process_count: int
  _token_ids: dict = dataclasses.field(default_factory=dict, repr=False)  # split -> TokenIds
  layout: str = pipeline.SENTENCE_PAIRS

  @property
  def is_language_model(self) -> bool:
    return self.layout == pipeline.TEXT_BLOCKS

  def _split(self, split: str | None) -> str:
    return split or self.config.data.eval_split

  def _ids(self, split: str) -> token_cache.TokenIds:
    if split not in self._token_ids:
      self._token_ids[split] = token_cache.token_ids(self.config.data, split, self.tokenizer)
    return self._token_ids[split]

  def _stream(self, split: str):
    ids = self._ids(split)
    return ids.stream(ids.keys[0])

  def eval_batches(self, split: str | None = None) -> Iterator[dict[str, Any]]:
    """Padded batches over this process's shard of `split` (default: eval_split).

    Every example of the split is in exactly one batch of exactly one process;
    rows past the end are all zeros (no loss weight). Every process yields
    the same number of batches.
    """
    split = self._split(split)
    data = self.config.data
    if self.is_language_model:
      return pipeline.lm_eval(self._stream(split), max_length=data.max_length,
                              batch_size=self.batch_size, process_index=self.process_index,
                              process_count=self.process_count)
    return pipeline.translation_eval(
        self._ids(split), eos_id=self.tokenizer.eos_id, max_length=data.max_length,
        batch_size=self.batch_size, process_index=self.process_index,
        process_count=self.process_count)

  def num_eval_batches(self, split: str | None = None) -> int:
    """How many batches `eval_batches(split)` yields (on every process)."""
    split = self._split(split)
    if self.is_language_model:
      n = len(pipeline.lm_eval_blocks(self._stream(split), self.config.data.max_length)['targets'])
    else:
      n = len(sources.get_source(self.config.data, split))
    return pipeline.num_eval_batches(n, self.batch_size, self.process_count)

  def eval_examples(self, split: str | None = None) -> list[dict[str, str]]:
    """Raw text of every example of `split` (all processes get all of them).

    Translation: [{'source': str, 'target': str}, ...] in file order;
    language model: [{'text': str}, ...].
    """
    return sources.split_texts(self.config.data, self._split(split))


def _process(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise DataError(f'process_index={process_index} is not in [0, {process_count})')
  return process_index, process_count


def get_datasets(config, *, workdir: str | None, layout: str | None = None,
                 process_index: int | None = None, process_count: int | None = None
                 ) -> Datasets:
  """Builds (and on first use prepares) the data of `config` for one process.

  Args:
    config: the full config (`config.data`, `config.train.batch_size` global,
      `config.train.seed`).
    workdir: where the tokenizer is saved / loaded (`workdir/tokenizer/`).
    layout: one of `pipeline.LAYOUTS`, the batches the model trains on (its kind's
      `model.kinds` adapter says which); a dataset of another layout is refused. None: the
      dataset's own (a text dataset gives text blocks, a translation dataset sentence pairs).
    process_index, process_count: default to jax.process_index() / count().
  """
  process_index, process_count = _process(process_index, process_count)
  data = config.data
  global_batch = config.train.batch_size
  if global_batch % process_count:
    raise DataError(f'config.train.batch_size={global_batch} is not divisible by the '
                    f'{process_count} processes')
  batch_size = global_batch // process_count
  keys = sources.text_keys(data)
  layout = _check_layout(layout, keys, config)
  model_vocab = config.model.vocab_size if 'model' in config else None
  tokenizer = tokenizers.get_tokenizer(data, workdir, model_vocab)
  seed = config.train.seed
  sampling = data.get('subword_sampling_alpha') or 0.0
  info = {'dataset': data.dataset, 'process_index': process_index,
          'process_count': process_count, 'batch_size': batch_size,
          'max_length': data.max_length, 'seed': seed,
          'data': sources.split_fingerprint(data, 'train'), 'subword_sampling': sampling}
  streams = {}
  if sampling:
    _check_sampling(tokenizer, layout, data)
  else:  # the ids of the train split, tokenized once (the first run) and read ever after
    streams['train'] = token_cache.token_ids(data, 'train', tokenizer)
  if layout == pipeline.TEXT_BLOCKS:
    train = pipeline.lm_train(streams['train'].stream(keys[0]), max_length=data.max_length,
                              batch_size=batch_size, seed=seed, process_index=process_index)
  else:
    info['packing'] = bool(data.packing)
    if sampling:
      read = pipeline.SampledIds(sources.get_source(data, 'train'), keys, tokenizer,
                                 data.max_length, seed, alpha=float(sampling),
                                 nbest_size=int(data.get('subword_sampling_nbest', -1)))
      num_examples = len(read.source)
    else:
      read = pipeline.CachedIds(streams['train'], data.max_length, tokenizer.eos_id)
      num_examples = len(streams['train'])
    train = pipeline.translation_train(
        read, num_examples, max_length=data.max_length, batch_size=batch_size,
        seed=seed, packing_enabled=bool(data.packing),
        packing_window=data.packing_window,
        process_index=process_index, process_count=process_count,
        num_workers=data.get('num_workers') or 0)
  return Datasets(tokenizer=tokenizer, train_iter=pipeline.TrainIterator(train, info),
                  batch_size=batch_size, config=config, process_index=process_index,
                  process_count=process_count, _token_ids=streams, layout=layout)


def _check_sampling(tokenizer, layout: str, data) -> None:
  """Sampled segmentations need a sentencepiece model of a translation dataset."""
  if not hasattr(tokenizer, 'sample_batch'):
    raise DataError(f'config.data.subword_sampling_alpha={data.subword_sampling_alpha} needs '
                    f"config.data.tokenizer='sentencepiece' (it is {tokenizer.name!r})")
  if layout != pipeline.SENTENCE_PAIRS:
    raise DataError(f'config.data.subword_sampling_alpha={data.subword_sampling_alpha} applies '
                    "to translation; a language model's token stream is cut into blocks "
                    'regardless of segmentation (set it to 0)')


def _check_layout(layout: str | None, keys: tuple[str, ...], config) -> str:
  """The layout to build: `layout`, which must be the dataset's own (one text field: text
  blocks; a source and a target: sentence pairs), or the dataset's when None."""
  own = pipeline.TEXT_BLOCKS if len(keys) == 1 else pipeline.SENTENCE_PAIRS
  if layout is None or layout == own:
    return own
  if layout not in pipeline.LAYOUTS:
    raise DataError(f'layout={layout!r} is not one of {list(pipeline.LAYOUTS)}')
  what = {pipeline.TEXT_BLOCKS: 'a text dataset', pipeline.SENTENCE_PAIRS: 'a translation dataset'}
  kind = config.get('model', {}).get('kind')
  raise DataError(f'config.model.kind={kind} needs {what[layout]}; {config.data.dataset!r} is '
                  f'{what[own]}')
