"""The cumulative ladder (issue 56): the options that beat the baseline in the screen
(`configs/sweeps/screen_multi30k.py`), added one by one to the `multi30k` preset, at the
screen's budget (1,500 of 4,500 steps), 2 seeds, decoded as the screen decodes (beam 6, no
checkpoint averaging, the length penalty chosen per run on validation), so that each rung
reads against the one before it:

    python sweep.py --sweep=configs/sweeps/ladder_multi30k.py --root=runs/ladder_multi30k

The first two rungs are the screen's `baseline` and `muon` rows (the same overrides, seeds and
decoding): a machine that ran the screen restores them from its archive instead of training
them again (`python -m experiments.archive restore --from=bench/results/sweep_runs/
screen_multi30k_intel --root=runs/ladder_multi30k`; the screen's other rows are not this
sweep's and stay out of its table).

Rungs (each helped alone in the screen; the screen's and the ladder's figures:
bench/results/ablations.md): the optimizer's first, then the architecture's, pre-LN last since
it and zero-init both act on an untrained block's effect on the residual stream:
  muon           Muon for the layers' matrices
  wsd            warmup-stable-decay to 0 over the last 20% of the steps, at the rsqrt
                 schedule's peak: Muon's schedule in modded-nanogpt
  zero_init_out  the attention and FFN output projections initialised to zero: each block
                 starts as the identity (modded-nanogpt)
  swiglu         the gated FFN at the preset's parameter count, d_ff 256 -> 170
  pre_ln         the norm before each sublayer and one after the stack
A rung is added here once the screen has measured it above the baseline beyond its seeds'
spread; the table compares each rung with the one before it (`compare='previous'`): does the
option still add on top of the others?
"""

from configs.sweeps import Sweep
from configs.sweeps.screen_multi30k import get_sweep as screen

RUNGS = ('muon', 'wsd', 'zero_init_out', 'swiglu', 'pre_ln')  # the screen's rows, in order


def get_sweep():
  screened = screen()  # each rung adds the screen's row, so both measure one setting
  rows, added = {'baseline': {}}, {}
  for n, option in enumerate(RUNGS, 1):  # rows 'muon', 'muon+wsd', 'muon+wsd+zero_init_out', ...
    added = rows['+'.join(RUNGS[:n])] = {**added, **screened.rows[option]}
  return Sweep(
      config='configs/multi30k.py',
      overrides={'train.num_steps': 1500, 'train.eval_every_steps': 500},
      rows=rows,
      seeds=2,
      compare='previous',
      decode=screened.decode,
      description='The ladder: the screen\'s winners added one by one, 1,500 steps.')
