"""Input pipeline: tfds builders, tokenizers, packing, Grain batching.

    datasets = get_datasets(config, workdir=workdir)
    batch = next(datasets.train_iter)          # dict of numpy [batch, length]
    state = datasets.train_iter.get_state()    # JSON-serializable
    for batch in datasets.eval_batches(): ...
    tokenizer = load_tokenizer(workdir)        # for decode.py: workdir only

The names below are imported on first use, so that loading a tokenizer (decode.py) does not
import the dataset readers (Grain, the tfds builders: about 1.7 s of a cold decode.py run).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    'Datasets': 'input_pipeline.datasets', 'get_datasets': 'input_pipeline.datasets',
    'DataError': 'input_pipeline.errors', 'DataFileError': 'input_pipeline.errors',
    'TrainIterator': 'input_pipeline.pipeline',
    'CharTokenizer': 'input_pipeline.tokenizers',
    'SentencePieceTokenizer': 'input_pipeline.tokenizers',
    'Tokenizer': 'input_pipeline.tokenizers', 'get_tokenizer': 'input_pipeline.tokenizers',
    'load_tokenizer': 'input_pipeline.tokenizers',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
