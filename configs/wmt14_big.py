"""The paper's big model on WMT14 En->De (Vaswani et al. 2017, Table 3, row 'big').

N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (the paper used 0.1 for En->Fr),
300k steps, otherwise as the base model.
"""

from configs import wmt14_base


def get_config(preset=None):
  config = wmt14_base.get_config()
  m = config.model
  m.d_model, m.d_ff, m.num_heads = 1024, 4096, 16
  m.dropout_rate = 0.3
  config.train.num_steps = 300_000
  config.train.checkpoint_every_steps = 10_000
  config.train.eval_every_steps = 10_000
  return config
