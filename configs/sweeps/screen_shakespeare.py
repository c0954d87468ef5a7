"""Screening (issue 56) on language modelling: each technique alone against the Tiny
Shakespeare preset (nanoGPT's CPU settings: pre-LN, GELU, AdamW, cosine schedule; 2,000
steps), 2 seeds; the table compares validation losses (Welch's t over seeds):

    python sweep.py --sweep=configs/sweeps/screen_shakespeare.py --root=runs/screen_shakespeare

Language modelling may rank the options otherwise than translation
(configs/sweeps/screen_multi30k.py). The preset is already pre-LN, so the norm-position row is
post-LN. 22 runs of a few minutes each on 2 CPU cores (the table, its times and its reading:
bench/results/sweeps.md).
"""

from configs.sweeps import OPTIONS_ALONE, Sweep


def get_sweep():
  return Sweep(
      config='configs/shakespeare_char.py',
      rows={
          'baseline': {},
          **OPTIONS_ALONE,
          'post_ln': {'model.norm_position': 'post'},
          'swiglu': {'model.activation': 'swiglu', 'model.d_ff': 341},
          'wsd': {'optimizer.schedule': 'wsd'},
      },
      seeds=2,
      description='Screening: each option alone against the Tiny Shakespeare preset.')
