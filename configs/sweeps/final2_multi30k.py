"""Round 2's ladder and finalists (issue 76): the screen's (`screen2_multi30k.py`) options that
raised validation BLEU beyond the baseline's seed spread, added one by one to `modern_b64`,
3 seeds each, at the preset's hour (3,500 steps of 64 rows):

    python -m experiments.archive restore --from=bench/results/sweep_runs/screen2_multi30k_amd \\
        --root=runs/final2_multi30k   # the screen's seeds 0-1 of the first two rows
    python sweep.py --sweep=configs/sweeps/final2_multi30k.py --root=runs/final2_multi30k

On the Intel class its archive `final2_multi30k_intel` holds the last row only; restore it with
`final_multi30k_intel` (whose `modern_b64` is this sweep's first row) into one root.

The rungs are chosen on validation, not on test2016, which each finalist reads once
(bench/results/ablations.md §5): QK-norm (validation BLEU 40.98 ± 0.28 over 2 seeds against the
baseline's 40.46 ± 0.10, the lowest validation loss of the screen), then label smoothing 0.2
(40.91 at seed 0). Activation dropout (40.63), dropout 0.4 (39.03), BPE-dropout and R-Drop
inside the hour (under-trained) did not. The first two rows are the screen's rows of the same
names (the same overrides, seeds and decoding): restored from its archive they are seeds 0-1
here, and only their third seed trains. Each row reads against the one before it
(`compare='previous'`): does the option still add on top of the others? The three rows are
the finalists; the target, as for round 1, is a mean of >= 41.0 lowercased on test2016 over
3 seeds within 60 minutes of training on 2 CPU cores.
"""

from configs.sweeps import Sweep
from configs.sweeps.screen2_multi30k import get_sweep as screen

RUNGS = ('qk_norm', 'smoothing_0.2')  # the screen's rows, in the order they are added


def get_sweep():
  screened = screen()  # each rung adds the screen's row, so both measure one setting
  base = screened.rows['modern_b64']
  rows, added = {'modern_b64': base}, dict(base)
  for n, rung in enumerate(RUNGS, 1):  # 'qk_norm', 'qk_norm+smoothing_0.2'
    added = rows['+'.join(RUNGS[:n])] = {**added, **screened.rows[rung]}
  return Sweep(
      config=screened.config,
      rows=rows,
      seeds=3,
      order='seed',
      compare='previous',
      decode=screened.decode,
      description='Round 2\'s ladder and finalists: QK-norm, then label smoothing 0.2, added '
                  'to modern_b64, 3,500 steps, 3 seeds; decoding chosen on validation per '
                  'run.')
