"""Input pipeline: tfds builders, tokenizers, packing, Grain batching.

    datasets = get_datasets(config, workdir=workdir)
    batch = next(datasets.train_iter)          # dict of numpy [batch, length]
    state = datasets.train_iter.get_state()    # JSON-serializable
    for batch in datasets.eval_batches(): ...
    tokenizer = load_tokenizer(workdir)        # for decode.py: workdir only
"""

from input_pipeline.datasets import Datasets, get_datasets
from input_pipeline.errors import DataError, DataFileError
from input_pipeline.pipeline import TrainIterator
from input_pipeline.tokenizers import (
                                       CharTokenizer,
                                       SentencePieceTokenizer,
                                       Tokenizer,
                                       get_tokenizer,
                                       load_tokenizer,
)

__all__ = [
    'CharTokenizer', 'DataError', 'DataFileError', 'Datasets', 'SentencePieceTokenizer',
    'Tokenizer', 'TrainIterator', 'get_datasets', 'get_tokenizer', 'load_tokenizer',
]
