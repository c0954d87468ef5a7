"""Decoding on uniform batches against ragged ones: where decode.py's Translator and
CTranslate2 float32 differ, on one core and one thread each (best of `--repeats` timings).

  taskset -c 0 python bench/decode_uniform.py --workdir=W --beam=4

- `step` lines: a batch of N copies of one test2016 source (`--source_tokens` ids, EOS
  included), every output forced to L tokens (ours: no EOS id; CTranslate2:
  `min_decoding_length = max_decoding_length = L`), for L in `--lengths` (4, 16, 40). The
  differences give the cost of a decoder step with N sentences, `ms_per_step` over steps 4-16
  and 16-40 (where our cache has grown to its full length: `FIRST_WINDOW` is 16).
- `batch` lines: the same N copies decoded as usual (EOS ends them; all end together).
- `pass` line: all of test2016 (longest first, batches of `--batch_size`, as decode.py
  batches a file), whose sentences end at different steps.

Each `batch`/`pass` line gives `ms_per_sentence_step` (time / output tokens, EOS included):
the pass's figure over the uniform batch's is what ragged batches cost each engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.decode_engines import (  # noqa: E402
  EOS,
  TEST2016,
  _export,
  _sources,
  ct2_options,
  ct2_vocab_and_pieces,
)
from bench.decode_per_batch import _best  # noqa: E402


class _Engines:
  """`ours(sources, batch_size, forced)` and `theirs(...)` -> a function that decodes `sources`
  (outputs of `forced` tokens, or ended by EOS when None) -> the output lengths, EOS included."""

  def __init__(self, workdir: str, beam: int, max_new_tokens: int, scratch: str):
    import ctranslate2  # pylint: disable=import-outside-toplevel

    import decode  # pylint: disable=import-outside-toplevel

    self.beam, self.max_new_tokens = beam, max_new_tokens
    self.restored = decode.restore(workdir, None, 1)
    ct2_dir = _export(workdir, None, scratch, ['ct2_float32'])['ct2_dir']
    self.ct2_dir = ct2_dir
    self.ct2 = ctranslate2.Translator(ct2_dir, device='cpu', compute_type='float32',
                                      inter_threads=1, intra_threads=1)
    self.max_len = self.restored.module.config.max_len

  def ours(self, sources, batch_size: int, forced: int | None):
    from autoregressive.translator import Translator  # pylint: disable=import-outside-toplevel

    translator = Translator(self.restored.module, self.restored.params, beam_size=self.beam,
                            alpha=0.0, max_new_tokens=forced or self.max_new_tokens,
                            batch_size=batch_size, eos_id=None if forced else EOS, workers=1)
    return lambda: [len(o) for o in translator(sources)]

  def theirs(self, sources, batch_size: int, forced: int | None):
    _, pieces = ct2_vocab_and_pieces(self.ct2_dir, sources)
    options = ct2_options(self.beam, forced or self.max_new_tokens, self.max_len, batch_size)
    if forced:
      options['min_decoding_length'] = forced
    return lambda: [len(r.hypotheses[0]) for r in self.ct2.translate_batch(pieces, **options)]


def _timed(make, sources, batch_size: int, repeats: int, forced: int | None = None) -> dict:
  run = make(sources, batch_size, forced)
  tokens = sum(run())
  seconds = _best(run, repeats)
  return {'s': round(seconds, 4), 'tokens': tokens,
          'ms_per_sentence_step': round(1000 * seconds / tokens, 4)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--beam', type=int, default=4)
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--sizes', default='64,16,4', help='sentences per uniform batch')
  parser.add_argument('--source_tokens', type=int, default=16,
                      help='the uniform batches repeat the first source this long (or closest)')
  parser.add_argument('--lengths', default='4,16,40', help='forced output lengths, increasing')
  parser.add_argument('--lines', type=int, default=0, help='the pass: the first N lines (0: all)')
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args(argv)

  _, ids, _ = _sources(args.workdir, TEST2016, args.lines)
  one = min(ids, key=lambda s: abs(len(s) - args.source_tokens))  # the first of the closest
  with tempfile.TemporaryDirectory() as scratch:  # the export is read until the end
    _report(_Engines(args.workdir, args.beam, args.max_new_tokens, scratch), args, ids, one)


def _report(engines: _Engines, args, ids, one) -> None:
  makers = {'ours': engines.ours, 'ct2': engines.theirs}
  lengths = [int(x) for x in args.lengths.split(',')]
  for n in (int(x) for x in args.sizes.split(',')):
    for name, make in makers.items():
      runs = [_timed(make, [one] * n, n, args.repeats, length) for length in lengths]
      t = [r['s'] * 1000 for r in runs]
      steps = {f'{a}-{b}': round((tb - ta) / (b - a), 3)
               for a, b, ta, tb in zip(lengths, lengths[1:], t, t[1:], strict=False)}
      print(json.dumps({'line': 'step', 'engine': name, 'beam': args.beam, 'sentences': n,
                        'source_tokens': len(one), 'ms_per_step': steps,
                        'tokens': [r['tokens'] for r in runs]}), flush=True)
    for name, make in makers.items():
      print(json.dumps({'line': 'batch', 'engine': name, 'beam': args.beam, 'sentences': n,
                        **_timed(make, [one] * n, n, args.repeats)}), flush=True)
  for name, make in makers.items():
    print(json.dumps({'line': 'pass', 'engine': name, 'beam': args.beam, 'sentences': len(ids),
                      **_timed(make, ids, args.batch_size, max(1, args.repeats // 2))}),
          flush=True)


if __name__ == '__main__':
  main()
