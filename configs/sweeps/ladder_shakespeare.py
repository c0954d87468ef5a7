"""The language model's ladder (issue 76, item 4): the options that beat the Tiny Shakespeare
preset beyond the seed spread in the screen (`configs/sweeps/screen_shakespeare.py`: WSD,
Muon, ReLU²), added one by one, then this round's regularisers on the top rung; nanoGPT's CPU
budget (the preset's 2,000 steps, ~229 s for nanoGPT), 3 seeds, so that the ladder's first and
top rows are also the finalists (`configs/sweeps/final_shakespeare.py` compares them):

    python sweep.py --sweep=configs/sweeps/ladder_shakespeare.py --root=runs/ladder_shakespeare

Rungs, strongest in the screen first (its figures: bench/results/sweeps.md):
  wsd      warmup-stable-decay to a tenth over the last 20% of the steps, at the cosine's peak
  muon     Muon for the layers' matrices (AdamW for the rest)
  relu2    the squared ReLU in the feed-forward (its parameters unchanged)
The regularisers, each on the rung before it (the preset trains without dropout, as nanoGPT's
CPU settings do; ~1.5 passes over the 1M training characters):
  dropout  dropout 0.1 on the residual branches, the attention weights and the FFN's hidden units
  rdrop    R-Drop (Liang et al. 2021): two dropout passes, symmetric KL with weight 1.0; about
           twice a step's cost
The table compares each row with the one before it (`compare='previous'`).
"""

from configs.sweeps import OPTIONS_ALONE, Sweep

RUNGS = {
    'wsd': {'optimizer.schedule': 'wsd'},
    'muon': OPTIONS_ALONE['muon'],
    'relu2': OPTIONS_ALONE['relu2'],
    'dropout': {'model.dropout_rate': 0.1, 'model.attention_dropout_rate': 0.1,
                'model.activation_dropout_rate': 0.1},
    'rdrop': {'train.rdrop_alpha': 1.0},
}


def get_sweep():
  rows, added = {'baseline': {}}, {}
  names = list(RUNGS)
  for n, option in enumerate(names, 1):  # 'wsd', 'wsd+muon', 'wsd+muon+relu2', ...
    added = rows['+'.join(names[:n])] = {**added, **RUNGS[option]}
  return Sweep(
      config='configs/shakespeare_char.py',
      rows=rows,
      seeds=3,
      compare='previous',
      order='seed',
      description='The language model\'s ladder: the screen\'s winners added one by one, then '
                  'dropout and R-Drop; 2,000 steps, 3 seeds.')
