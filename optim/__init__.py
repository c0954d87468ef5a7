"""The optimizer, its learning-rate schedules and the moving average of the weights, each
option a row of a table (name -> builder) whose keys are the config's choices
(configs/schema.py), as the model's options are rows beside their layers. Below configs/ (the
schema lists the tables) and workdir/ (a checkpoint asks `ema` for the weights to use).

  schedules   SCHEDULES ('rsqrt', the paper's; 'cosine', 'constant', 'wsd'), make_schedule
  optimizers  OPTIMIZERS ('adam', 'adamw', 'muon'), WEIGHT_DECAY_MASKS, make_optimizer,
              muon_dimensions (Muon's matrices, by the parameters' logical axes)
  ema         the moving average of the weights: its transform, and the weights to use of a
              train state or a checkpoint
"""

from optim.optimizers import (
  DECAYING,
  OPTIMIZERS,
  WEIGHT_DECAY_MASKS,
  make_optimizer,
  muon_dimensions,
)
from optim.schedules import SCHEDULES, make_schedule

__all__ = ['DECAYING', 'OPTIMIZERS', 'SCHEDULES', 'WEIGHT_DECAY_MASKS', 'make_optimizer',
           'make_schedule', 'muon_dimensions']
