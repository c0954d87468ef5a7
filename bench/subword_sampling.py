"""What our seeded samplers cost against sentencepiece's own (`enable_sampling`), per sentence.

    python bench/subword_sampling.py [--sentences=29000] [--alpha=0.1] [--repeats=3]

sentencepiece's sampler is C++ but its seed does not carry across processes
(input_pipeline/subword_sampling.py); ours are Python. Both sample the same Multi30k German
sentences with a tokenizer trained on them (BPE: BPE-dropout; unigram: the whole lattice),
alternated in one process; the median of `--repeats` timings each. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from input_pipeline import tokenizers  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sentences', type=int, default=29000)
  parser.add_argument('--alpha', type=float, default=0.1)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--vocab_size', type=int, default=8000)
  args = parser.parse_args()
  path = os.path.join(REPO, 'data', 'multi30k', 'train.de.gz')
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    texts = [line.rstrip('\n') for line in itertools.islice(f, args.sentences)]
  results = {}
  for kind in ('bpe', 'unigram'):
    tok = tokenizers.train_sentencepiece(texts, args.vocab_size, model_type=kind)
    tok.sample_batch(texts[:10], alpha=args.alpha, nbest_size=-1, seed=0)  # builds the sampler
    times = {'ours': [], 'sentencepiece': [], 'deterministic': []}
    for seed in range(args.repeats):
      start = time.perf_counter()
      tok.sample_batch(texts, alpha=args.alpha, nbest_size=-1, seed=seed)
      times['ours'].append(time.perf_counter() - start)
      start = time.perf_counter()
      tok._sp.encode(texts, enable_sampling=True, alpha=args.alpha, nbest_size=-1,  # pylint: disable=protected-access
                     num_threads=1)
      times['sentencepiece'].append(time.perf_counter() - start)
      start = time.perf_counter()
      tok.encode_batch(texts)
      times['deterministic'].append(time.perf_counter() - start)
    us = {k: round(statistics.median(v) / len(texts) * 1e6, 1) for k, v in times.items()}
    results[kind] = {'us_per_sentence': us,
                     'ours_vs_sentencepiece': round(us['ours'] / us['sentencepiece'], 1)}
  print(json.dumps({
      'benchmark': 'subword_sampling', 'sentences': len(texts), 'alpha': args.alpha,
      'vocab_size': args.vocab_size,
      'machine': f'{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}',
      'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
      'command': ' '.join(sys.argv), **results}, indent=2))


if __name__ == '__main__':
  main()
