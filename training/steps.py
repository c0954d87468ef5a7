"""Loss, train step and eval step: pure functions of (state/params, batch), jitted by the trainer.

Batches are dicts of `[batch, len]` arrays: `inputs`/`targets` (+ `*_segmentation`,
`*_position` when packed) for the encoder-decoder, `targets` (+ `targets_weights`) for the
decoder-only model. Loss weights are `targets_weights` if present, else `targets > 0`.

The train loss is label-smoothed cross-entropy minus the entropy of the smoothed target
distribution (so a model predicting exactly that distribution has loss 0), averaged over the
non-pad target tokens of the global batch. Eval reports plain (unsmoothed) cross-entropy, so
that `perplexity = exp(eval loss)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from model import bind, partitioning
from model.config import ModelConfig
from model.kinds import adapter_of
from model.partitioning import Rules
from training import mesh as mesh_lib, state as state_lib
from training.losses import cross_entropy_and_accuracy
from training.state import TrainState

Batch = dict[str, jax.Array]


def target_weights(batch: Batch) -> jax.Array:
  if 'targets_weights' in batch:
    return batch['targets_weights'].astype(jnp.float32)
  return (batch['targets'] > 0).astype(jnp.float32)


def apply_model(config: ModelConfig, params, batch: Batch, *, deterministic: bool,
                dropout_rng: jax.Array | None = None) -> jax.Array:
  """Logits `[batch, len, vocab]` (float32); `logits[:, t]` predicts `targets[:, t]`."""
  return adapter_of(config).apply_batch(bind(config, params), batch,
                                        deterministic=deterministic, dropout_rng=dropout_rng)


def _loss_sums(params, config, batch: Batch, dropout_rng, label_smoothing: float,
               z_loss: float = 0.0):
  """-> (the objective summed over tokens, (token count, correct count, loss sum)). The
  objective is the loss, plus `z_loss * log(Z)^2` per token when `z_loss` > 0 (PaLM's
  auxiliary loss: it keeps the softmax normaliser Z near 1); the loss sum is reported."""
  logits = apply_model(config, params, batch, deterministic=False, dropout_rng=dropout_rng)
  weights = target_weights(batch)
  loss, correct = cross_entropy_and_accuracy(logits, batch['targets'], label_smoothing)
  loss_sum = (loss * weights).sum()
  objective = loss_sum
  if z_loss:  # a Python branch: without it the objective is exactly the loss
    log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    objective = loss_sum + z_loss * (jnp.square(log_z) * weights).sum()
  return objective, (weights.sum(), (correct * weights).sum(), loss_sum)


def _split_micro_batches(batch: Batch, num: int) -> Batch:
  """`[B, ...]` -> `[num, B/num, ...]`; micro-batch k takes rows k, k+num, ... so that every
  micro-batch stays spread over all devices of the 'data' axis."""
  def split(x):
    return x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def make_train_step(config: ModelConfig, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, *, label_smoothing: float, grad_accum_steps: int = 1,
                    z_loss: float = 0.0
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Any]]]:
  """(state, global batch) -> (new state, scalar metrics). A non-finite loss or gradient
  leaves the state unchanged (`metrics['finite']` is False) so a NaN can never reach a
  checkpoint. The parameter norm is not computed here (a full pass over the parameters every
  step): see `parameter_norm`."""
  grad_fn = jax.value_and_grad(_loss_sums, has_aux=True)

  def gradients(params, batch, rng):
    """Summed (not averaged) loss gradients and sums over the batch (micro-batches summed)."""
    if grad_accum_steps == 1:
      (_, (weight, correct, loss)), grads = grad_fn(params, config, batch, rng,
                                                    label_smoothing, z_loss)
      return grads, loss, weight, correct

    def micro_step(carry, xs):
      k, micro_batch = xs
      (_, (weight, correct, loss)), grads = grad_fn(
          params, config, micro_batch, jax.random.fold_in(rng, k), label_smoothing, z_loss)
      return jax.tree.map(jnp.add, carry, (grads, loss, weight, correct)), None

    zeros = (jax.tree.map(jnp.zeros_like, params),) + (jnp.zeros((), jnp.float32),) * 3
    micro_batches = _split_micro_batches(batch, grad_accum_steps)
    sums, _ = jax.lax.scan(micro_step, zeros, (jnp.arange(grad_accum_steps), micro_batches))
    return sums

  def train_step(state: TrainState, batch: Batch):
    rng = jax.random.fold_in(state.rng, state.step)  # the dropout key depends on the step only
    grads, loss_sum, weight_sum, correct = gradients(state.params, batch, rng)
    denominator = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denominator, grads)  # mean over non-pad tokens
    loss, grad_norm = loss_sum / denominator, optax.tree.norm(grads)
    # Decided before the update so that XLA fuses the select into the optimizer's elementwise
    # pass; finite gradients give a finite update (Adam's is bounded by the learning rate).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics = {'loss': loss, 'accuracy': correct / denominator, 'grad_norm': grad_norm,
               'learning_rate': schedule(state.step), 'num_tokens': weight_sum,
               'finite': finite}
    return new_state, metrics

  return train_step


@jax.jit
def parameter_norm(params) -> jax.Array:
  """Global L2 norm of the parameters: logged at log steps only."""
  return optax.tree.norm(params)


def make_eval_step(config: ModelConfig) -> Callable[[Any, Batch], dict[str, jax.Array]]:
  """(params, batch) -> sums {'loss', 'correct', 'num_tokens'} (plain cross-entropy; pad rows
  and tokens have weight 0)."""
  def eval_step(params, batch: Batch):
    logits = apply_model(config, params, batch, deterministic=True)
    weights = target_weights(batch)
    loss, correct = cross_entropy_and_accuracy(logits, batch['targets'], 0.0)
    return {'loss': (loss * weights).sum(), 'correct': (correct * weights).sum(),
            'num_tokens': weights.sum()}
  return eval_step


def _with_activation_sharding(fn, mesh, rules):
  """`fn` traced inside `partitioning.activation_sharding` (the layer-boundary constraints)."""
  def traced(*args):
    with partitioning.activation_sharding(mesh, rules):
      return fn(*args)
  return traced


def jit_train_step(config: ModelConfig, tx: optax.GradientTransformation,
                   schedule: optax.Schedule, mesh, *, label_smoothing: float,
                   grad_accum_steps: int = 1, rules: Rules | None = None, z_loss: float = 0.0):
  """`make_train_step` compiled for `mesh`: the state laid out by `state.state_shardings`
  and donated (updated in place), the batch split over data x fsdp, the metrics replicated."""
  rules = mesh_lib.rules() if rules is None else rules
  shardings = state_lib.state_shardings(config, tx, mesh, rules)
  replicated, batch_sharding = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
  step = make_train_step(config, tx, schedule, label_smoothing=label_smoothing,
                         grad_accum_steps=grad_accum_steps, z_loss=z_loss)
  return jax.jit(_with_activation_sharding(step, mesh, rules),
                 in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, replicated), donate_argnums=0)


def jit_eval_step(config: ModelConfig, mesh, rules: Rules | None = None):
  """`make_eval_step` compiled for `mesh` (params laid out as in training, batch split over
  data x fsdp)."""
  rules = mesh_lib.rules() if rules is None else rules
  shardings = state_lib.state_shardings(config, optax.identity(), mesh, rules)
  return jax.jit(_with_activation_sharding(make_eval_step(config), mesh, rules),
                 in_shardings=(shardings.params, mesh_lib.batch_sharding(mesh)),
                 out_shardings=mesh_lib.replicated(mesh))
