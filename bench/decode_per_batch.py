"""Where decoding loses to CTranslate2, batch by batch: each batch of test2016 (sorted by
length, longest first, as decode.py batches a file) decoded alone by decode.py's Translator
and by CTranslate2 float32, on one core and one thread each, best of `--repeats` timings; one
JSON line per batch and one with the totals.

  taskset -c 0 python bench/decode_per_batch.py --workdir=W --beam=4

`bench/decode_engines.py` gives the throughput of whole passes with every core; this splits a
pass to show which batches (short or long sources, long outputs) hold the gap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.decode_engines import EOS, TEST2016, _export, _sources, ct2_options, ct2_vocab_and_pieces  # noqa: E402


def _best(fn, repeats: int) -> float:
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--beam', type=int, default=4)
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--lines', type=int, default=0, help='the first N lines (0: all)')
  args = parser.parse_args(argv)

  import ctranslate2  # pylint: disable=import-outside-toplevel

  import decode  # pylint: disable=import-outside-toplevel
  from autoregressive.translator import Translator  # pylint: disable=import-outside-toplevel

  _, ids, max_len = _sources(args.workdir, TEST2016, args.lines)
  restored = decode.restore(args.workdir, None, 1)
  ours = Translator(restored.module, restored.params, beam_size=args.beam, alpha=0.0,
                    max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, eos_id=EOS,
                    workers=1, nbest=1)
  with tempfile.TemporaryDirectory() as scratch:
    ct2_dir = _export(args.workdir, None, scratch, ['ct2_float32'])['ct2_dir']
    _, pieces = ct2_vocab_and_pieces(ct2_dir, ids)
    theirs = ctranslate2.Translator(ct2_dir, device='cpu', compute_type='float32',
                                    inter_threads=1, intra_threads=1)
  options = ct2_options(args.beam, args.max_new_tokens, max_len, args.batch_size)
  order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)  # as Translator
  totals = {'ours_s': 0.0, 'ct2_s': 0.0}
  for start in range(0, len(order), args.batch_size):
    batch = order[start:start + args.batch_size]
    out = theirs.translate_batch([pieces[i] for i in batch], **options)
    row = {'first': start, 'source_tokens': max(len(ids[i]) for i in batch),
           'output_tokens': sum(len(o.hypotheses[0]) for o in out),
           'longest_output': max(len(o.hypotheses[0]) for o in out),
           'ours_s': _best(lambda b=batch: ours([ids[i] for i in b]), args.repeats),
           'ct2_s': _best(lambda b=batch: theirs.translate_batch([pieces[i] for i in b],
                                                                 **options), args.repeats)}
    row['ratio'] = round(row['ours_s'] / row['ct2_s'], 2)
    totals['ours_s'] += row['ours_s']
    totals['ct2_s'] += row['ct2_s']
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
          flush=True)
  print(json.dumps({'beam': args.beam, 'ours_s': round(totals['ours_s'], 3),
                    'ct2_s': round(totals['ct2_s'], 3),
                    'ratio': round(totals['ours_s'] / totals['ct2_s'], 2)}))


if __name__ == '__main__':
  main()
