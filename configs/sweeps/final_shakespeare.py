"""The language model's finalists (issue 76, item 4): the Tiny Shakespeare preset (nanoGPT's
CPU settings, 2,000 steps) against its `modern` preset (`configs/shakespeare_char.py`'s MODERN:
WSD, Muon, ReLU²), 3 seeds, compared on the validation loss at the last step:

    python sweep.py --sweep=configs/sweeps/final_shakespeare.py --root=runs/final_shakespeare

Its six runs are the ladder's (`configs/sweeps/ladder_shakespeare.py`: its `baseline` and
`wsd+muon+relu2` rows have these overrides and seeds); a machine that ran the ladder copies them
instead of training them again (`cp -r runs/ladder_shakespeare/baseline
runs/final_shakespeare/baseline; cp -r runs/ladder_shakespeare/wsd+muon+relu2
runs/final_shakespeare/modern`), and `--report` tables them (each run's config.json is checked
against its row here). The figures: bench/results/sweeps.md, "The language model's ladder".
"""

from configs.shakespeare_char import MODERN
from configs.sweeps import Sweep


def get_sweep():
  return Sweep(
      config='configs/shakespeare_char.py',
      rows={'baseline': {}, 'modern': MODERN},
      seeds=3,
      order='seed',
      description='The language model\'s finalists: the Tiny Shakespeare preset against its '
                  'modern preset (WSD, Muon, ReLU²), 2,000 steps, 3 seeds.')
