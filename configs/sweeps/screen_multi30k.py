"""Screening (issue 56): each technique of the last nine years alone against the `multi30k`
preset (the paper's post-LN Transformer, 4+4 layers, 128 wide, Adam with the rsqrt schedule),
at a third of its budget (1,500 of 4,500 steps), 2 seeds:

    python sweep.py --sweep=configs/sweeps/screen_multi30k.py --root=runs/screen_multi30k

The protocol (docs/guide.md, "Experiments"): the rows that beat the baseline here are added
one by one in `configs/sweeps/ladder_multi30k.py` (2-3 seeds), and the best ladder is run at the
full CPU-hour budget with 3 seeds. Decoding: beam 6 (the preset's), no checkpoint averaging,
and the length penalty chosen per run on its validation split (1.0 or 1.4, as the finalists
choose theirs): a fixed alpha 1.4, the baseline's choice, penalised the options that change
the output's length (QK-norm, RMSNorm wrote 1.07x and 1.11x the references' length with it
and chose 1.0 on validation). test2016 is decoded once per run, with the choice.
22 runs of 1,500 steps: several hours on 2 CPU cores (the table, its times and its reading:
bench/results/ablations.md).

Sources: pre-LN (Xiong et al. 2020; Nguyen and Salazar 2019), RMSNorm (Zhang and Sennrich
2019), SwiGLU (Shazeer 2020; d_ff 256 -> 170 keeps the parameters), ReLU^2 (So et al. 2021),
QK-norm (Henry et al. 2020; Dehghani et al. 2023), zero-initialised residual projections and
Muon (modded-nanogpt; Jordan et al. 2024), WSD (Hu et al. 2024; Hägele et al. 2024), z-loss
(Chowdhery et al. 2022, PaLM), a moving average of the weights (Polyak and Juditsky 1992;
against the preset's checkpoint averaging, which this sweep's decoding leaves out).
"""

from configs.multi30k import WSD  # the schedule at the preset's rsqrt peak, as `modern`'s
from configs.sweeps import OPTIONS_ALONE, Sweep


def get_sweep():
  return Sweep(
      config='configs/multi30k.py',
      overrides={'train.num_steps': 1500, 'train.eval_every_steps': 500},
      # The rows that helped on Tiny Shakespeare (bench/results/sweeps.md) first, so that a
      # screen cut short has measured the likeliest candidates for the ladder.
      rows={
          'baseline': {},
          'muon': OPTIONS_ALONE['muon'],
          'wsd': WSD,
          'relu2': OPTIONS_ALONE['relu2'],
          'swiglu': {'model.activation': 'swiglu', 'model.d_ff': 170},
          'pre_ln': {'model.norm_position': 'pre'},
          **{name: row for name, row in OPTIONS_ALONE.items() if name not in ('muon', 'relu2')},
      },
      seeds=2,
      decode={'beam_size': 6, 'alpha': [1.0, 1.4]},  # the first of equals is the choice
      description='Screening: each option alone against the multi30k preset, 1,500 steps.')
