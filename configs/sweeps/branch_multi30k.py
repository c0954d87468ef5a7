"""The ladder's branches (issue 56): the options that the screen found helpful after the ladder was
laid, each added to the modern preset's rungs (Muon, WSD, zero-initialised output projections: the
ladder's third rung) and compared with them, at the ladder's budget (1,500 steps), 3 seeds,
decoded as the screen and the ladder decode:

    python sweep.py --sweep=configs/sweeps/branch_multi30k.py --root=runs/branch_multi30k

Its baseline row is the ladder's `muon+wsd+zero_init_out` (the same overrides, seeds 0-1 and
decoding): a machine that ran the ladder restores its runs instead of training them again
(`python -m experiments.archive restore --from=bench/results/sweep_runs/ladder_multi30k_intel
--root=runs/branch_multi30k`; the ladder's other rows stay out of this sweep's table).

Branches (each helped alone in the screen; their figures, and what the branches measured:
bench/results/ablations.md, "Branches"):
  qk_norm   RMSNorm of each head's queries and keys; SwiGLU, which helped alone too, added
            nothing on top of zero-init (the ladder's fourth rung): does QK-norm? Measured:
            not significant on test2016, though ahead on validation: a lead, not yet a
            finding
  ema       an exponential moving average of the parameters (decay 0.999), evaluated and
            decoded; WSD's decay to 0 averages too: does it add? Measured: no, the annealed
            last weights are already the run's best point
"""

from configs.sweeps import Sweep
from configs.sweeps.ladder_multi30k import RUNGS, get_sweep as ladder
from configs.sweeps.screen_multi30k import get_sweep as screen

# The ladder's row the branches grow from: its rungs up to zero-init ('muon+wsd+zero_init_out').
TRUNK = '+'.join(RUNGS[:RUNGS.index('zero_init_out') + 1])
BRANCHES = ('qk_norm', 'ema')  # the screen's rows


def get_sweep():
  laid, screened = ladder(), screen()
  rows = {TRUNK: laid.rows[TRUNK]}
  for option in BRANCHES:
    rows[f'{TRUNK}+{option}'] = {**laid.rows[TRUNK], **screened.rows[option]}
  return Sweep(
      config=laid.config,
      overrides=laid.overrides,
      rows=rows,
      baseline=TRUNK,
      # A third seed beyond the ladder's two: QK-norm's first two disagreed (-0.81 and +1.15
      # against the trunk's same seeds).
      seeds=laid.seeds + 1,
      decode=laid.decode,
      description='The ladder\'s branches: the screen\'s later winners on top of the modern '
                  'preset\'s rungs, 1,500 steps.')
