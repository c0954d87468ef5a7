"""Input-pipeline benchmark: packing efficiency and batches/s of the pipeline alone.

    python bench/input_pipeline.py [--batch_size=128] [--max_length=64] [--num_batches=100]

Prints one JSON object:
  packing:   non-pad token fraction of training batches on Multi30k, packed vs
             plain padded batching (inputs and targets together, and each)
  rates:     batches/s, rows/s, examples/s and non-pad tokens/s of the training
             iterator alone (no model), for packed / padded translation and the
             Tiny Shakespeare char LM; plus setup seconds (prepare + tokenizer)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import input_pipeline
from configs import default, shakespeare_char
from model.kinds import adapter_of


def _measure(config, workdir, num_batches):
  start = time.perf_counter()
  ds = input_pipeline.get_datasets(config, workdir=workdir,
                                  layout=adapter_of(config.model).batch_layout,
                                  process_index=0, process_count=1)
  first = next(ds.train_iter)  # starts the prefetch thread; not timed below
  setup = time.perf_counter() - start
  nonpad = {k: 0 for k in ('inputs', 'targets') if k in first}
  total = examples = 0
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(ds.train_iter)
    for k in nonpad:
      nonpad[k] += int((batch[k] > 0).sum())
    total += batch['targets'].size
    if 'targets_segmentation' in batch:
      examples += int(batch['targets_segmentation'].max(axis=1).sum())
    elif 'inputs' in batch:
      examples += int((batch['targets'] > 0).any(axis=1).sum())
    else:
      examples += batch['targets'].shape[0]
  seconds = time.perf_counter() - start
  rows = num_batches * first['targets'].shape[0]
  result = {
      'setup_s': round(setup, 2),
      'batch_shape': list(first['targets'].shape),
      'batches_per_s': round(num_batches / seconds, 2),
      'rows_per_s': round(rows / seconds, 1),
      'examples_per_s': round(examples / seconds, 1),
      'nonpad_tokens_per_s': round(sum(nonpad.values() or [total]) / seconds, 1),
  }
  if nonpad:
    result['nonpad_fraction'] = round(sum(nonpad.values()) / (len(nonpad) * total), 4)
    result.update({f'nonpad_fraction_{k}': round(v / total, 4) for k, v in nonpad.items()})
    result['examples_per_row'] = round(examples / rows, 2)
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch_size', type=int, default=128, help='rows per batch')
  parser.add_argument('--max_length', type=int, default=64)
  parser.add_argument('--num_batches', type=int, default=100)
  parser.add_argument('--data_dir', default=None, help='tfds data dir (default: a temp dir)')
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data_dir or os.path.join(tmp, 'tfds')
    results = {}
    for name, packing in (('multi30k_packed', True), ('multi30k_padded', False)):
      config = default.get_config()
      config.data.data_dir = data_dir
      config.data.packing = packing
      config.data.max_length = args.max_length
      config.train.batch_size = args.batch_size
      results[name] = _measure(config, os.path.join(tmp, 'wd_mt'), args.num_batches)
    config = shakespeare_char.get_config()
    config.data.data_dir = data_dir
    config.data.max_length = args.max_length
    config.train.batch_size = args.batch_size
    results['shakespeare_char'] = _measure(config, os.path.join(tmp, 'wd_lm'), args.num_batches)

  packed, padded = results['multi30k_packed'], results['multi30k_padded']
  print(json.dumps({
      'benchmark': 'input_pipeline',
      'machine': f'{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}',
      'batch_size': args.batch_size, 'max_length': args.max_length,
      'num_batches': args.num_batches,
      'packing_efficiency': {'packed': packed['nonpad_fraction'],
                             'padded': padded['nonpad_fraction'],
                             'gain': round(packed['nonpad_fraction']
                                           / padded['nonpad_fraction'], 2)},
      'results': results,
  }, indent=2))


if __name__ == '__main__':
  main()
