"""Learning-rate schedules and the Optax optimizer from `config.optimizer`.

Schedules take the 0-based update count `step` (Optax's count); the paper's formula counts
steps from 1, so `rsqrt(step) = lr * d_model^-0.5 * min((step+1)^-0.5, (step+1) * warmup^-1.5)`
(the first update does not get a zero learning rate).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from configs.schema import OPTIMIZERS, SCHEDULES, WEIGHT_DECAY_MASKS


def rsqrt_schedule(learning_rate: float, d_model: int, warmup_steps: int) -> optax.Schedule:
  """The paper's (Vaswani et al. 2017, eq. 3) schedule, scaled by `learning_rate`."""
  def schedule(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    return learning_rate * d_model ** -0.5 * jnp.minimum(s ** -0.5, s * warmup_steps ** -1.5)
  return schedule


def cosine_schedule(learning_rate: float, warmup_steps: int, num_steps: int,
                    min_ratio: float) -> optax.Schedule:
  """Linear warmup to `learning_rate` (reached at update `warmup_steps`), then cosine decay to
  `min_ratio * learning_rate` at `num_steps` (and constant after)."""
  floor = learning_rate * min_ratio
  decay_steps = max(1, num_steps - warmup_steps)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    warm = learning_rate * (s + 1.0) / max(1, warmup_steps)
    progress = jnp.clip((s - warmup_steps) / decay_steps, 0.0, 1.0)
    cos = floor + 0.5 * (1.0 + jnp.cos(math.pi * progress)) * (learning_rate - floor)
    return jnp.where(s < warmup_steps, warm, cos)
  return schedule


def constant_schedule(learning_rate: float, warmup_steps: int) -> optax.Schedule:
  """Linear warmup (if any) then constant."""
  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    return learning_rate * jnp.minimum(1.0, (s + 1.0) / max(1, warmup_steps))
  return schedule


def make_schedule(config) -> optax.Schedule:
  """`config.optimizer.schedule` -> schedule (uses config.model.d_model, config.train.num_steps)."""
  o = config.optimizer
  if o.schedule == 'rsqrt':
    return rsqrt_schedule(o.learning_rate, config.model.d_model, o.warmup_steps)
  if o.schedule == 'cosine':
    return cosine_schedule(o.learning_rate, o.warmup_steps, config.train.num_steps,
                           o.min_learning_rate_ratio)
  if o.schedule == 'constant':
    return constant_schedule(o.learning_rate, o.warmup_steps)
  raise ValueError(f'config.optimizer.schedule={o.schedule!r} is not one of {list(SCHEDULES)}')


# config.optimizer.weight_decay_mask: which parameters AdamW decays.
#   'ndim'      every parameter with >= 2 dimensions (the default, kept for existing runs). It
#               also decays the fused Q/K/V and K/V biases ([3|2, heads, head_dim]) and, with
#               scan_layers, every stacked bias and LayerNorm scale ([layers, ...]).
#   'matrices'  kernels and embeddings only, by name: never a bias or a LayerNorm scale,
#               whatever its shape (nanoGPT's rule: its biases and norms are the 1-D tensors).
_NOT_MATRICES = ('bias', 'scale')  # parameter names of biases and LayerNorm scales


def _decay_mask(params, rule='ndim'):
  """Which parameters decay, by `rule` (one of WEIGHT_DECAY_MASKS)."""
  if rule == 'matrices':
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], 'key', None) not in _NOT_MATRICES, params)
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config, schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Global-norm clipping (if `grad_clip_norm` > 0) then Adam or AdamW with the schedule."""
  o = config.optimizer
  schedule = schedule or make_schedule(config)
  if o.name == 'adam':
    opt = optax.adam(schedule, b1=o.b1, b2=o.b2, eps=o.eps)
  elif o.name == 'adamw':
    rule = o.get('weight_decay_mask', 'ndim')  # configs saved before the field: 'ndim'
    if rule not in WEIGHT_DECAY_MASKS:
      raise ValueError(f'config.optimizer.weight_decay_mask={rule!r} is not one of '
                       f'{list(WEIGHT_DECAY_MASKS)}')
    opt = optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                      mask=lambda params: _decay_mask(params, rule))
  else:
    raise ValueError(f'config.optimizer.name={o.name!r} is not one of {list(OPTIMIZERS)}')
  if o.grad_clip_norm:
    return optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), opt)
  return opt
