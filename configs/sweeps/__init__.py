"""Sweep files: `Sweep`, what a file here returns from `get_sweep()` (the experiment's rows of
overrides x seeds); `python sweep.py --sweep=configs/sweeps/NAME.py` runs it (experiments/).

    from configs.sweeps import Sweep

    def get_sweep():
      return Sweep(config='configs/default.py',
                   rows={'post_ln': {'model.norm_position': 'post'},
                         'pre_ln': {'model.norm_position': 'pre'}},
                   seeds=3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

# Issue 56's screening rows that read the same against any preset: each option alone, at its
# usual setting (the sweep files add the rows that depend on their preset: the other norm
# position, SwiGLU's d_ff, the WSD peak).
OPTIONS_ALONE = {
    'rms_norm': {'model.norm': 'rms_norm'},
    'relu2': {'model.activation': 'relu2'},
    'qk_norm': {'model.qk_norm': True},
    'zero_init_out': {'model.zero_init_out': True},
    'muon': {'optimizer.name': 'muon'},
    'z_loss': {'train.z_loss': 1e-4},
    'ema': {'train.ema_decay': 0.999},
}

# The sweep file's `slurm` fields (sweep.py's --slurm_* flags override them).
SLURM_FIELDS = ('partition', 'time_min', 'gpus_per_node', 'cpus_per_task', 'mem_gb',
                'array_parallelism', 'account', 'qos', 'constraint')


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What a sweep file describes. `rows` (name -> overrides) and `grid` (field -> values, the
  product of the axes) may be given alone or together (each row crossed with each grid
  point); neither gives one row, 'base'. `baseline` names the row the table compares against
  (default: the first); `compare='previous'` compares each row with the row before it instead
  (a cumulative ladder, whose first row is its baseline). `order` is the order the runs start
  in: 'row' (a row's seeds one after the other) or 'seed' (each seed of every row before the
  next seed: a sweep cut short has every row, and a row's runs sit beside the others' on the
  machine's clock). `decode` is the evaluation's
  decoding setting (the strategy table's settings, plus `average_last`), default the config's
  decode section; choose it on the validation split, never on test. `slurm`: SLURM_FIELDS
  (flags override them)."""

  config: str = 'configs/default.py'
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  rows: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  grid: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
  seeds: int | Sequence[int] = 1
  baseline: str | None = None
  compare: str = 'baseline'  # or 'previous': each row against the one before it
  order: str = 'row'  # or 'seed': every row's first seed, then every row's second, ...
  decode: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  metric: str = 'bleu'
  eval_sentences: int | None = None
  slurm: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  description: str = ''
