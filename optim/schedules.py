"""Learning-rate schedules: `SCHEDULES` maps `config.optimizer.schedule`'s names to builders
(config -> `optax.Schedule`), and the config's choices are its keys (configs/schema.py). A new
schedule is a function and a row.

Schedules take the 0-based update count `step` (Optax's count); the paper's formula counts
steps from 1, so `rsqrt(step) = lr * d_model^-0.5 * min((step+1)^-0.5, (step+1) * warmup^-1.5)`
(the first update does not get a zero learning rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import optax


def rsqrt_schedule(learning_rate: float, d_model: int, warmup_steps: int) -> optax.Schedule:
  """The paper's (Vaswani et al. 2017, eq. 3) schedule, scaled by `learning_rate`."""
  def schedule(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    return learning_rate * d_model ** -0.5 * jnp.minimum(s ** -0.5, s * warmup_steps ** -1.5)
  return schedule


def cosine_schedule(learning_rate: float, warmup_steps: int, num_steps: int,
                    min_ratio: float) -> optax.Schedule:
  """Linear warmup to `learning_rate` (reached at update `warmup_steps`, counting from 1), then
  a cosine decay over the remaining `decay_steps = num_steps - warmup_steps` updates whose last
  one (update `num_steps`, the run's last) takes `min_ratio * learning_rate` (constant after).
  As in `wsd_schedule`, the decay counts its updates from 1: its k-th update is at
  `floor + (peak - floor) * (1 + cos(pi * k / decay_steps)) / 2`."""
  floor = learning_rate * min_ratio
  decay_steps = max(1, num_steps - warmup_steps)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    warm = learning_rate * (s + 1.0) / max(1, warmup_steps)
    progress = jnp.clip((s + 1.0 - warmup_steps) / decay_steps, 0.0, 1.0)  # k / decay_steps
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


# config.optimizer.schedule -> (config -> schedule); each reads config.optimizer (and the
# model's width or the run's length where its formula needs them).
SCHEDULES: dict[str, Callable[[Any], optax.Schedule]] = {
    'rsqrt': lambda c: rsqrt_schedule(c.optimizer.learning_rate, c.model.d_model,
                                      c.optimizer.warmup_steps),
    'cosine': lambda c: cosine_schedule(c.optimizer.learning_rate, c.optimizer.warmup_steps,
                                        c.train.num_steps, c.optimizer.min_learning_rate_ratio),
    'constant': lambda c: constant_schedule(c.optimizer.learning_rate, c.optimizer.warmup_steps),
    'wsd': lambda c: wsd_schedule(c.optimizer.learning_rate, c.optimizer.warmup_steps,
                                  c.train.num_steps, c.optimizer.decay_fraction,
                                  c.optimizer.min_learning_rate_ratio),
}


def make_schedule(config) -> optax.Schedule:
  """`config.optimizer.schedule`'s row of SCHEDULES, built from `config`."""
  name = config.optimizer.schedule
  if name not in SCHEDULES:
    raise ValueError(f'config.optimizer.schedule={name!r} is not one of {list(SCHEDULES)}')
  return SCHEDULES[name](config)
