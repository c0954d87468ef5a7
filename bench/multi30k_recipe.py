"""A Multi30k recipe measured without peeking at the test set: train, tune decoding on
validation only, then decode test2016 once with the settings validation chose.

    python bench/multi30k_recipe.py --config=configs/multi30k.py --workdir=runs/multi30k
    python bench/multi30k_recipe.py --config=configs/multi30k.py:gpu --workdir=runs/m30_gpu
    python bench/multi30k_recipe.py --workdir=runs/multi30k --skip_train   # a trained run

1. `train.py --config=CONFIG --workdir=WORKDIR` (its wall time), unless `--skip_train`.
2. The validation split (data/multi30k/val.*, 1014 sentences) decoded for every
   `--average_last` x beam x alpha in the grid (averages capped by the checkpoints kept), in
   this process through `inference.load`, as decode.py decodes, and scored as a sweep's runs
   are (`experiments.evaluate.scores`).
3. The best cased validation BLEU picks the settings (ties: the cheaper decode); test2016 is
   decoded once with them: cased detokenized sacreBLEU, the literature's lowercased tokenized
   BLEU and chrF2, with their signatures. A sweep (`sweep.py`) evaluates its runs with one
   such setting: choose it here, on validation.

Prints one JSON object (and each grid point's line to stderr as it goes): the grid, the
choice, the test scores and the exact decode.py command that reproduces them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

# The repository root, not bench/, goes on the path: bench/decode.py would shadow decode.py.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.gpu_targets import ROOT, TEST2016, run  # pylint: disable=wrong-import-position

# Relative to the checkout (decode.py runs there), so the printed command is the README's.
VALIDATION = os.path.join('data', 'multi30k', 'val')  # + .en.gz / .de.gz
TEST = os.path.relpath(TEST2016, ROOT)


def decode_flags(average_last: int, beam_size: int, alpha: float) -> list[str]:
  return [f'--average_last={average_last}', f'--beam_size={beam_size}', f'--alpha={alpha}']


def decode_cmd(workdir: str, corpus: str, output_file: str, flags: list[str]) -> list[str]:
  """decode.py on CORPUS.en.gz against CORPUS.de.gz, every score printed."""
  return ['decode.py', f'--workdir={workdir}', *flags, '--lowercase_bleu',
          f'--input_file={corpus}.en.gz', f'--reference={corpus}.de.gz',
          f'--output_file={output_file}']


def read_corpus(corpus: str) -> tuple[list[str], list[str]]:
  """(sources, references) of CORPUS.en.gz / CORPUS.de.gz, relative to the checkout."""
  out = []
  for side in ('en', 'de'):
    with gzip.open(os.path.join(ROOT, f'{corpus}.{side}.gz'), 'rt', encoding='utf-8') as f:
      out.append(f.read().split('\n')[:-1])
  return out[0], out[1]


def decode(session, corpus: str, beam_size: int, alpha: float) -> tuple[list[str], dict]:
  """The corpus translated by `session` -> (hypotheses, scores with the wall time)."""
  from experiments import evaluate  # pylint: disable=import-outside-toplevel
  sources, references = read_corpus(corpus)
  start = time.perf_counter()
  hypotheses = session.translate(sources, beam_size=beam_size, alpha=alpha)
  found = evaluate.scores(hypotheses, references)
  return hypotheses, {**found, 'wall_s': round(time.perf_counter() - start, 1)}


def checkpoints_kept(workdir: str) -> int:
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise SystemExit(f'{workdir}: no checkpoints/ directory: train it first (drop --skip_train)')
  return sum(name.isdigit() for name in os.listdir(directory))


def tune(a, kept: int) -> list[dict]:
  """Every grid point on validation, cheapest first (one restore per checkpoint average)."""
  import inference  # pylint: disable=import-outside-toplevel
  grid = []
  averages = sorted({min(int(n), kept) for n in a.averages.split(',')})
  for average in averages:
    session = inference.load(a.workdir, average_last=average, warn=lambda message: None)
    for beam in sorted(int(b) for b in a.beams.split(',')):
      for alpha in (float(x) for x in a.alphas.split(',')):
        point = {'average_last': average, 'beam_size': beam, 'alpha': alpha}
        point.update(decode(session, VALIDATION, beam, alpha)[1])
        print(json.dumps(point), file=sys.stderr, flush=True)
        grid.append(point)
  return sorted(grid, key=lambda p: (p['beam_size'], p['average_last'], p['alpha']))


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', default='configs/multi30k.py', help='train.py --config')
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--skip_train', action='store_true', help='the workdir is trained')
  parser.add_argument('--averages', default='1,3,5,10', help='--average_last values to try')
  parser.add_argument('--beams', default='4,6', help='beam sizes to try')
  parser.add_argument('--alphas', default='0.6,1.0,1.4', help='length penalties to try')
  parser.add_argument('--timeout', type=int, default=7200, help='seconds for train.py')
  a = parser.parse_args()
  report = {'bench': 'multi30k_recipe', 'config': a.config, 'workdir': a.workdir,
            'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
  if not a.skip_train:
    _, wall, error = run([sys.executable, 'train.py', f'--config={a.config}',
                          f'--workdir={a.workdir}'], a.timeout)
    if error:
      raise SystemExit(f'train.py failed:\n{error}')
    report['train_wall_s'] = round(wall, 1)
  report['validation'] = tune(a, checkpoints_kept(a.workdir))
  best = max(report['validation'], key=lambda p: p['bleu'])  # first (cheapest) of equals
  flags = decode_flags(best['average_last'], best['beam_size'], best['alpha'])
  output = os.path.join(a.workdir, 'test2016.de')
  report['chosen'] = {k: best[k] for k in ('average_last', 'beam_size', 'alpha', 'bleu')}
  import inference  # pylint: disable=import-outside-toplevel
  session = inference.load(a.workdir, average_last=best['average_last'],
                           warn=lambda message: None)
  hypotheses, report['test2016'] = decode(session, TEST, best['beam_size'], best['alpha'])
  with open(output, 'w', encoding='utf-8') as f:
    f.write(''.join(f'{h}\n' for h in hypotheses))
  report['test2016_command'] = ' '.join(['python', *decode_cmd(a.workdir, TEST, output, flags)])
  print(json.dumps(report))


if __name__ == '__main__':
  main()
