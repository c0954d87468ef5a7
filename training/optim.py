"""Learning-rate schedules and the Optax optimizer from `config.optimizer`.

Schedules take the 0-based update count `step` (Optax's count); the paper's formula counts
steps from 1, so `rsqrt(step) = lr * d_model^-0.5 * min((step+1)^-0.5, (step+1) * warmup^-1.5)`
(the first update does not get a zero learning rate).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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


def wsd_schedule(learning_rate: float, warmup_steps: int, num_steps: int, decay_fraction: float,
                 min_ratio: float) -> optax.Schedule:
  """Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): linear warmup to
  `learning_rate` (reached at update `warmup_steps`, counting from 1), constant, then a linear
  decay over the last `decay_steps = max(1, round(decay_fraction * num_steps))` updates whose
  last one (update `num_steps`, the run's last) takes `min_ratio * learning_rate` (constant
  after). Like the warmup, the decay counts its updates from 1: its k-th update takes
  `peak + (floor - peak) * k / decay_steps`, so a one-update decay runs at the floor."""
  decay_steps = max(1, round(decay_fraction * num_steps))
  stable_end = max(warmup_steps, num_steps - decay_steps)
  floor = learning_rate * min_ratio
  warmup = constant_schedule(learning_rate, warmup_steps)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    done = jnp.clip(s - stable_end + 1.0, 0.0, decay_steps) / decay_steps  # decay updates / all
    decayed = learning_rate + (floor - learning_rate) * done
    return jnp.where(s < warmup_steps, warmup(s), decayed)
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
  if o.schedule == 'wsd':
    return wsd_schedule(o.learning_rate, o.warmup_steps, config.train.num_steps,
                        o.decay_fraction, o.min_learning_rate_ratio)
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


# Muon (Jordan et al. 2024; optax.contrib.muon) orthogonalises the update of each matrix that
# multiplies the activations inside a layer: these Dense kernels, read as [fan_in, fan_out].
# The fused Q/K/V (and cross-attention K/V) kernels and a gated FFN's [gate, up] kernel are
# orthogonalised per part, as separate matrices (their axis of parts is a batch axis), and so
# is each layer of a scanned stack. The embeddings, an untied output layer, biases and norm
# scales take Adam, as in modded-nanogpt.
_MUON_KERNELS = {'qkv': (1, True), 'kv': (1, True), 'query': (1, False), 'out': (2, False),
                 'wi': (1, None), 'wo': (1, False)}  # -> (input axes, a parts axis after them)


def muon_dimensions(params):
  """Per parameter: `optax.contrib.MuonDimensionNumbers` of a layer's kernel (its input axes
  reduced, its output axes out, the rest batch), None for the parameters that take Adam."""
  def dims(path, p):
    keys = [getattr(k, 'key', getattr(k, 'idx', None)) for k in path]
    if len(keys) < 2 or keys[-1] != 'kernel' or keys[-2] not in _MUON_KERNELS:
      return None
    inputs, parts = _MUON_KERNELS[keys[-2]]
    layers = int('layers' in keys and not any(isinstance(k, int) for k in keys))  # scanned
    if parts is None:  # wi: [d_model, 2, d_ff] when gated
      parts = p.ndim - layers == 3
    reduction = tuple(range(layers, layers + inputs))
    output = tuple(range(layers + inputs + int(parts), p.ndim))
    return optax.contrib.MuonDimensionNumbers(reduction, output)
  return jax.tree_util.tree_map_with_path(dims, params)


class EmaState(NamedTuple):
  """The optimizer state with an exponential moving average of the parameters (`with_ema`):
  the inner optimizer's, the updates counted, and the average (shaped and laid out like the
  parameters, checkpointed with the rest; `state.opt_state.ema`)."""
  inner: Any
  count: jax.Array
  ema: Any


def with_ema(tx: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
  """`tx`, keeping ema <- d * ema + (1 - d) * params after each update, d = min(decay,
  (1 + n) / (10 + n)) at update n (TensorFlow's ExponentialMovingAverage with num_updates:
  early updates are not dominated by the initial parameters). Starts at the initial params."""
  def init(params):
    return EmaState(tx.init(params), jnp.zeros([], jnp.int32), params)

  def update(updates, state, params=None):
    updates, inner = tx.update(updates, state.inner, params)
    new_params = optax.apply_updates(params, updates)
    count = state.count + 1
    d = jnp.minimum(decay, (1.0 + count) / (10.0 + count))
    ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, state.ema, new_params)
    return updates, EmaState(inner, count, ema)
  return optax.GradientTransformation(init, update)


def evaluated_params(state) -> Any:
  """The parameters evaluation and decoding use: the moving average when the run keeps one
  (`config.train.ema_decay` > 0), else the parameters."""
  return state.opt_state.ema if isinstance(state.opt_state, EmaState) else state.params


def make_optimizer(config, schedule: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Global-norm clipping (if `grad_clip_norm` > 0) then Adam, AdamW or Muon (with Adam for
  what is not a layer's matrix: `muon_dimensions`) with the schedule."""
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
  elif o.name == 'muon':
    # consistent_rms=0.2 scales each orthogonalised update to AdamW's typical RMS (Liu et al.
    # 2025, Moonlight), so one learning rate and schedule serve the Muon and Adam parameters.
    rule = o.get('weight_decay_mask', 'ndim')
    opt = optax.contrib.muon(schedule, adam_b1=o.b1, adam_b2=o.b2, eps=o.eps,
                             weight_decay=o.weight_decay, adam_weight_decay=o.weight_decay,
                             weight_decay_mask=lambda params: _decay_mask(params, rule),
                             muon_weight_dimension_numbers=muon_dimensions,
                             consistent_rms=0.2)
  else:
    raise ValueError(f'config.optimizer.name={o.name!r} is not one of {list(OPTIMIZERS)}')
  if o.grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), opt)
  decay = config.train.get('ema_decay', 0.0) if 'train' in config else 0.0
  return with_ema(opt, decay) if decay else opt
