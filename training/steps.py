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

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from training.state import TrainState

Batch = dict[str, jax.Array]


def target_weights(batch: Batch) -> jax.Array:
  if 'targets_weights' in batch:
    return batch['targets_weights'].astype(jnp.float32)
  return (batch['targets'] > 0).astype(jnp.float32)


def apply_model(module, params, batch: Batch, *, deterministic: bool,
                dropout_rng: jax.Array | None = None) -> jax.Array:
  """Logits `[batch, len, vocab]` (float32); `logits[:, t]` predicts `targets[:, t]`."""
  rngs = {} if dropout_rng is None else {'dropout': dropout_rng}
  variables = {'params': params}
  if module.config.kind == 'encoder_decoder':
    return module.apply(
        variables, batch['inputs'], batch['targets'],
        inputs_segmentation=batch.get('inputs_segmentation'),
        targets_segmentation=batch.get('targets_segmentation'),
        inputs_position=batch.get('inputs_position'),
        targets_position=batch.get('targets_position'),
        deterministic=deterministic, rngs=rngs)
  return module.apply(variables, batch['targets'],
                      segmentation=batch.get('targets_segmentation'),
                      positions=batch.get('targets_position'),
                      deterministic=deterministic, rngs=rngs)


def smoothed_cross_entropy(logits: jax.Array, targets: jax.Array,
                           label_smoothing: float) -> jax.Array:
  """`[batch, len, vocab]`, `[batch, len]` -> per-token loss `[batch, len]` (float32).

  Cross-entropy against `(1 - ls)` on the target and `ls / (vocab - 1)` elsewhere, minus that
  distribution's entropy (the constant normaliser): 0 for a perfect model of it.
  """
  vocab = logits.shape[-1]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  if not label_smoothing:
    return -target_logp
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  normaliser = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low))
  loss = -(confidence * target_logp + low * (logp.sum(-1) - target_logp))
  return loss - normaliser


def _loss_sums(params, module, batch: Batch, dropout_rng, label_smoothing: float):
  logits = apply_model(module, params, batch, deterministic=False, dropout_rng=dropout_rng)
  weights = target_weights(batch)
  loss = smoothed_cross_entropy(logits, batch['targets'], label_smoothing)
  correct = (logits.argmax(-1) == batch['targets']).astype(jnp.float32)
  return (loss * weights).sum(), (weights.sum(), (correct * weights).sum())


def _split_micro_batches(batch: Batch, num: int) -> Batch:
  """`[B, ...]` -> `[num, B/num, ...]`; micro-batch k takes rows k, k+num, ... so that every
  micro-batch stays spread over all devices of the 'data' axis."""
  def split(x):
    return x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def make_train_step(module, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                    label_smoothing: float, grad_accum_steps: int = 1
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Any]]]:
  """(state, global batch) -> (new state, scalar metrics). A non-finite loss, gradient or
  updated parameter leaves the state unchanged (`metrics['finite']` is False) so a NaN can
  never reach a checkpoint."""
  grad_fn = jax.value_and_grad(_loss_sums, has_aux=True)

  def gradients(params, batch, rng):
    """Summed (not averaged) loss gradients and sums over the batch (micro-batches summed)."""
    if grad_accum_steps == 1:
      (loss, (weight, correct)), grads = grad_fn(params, module, batch, rng, label_smoothing)
      return grads, loss, weight, correct

    def micro_step(carry, xs):
      k, micro_batch = xs
      (loss, (weight, correct)), grads = grad_fn(
          params, module, micro_batch, jax.random.fold_in(rng, k), label_smoothing)
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
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    loss, grad_norm = loss_sum / denominator, optax.tree.norm(grads)
    param_norm = optax.tree.norm(params)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics = {'loss': loss, 'accuracy': correct / denominator, 'grad_norm': grad_norm,
               'param_norm': param_norm,
               'learning_rate': schedule(state.step), 'num_tokens': weight_sum,
               'finite': finite}
    return new_state, metrics

  return train_step


def make_eval_step(module) -> Callable[[Any, Batch], dict[str, jax.Array]]:
  """(params, batch) -> sums {'loss', 'correct', 'num_tokens'} (plain cross-entropy; pad rows
  and tokens have weight 0)."""
  def eval_step(params, batch: Batch):
    logits = apply_model(module, params, batch, deterministic=True)
    weights = target_weights(batch)
    loss = smoothed_cross_entropy(logits, batch['targets'], 0.0)
    correct = (logits.argmax(-1) == batch['targets']).astype(jnp.float32)
    return {'loss': (loss * weights).sum(), 'correct': (correct * weights).sum(),
            'num_tokens': weights.sum()}
  return eval_step
