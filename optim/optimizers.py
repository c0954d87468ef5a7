"""The optimizer of `config.optimizer`: `OPTIMIZERS` maps its names to rows (a builder,
(config, schedule) -> an Optax transformation, and whether it applies weight decay) and
`WEIGHT_DECAY_MASKS` the decay rules to masks; the config's choices are their keys
(configs/schema.py). `make_optimizer` puts gradient clipping
before the row's optimizer and the moving average of the weights (`optim.ema`) around it. A
new optimizer is a builder and a row (and its fields in configs/schema.py, if it has any).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from model import build
from model.config import ModelConfig
from optim import ema
from optim.schedules import make_schedule

# config.optimizer.weight_decay_mask: which parameters AdamW (and Muon) decay.
#   'ndim'      every parameter with >= 2 dimensions (the default, kept for existing runs). It
#               also decays the fused Q/K/V and K/V biases ([3|2, heads, head_dim]) and, with
#               scan_layers, every stacked bias and LayerNorm scale ([layers, ...]).
#   'matrices'  kernels and embeddings only, by name: never a bias or a LayerNorm scale,
#               whatever its shape (nanoGPT's rule: its biases and norms are the 1-D tensors).
_NOT_MATRICES = ('bias', 'scale')  # parameter names of biases and LayerNorm scales
WEIGHT_DECAY_MASKS: dict[str, Callable[[Any], Any]] = {
    'ndim': lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    'matrices': lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], 'key', None) not in _NOT_MATRICES, params),
}

# Muon (Jordan et al. 2024; optax.contrib.muon) orthogonalises the update of each matrix that
# takes the residual stream into a layer or brings it back, read as [fan_in, fan_out]. Which
# parameters those are, and their axes, comes from the logical axis names every parameter
# carries (model/partitioning.py), so a new layer that names its axes needs no edit here:
#   a matrix    'embed' is its first or its last named axis, beside another named axis, and it
#               has no 'vocab' (the embeddings and an untied output layer take Adam, as do
#               biases and norm scales, as in modded-nanogpt);
#   fan_in      'embed' when it comes first, else the named axes before it; fan_out the rest;
#   apart       unnamed axes (the parts of a fused Q/K/V or K/V kernel, a gated FFN's [gate,
#               up]) and 'layers' (a scanned stack) are batch axes: each part and each layer
#               is orthogonalised as a matrix of its own.
EMBED, VOCAB, LAYERS = 'embed', 'vocab', 'layers'


def muon_dimensions(axes) -> Any:
  """`axes` (`model.build.logical_axes`: a PartitionSpec of names per parameter) -> per
  parameter its `optax.contrib.MuonDimensionNumbers`, or None for the parameters that take
  Adam."""
  def dims(spec):
    names = tuple(spec)
    named = [i for i, name in enumerate(names) if name not in (None, LAYERS)]
    if VOCAB in names or EMBED not in names or len(named) < 2:
      return None
    embed = names.index(EMBED)
    if embed == named[0]:
      fan_in, fan_out = (embed,), tuple(named[1:])
    elif embed == named[-1]:
      fan_in, fan_out = tuple(named[:-1]), (embed,)
    else:
      return None
    return optax.contrib.MuonDimensionNumbers(fan_in, fan_out)
  return jax.tree.map(dims, axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def _decay_mask(config) -> Callable[[Any], Any]:
  rule = config.optimizer.get('weight_decay_mask', 'ndim')  # configs saved before the field
  if rule not in WEIGHT_DECAY_MASKS:
    raise ValueError(f'config.optimizer.weight_decay_mask={rule!r} is not one of '
                     f'{list(WEIGHT_DECAY_MASKS)}')
  return WEIGHT_DECAY_MASKS[rule]


def _adam(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  o = config.optimizer
  return optax.adam(schedule, b1=o.b1, b2=o.b2, eps=o.eps)


def _adamw(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  o = config.optimizer
  return optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                     mask=_decay_mask(config))


def _muon(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  """Muon for the layers' matrices (`muon_dimensions`), Adam for the rest. consistent_rms=0.2
  scales each orthogonalised update to AdamW's typical RMS (Liu et al. 2025, Moonlight), so
  one learning rate and schedule serve the Muon and Adam parameters."""
  o = config.optimizer
  axes = build.logical_axes(ModelConfig.from_config(config.model))
  is_dims = lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)  # noqa: E731
  by_path = dict(jax.tree_util.tree_flatten_with_path(muon_dimensions(axes), is_leaf=is_dims)[0])

  def dimensions(params):  # the parameters, or the placeholder Optax lays the state out with
    return jax.tree_util.tree_map_with_path(lambda path, _: by_path.get(path), params)

  return optax.contrib.muon(schedule, adam_b1=o.b1, adam_b2=o.b2, eps=o.eps,
                            weight_decay=o.weight_decay, adam_weight_decay=o.weight_decay,
                            weight_decay_mask=_decay_mask(config),
                            muon_weight_dimension_numbers=dimensions,
                            consistent_rms=0.2)


class Optimizer(NamedTuple):
  """A row of OPTIMIZERS: its builder, and whether it applies `config.optimizer.weight_decay`
  (the schema refuses a decay that an optimizer would ignore)."""
  build: Callable[[Any, optax.Schedule], optax.GradientTransformation]
  decays: bool


# config.optimizer.name -> its row.
OPTIMIZERS: dict[str, Optimizer] = {
    'adam': Optimizer(_adam, decays=False),  # the paper's
    'adamw': Optimizer(_adamw, decays=True),  # decoupled weight decay
    'muon': Optimizer(_muon, decays=True),
}
DECAYING = tuple(name for name, row in OPTIMIZERS.items() if row.decays)


def make_optimizer(config, schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Global-norm clipping (if `grad_clip_norm` > 0), then `config.optimizer.name`'s row of
  OPTIMIZERS with the schedule (default `make_schedule(config)`), kept with the moving average
  of the weights when `config.train.ema_decay` asks for it (`optim.ema`)."""
  o = config.optimizer
  if o.name not in OPTIMIZERS:
    raise ValueError(f'config.optimizer.name={o.name!r} is not one of {list(OPTIMIZERS)}')
  opt = OPTIMIZERS[o.name].build(config, schedule or make_schedule(config))
  if o.grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), opt)
  return ema.wrap(opt, config)
