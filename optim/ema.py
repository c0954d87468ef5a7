"""The exponential moving average of the weights (`config.train.ema_decay`), in one place: the
transform that keeps it beside the optimizer's state, and which weights a train state or a
checkpoint gives to use (evaluation, decoding, export, `init_from`). Nothing else knows where
the average is kept: the trainer, `workdir.checkpoint` and `workdir.restore` ask here."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# Where a checkpoint's train state (`TrainState`: step, params, opt_state, rng) keeps the
# trained parameters, and the average (`opt_state` is an `EmaState`, its field `ema`).
PARAMS, AVERAGE = ('params',), ('opt_state', 'ema')


class EmaState(NamedTuple):
  """The optimizer state with an exponential moving average of the parameters (`with_ema`):
  the inner optimizer's, the updates counted, and the average (shaped and laid out like the
  parameters, checkpointed with the rest)."""
  inner: Any
  count: jax.Array
  ema: Any


def decay(config) -> float:
  """`config.train.ema_decay`; 0 (no average) for a config without it (or a train section)."""
  return config.train.get('ema_decay', 0.0) if config is not None and 'train' in config else 0.0


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


def wrap(tx: optax.GradientTransformation, config) -> optax.GradientTransformation:
  """`tx` with the average when `config` asks for one, else `tx` itself."""
  return with_ema(tx, decay(config)) if decay(config) else tx


def weights(state) -> Any:
  """The parameters a train state evaluates and decodes with: the moving average when the run
  keeps one, else the parameters."""
  return state.opt_state.ema if isinstance(state.opt_state, EmaState) else state.params


def stored_weights(config) -> tuple[str, ...]:
  """Where a checkpoint of the run with `config` (its config.json; None: parameters alone, an
  import's) keeps the weights to use: the average when the run kept one, else the parameters."""
  return AVERAGE if decay(config) else PARAMS
