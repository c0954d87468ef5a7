"""Screening, round 2 (issue 76): the small-data regularisers, each alone on top of the
`modern_b64` preset (`configs/multi30k.py`'s MODERN_B64: Muon, WSD, zero-initialised output
projections, 64 rows a step, dropout 0.3; 3,500 steps), 2 seeds:

    python sweep.py --sweep=configs/sweeps/screen2_multi30k.py --root=runs/screen2_multi30k

The budget is the preset's whole hour (3,500 steps), not round 1's third of it: a regulariser
trades early fit for late generalisation (it slows the first epochs and pays off once the
model begins to overfit, here after ~20 of the ~36 epochs), and WSD's decay makes a short run
a finished run of another regime, so a 1,500-step screen would rank them by their early cost.
The hour is also where the target is measured (>= 41.0 lowercased on test2016 within 60
minutes). The baseline row is the finalists' `modern_b64` (the same overrides, seeds 0-1 and
decoding): a machine that ran the finalists restores those runs instead of training them
again (`python -m experiments.archive restore --from=bench/results/sweep_runs/
final_multi30k_intel --root=runs/screen2_multi30k`; the other finalists stay out of this
sweep's table). Decoding as the finalists': checkpoints averaged and length penalty chosen per
run on its validation split, beam 6; test2016 decoded once per run.

Rows (each alone on top of the preset; sources in docs/guide.md's options table), in the
order they run (every row's seed 0 first; the two R-Drop rows that outlast the hour last):
  act_dropout_0.1   dropout 0.1 on the FFN's hidden units (fairseq's IWSLT recipe's
                    --activation-dropout)
  rdrop_5_hour      R-Drop (Liang et al. 2021) with the paper's alpha for translation (5) at
                    the steps the hour holds (3,500 / RDROP_STEP_COST, 1,600; the warm-up
                    stays 1,000 steps): the gain that counts for the target
  smoothing_0.2     label smoothing 0.2 (the preset's 0.1)
  dropout_0.4       P_drop 0.4 (the preset's 0.3)
  qk_norm           round 1's open lead (+0.37 at 1,500 steps, 3 seeds; validation loss -0.039)
  subword_0.1       subword regularisation at alpha 0.1: for the preset's BPE tokenizer,
                    BPE-dropout (Provilkov et al. 2020), each merge dropped with probability
                    0.1; the training split only (input_pipeline/subword_sampling.py)
  rdrop_1, rdrop_5  R-Drop at the preset's 3,500 steps: two passes a step, RDROP_STEP_COST x
                    the step's time, so a run outlasts the hour (~2 hours): the gain per step
"""

from configs.multi30k import MODERN_B64
from configs.sweeps import OPTIONS_ALONE, Sweep
from configs.sweeps.final_multi30k import get_sweep as finalists

# R-Drop's step time over the preset's, measured in one process (bench/sweep_step.py on this
# file; bench/results/train_step.md).
RDROP_STEP_COST = 2.2
# Each regulariser alone, as an override on top of the preset.
# The rows that fit the hour first; R-Drop at the preset's steps (~2 hours a run) last.
REGULARISERS = {
    'act_dropout_0.1': {'model.activation_dropout_rate': 0.1},
    'rdrop_5_hour': {'train.rdrop_alpha': 5.0,
                     'train.num_steps': 100 * round(MODERN_B64['train.num_steps'] / 100
                                                    / RDROP_STEP_COST)},
    'smoothing_0.2': {'train.label_smoothing': 0.2},
    'dropout_0.4': {'model.dropout_rate': 0.4},
    'qk_norm': OPTIONS_ALONE['qk_norm'],
    'subword_0.1': {'data.subword_sampling_alpha': 0.1},
    'rdrop_1': {'train.rdrop_alpha': 1.0},
    'rdrop_5': {'train.rdrop_alpha': 5.0},
}


def get_sweep():
  final = finalists()
  return Sweep(
      config=final.config,
      rows={'modern_b64': MODERN_B64,
            **{name: {**MODERN_B64, **row} for name, row in REGULARISERS.items()}},
      baseline='modern_b64',
      seeds=2,
      # Every row's seed 0 before any seed 1: a screen cut short has measured every row once.
      order='seed',
      decode=final.decode,
      description='Screening, round 2: each small-data regulariser alone on top of the '
                  'modern_b64 preset, 3,500 steps; decoding chosen on validation per run.')
