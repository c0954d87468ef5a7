"""The finalists (issue 56): the `multi30k` preset (the paper's Transformer, 4+4 layers, 128
wide) against its `modern` preset (`configs/multi30k.py`'s MODERN: Muon, WSD, zero-initialised
output projections) and against the first finalist, Muon and WSD alone (`MUON_WSD`), each at
the full CPU-hour budget (4,500 steps), 3 seeds; and the modern preset in the `gpu` preset's
regime (`MODERN_B64`: 3,500 steps of 64 rows, dropout 0.3; under an hour a run here; the
results: bench/results/ablations.md, "Finalists"):

    python sweep.py --sweep=configs/sweeps/final_multi30k.py --root=runs/final_multi30k

Each run chooses its decoding on its own validation split (the checkpoints averaged, the
length penalty; beam 6, the presets' width) by cased BLEU, then decodes test2016 once with
it. The runs go seed by seed, each preset's run beside the other's on the machine's clock,
so their minutes per run compare; the target is the modern preset's mean lowercased
tokenized BLEU >= 41.0 within 60 minutes of training on 2 CPU cores.
"""

from configs.multi30k import MODERN, MODERN_B64, MUON_WSD
from configs.sweeps import Sweep


def get_sweep():
  return Sweep(
      config='configs/multi30k.py',
      rows={'modern': MODERN, 'muon_wsd': MUON_WSD, 'paper': {}, 'modern_b64': MODERN_B64},
      baseline='paper',
      seeds=3,
      order='seed',
      decode={'average_last': [1, 3, 5], 'beam_size': 6, 'alpha': [1.0, 1.4]},
      description='The finalists: the paper\'s preset, Muon + WSD and the modern preset, '
                  '4,500 steps; the modern preset at 64 rows a step and dropout 0.3, '
                  '3,500 steps; decoding chosen on validation per run.')
