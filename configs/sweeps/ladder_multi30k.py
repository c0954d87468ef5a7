"""The cumulative ladder (issue 56): the options that beat the baseline in the screen
(`configs/sweeps/screen_multi30k.py`), added one by one to the `multi30k` preset, at the
screen's budget (1,500 of 4,500 steps), 2 seeds, decoded as the screen decodes (beam 6,
alpha 1.4, no checkpoint averaging), so that each rung reads against the one before it:

    python sweep.py --sweep=configs/sweeps/ladder_multi30k.py --root=runs/ladder_multi30k

The first two rungs are the screen's `baseline` and `muon` rows (the same overrides, seeds and
decoding): a machine that ran the screen restores them from its archive instead of training
them again (`python -m experiments.archive restore --from=bench/results/sweep_runs/
screen_multi30k_intel --root=runs/ladder_multi30k`; the screen's other rows are not this
sweep's and stay out of its table).

Rungs, in the order of their screen gain (bench/results/sweeps.md, the Intel VM):
  muon   Muon for the layers' matrices (+1.90 BLEU [+1.15, +2.56], p 0.001, alone)
  wsd    warmup-stable-decay to 0 over the last 20% of the steps, at the rsqrt schedule's
         peak (+1.88 [+1.03, +2.69], p 0.001, alone): Muon's schedule in modded-nanogpt
A rung is added here once the screen has measured it above the baseline beyond its seeds'
spread; the table compares each rung with the one before it (`compare='previous'`): does the
option still add on top of the others?
"""

from configs.multi30k import PEAK
from configs.sweeps import OPTIONS_ALONE, Sweep

WSD = {'optimizer.schedule': 'wsd', 'optimizer.learning_rate': PEAK,
       'optimizer.min_learning_rate_ratio': 0.0}


def get_sweep():
  muon = dict(OPTIONS_ALONE['muon'])
  return Sweep(
      config='configs/multi30k.py',
      overrides={'train.num_steps': 1500, 'train.eval_every_steps': 500},
      rows={
          'baseline': {},
          'muon': muon,
          'muon+wsd': {**muon, **WSD},
      },
      seeds=2,
      compare='previous',
      decode={'beam_size': 6, 'alpha': 1.4},
      description='The ladder: the screen\'s winners added one by one, 1,500 steps.')
