"""The paper's post-LN Transformer against pre-LN, on the default preset (README command 1),
3 seeds each:

    python sweep.py --sweep=configs/sweeps/norm_position.py --root=runs/norm_position

post-LN is the paper's `LayerNorm(x + Sublayer(x))`; pre-LN is `x + Sublayer(LayerNorm(x))`
with a final LayerNorm on each stack (Xiong et al. 2020; Nguyen and Salazar 2019 found it
helps low-resource pairs and hurts WMT). 6 runs of 700 steps, about an hour and a half on 2
quiet CPU cores (the table, its times and its reading: bench/results/sweeps.md).
"""

from configs.sweeps import Sweep


def get_sweep():
  return Sweep(
      config='configs/default.py',
      rows={'post_ln': {'model.norm_position': 'post'},
            'pre_ln': {'model.norm_position': 'pre'}},
      seeds=3,
      description='Post-LN (the paper) against pre-LN on the default Multi30k run.')
