"""Loss, train step and eval step: pure functions of (state/params, batch), jitted by the trainer.

Batches are dicts of `[batch, len]` arrays: `inputs`/`targets` (+ `*_segmentation`,
`*_position` when packed) for the encoder-decoder, `targets` (+ `targets_weights`) for the
decoder-only model. Loss weights are `targets_weights` if present, else `targets > 0`.

The train loss is label-smoothed cross-entropy minus the entropy of the smoothed target
distribution (so a model predicting exactly that distribution has loss 0), averaged over the
non-pad target tokens of the global batch. Eval reports plain (unsmoothed) cross-entropy, so
that `perplexity = exp(eval loss)`.

R-Drop (Liang et al. 2021; `rdrop_alpha` > 0) runs each batch through the model twice, with
two dropout masks, and trains on half the paper's eq. (3), per non-pad target token t:

    objective_t = 1/2 [CE_1(t) + CE_2(t) + alpha * 1/2 (KL(P1_t || P2_t) + KL(P2_t || P1_t))]

summed over the tokens and divided by their count, as the plain loss (`alpha` is the paper's:
5 for its translation tasks; the factor 1/2 keeps the loss on the plain loss's scale). CE is
each pass's smoothed cross-entropy; the reported loss and accuracy are the two passes' means,
and `rdrop_kl` the mean over tokens of KL(P1 || P2) + KL(P2 || P1).
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
from training.losses import cross_entropy_and_accuracy, symmetric_kl
from training.state import TrainState

Batch = dict[str, jax.Array]
# What a step sums over its tokens (and its micro-batches): R-Drop adds 'rdrop_kl'.
SUMS = ('num_tokens', 'correct', 'loss')


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
               z_loss: float = 0.0, rdrop_alpha: float = 0.0):
  """-> (the objective summed over tokens, sums {'num_tokens', 'correct', 'loss'}, plus
  'rdrop_kl' with R-Drop). The objective is the loss, plus `z_loss * log(Z)^2` per token when
  `z_loss` > 0 (PaLM's auxiliary loss: it keeps the softmax normaliser Z near 1); the loss sum
  is reported. `rdrop_alpha` > 0: R-Drop's two passes (the module docstring)."""
  if rdrop_alpha:  # a Python branch: without it, one pass, the plain program
    return _rdrop_loss_sums(params, config, batch, dropout_rng, label_smoothing, z_loss,
                            rdrop_alpha)
  logits = apply_model(config, params, batch, deterministic=False, dropout_rng=dropout_rng)
  return _token_sums(logits, batch, target_weights(batch), label_smoothing, z_loss)


def _token_sums(logits, batch: Batch, weights, label_smoothing: float, z_loss: float):
  """One pass's logits `[batch, len, vocab]` -> (objective sum, sums {'num_tokens',
  'correct', 'loss'}) over the tokens `weights` `[batch, len]` counts."""
  loss, correct = cross_entropy_and_accuracy(logits, batch['targets'], label_smoothing)
  loss_sum = (loss * weights).sum()
  objective = loss_sum
  if z_loss:  # a Python branch: without it the objective is exactly the loss
    log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    objective = loss_sum + z_loss * (jnp.square(log_z) * weights).sum()
  return objective, dict(zip(SUMS, (weights.sum(), (correct * weights).sum(), loss_sum),
                             strict=True))


def _rdrop_loss_sums(params, config, batch: Batch, dropout_rng, label_smoothing: float,
                     z_loss: float, alpha: float):
  """R-Drop: the same batch through the model twice, with the dropout keys split from this
  step's key (so a resumed run draws the same two masks), -> `_loss_sums`' result with the
  passes' objectives and sums averaged, plus alpha/4 x the tokens' symmetric KL."""
  weights = target_weights(batch)
  passes = [apply_model(config, params, batch, deterministic=False, dropout_rng=key)
            for key in jax.random.split(dropout_rng)]
  (objective_1, sums_1), (objective_2, sums_2) = (
      _token_sums(logits, batch, weights, label_smoothing, z_loss) for logits in passes)
  kl_sum = (symmetric_kl(*passes) * weights).sum()
  objective = (objective_1 + objective_2) / 2 + alpha / 4 * kl_sum
  sums = jax.tree.map(lambda a, b: (a + b) / 2, sums_1, sums_2)
  return objective, {**sums, 'rdrop_kl': kl_sum}


def _split_micro_batches(batch: Batch, num: int) -> Batch:
  """`[B, ...]` -> `[num, B/num, ...]`; micro-batch k takes rows k, k+num, ... so that every
  micro-batch stays spread over all devices of the 'data' axis."""
  def split(x):
    return x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def make_train_step(config: ModelConfig, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, *, label_smoothing: float, grad_accum_steps: int = 1,
                    z_loss: float = 0.0, rdrop_alpha: float = 0.0
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Any]]]:
  """(state, global batch) -> (new state, scalar metrics). A non-finite loss or gradient
  leaves the state unchanged (`metrics['finite']` is False) so a NaN can never reach a
  checkpoint. The parameter norm is not computed here (a full pass over the parameters every
  step): see `parameter_norm`."""
  grad_fn = jax.value_and_grad(_loss_sums, has_aux=True)

  def gradients(params, batch, rng):
    """Summed (not averaged) loss gradients and sums over the batch (micro-batches summed)."""
    if grad_accum_steps == 1:
      (_, sums), grads = grad_fn(params, config, batch, rng, label_smoothing, z_loss,
                                 rdrop_alpha)
      return grads, sums

    def micro_step(carry, xs):
      k, micro_batch = xs
      (_, sums), grads = grad_fn(params, config, micro_batch, jax.random.fold_in(rng, k),
                                 label_smoothing, z_loss, rdrop_alpha)
      return jax.tree.map(jnp.add, carry, (grads, sums)), None

    names = SUMS + (('rdrop_kl',) if rdrop_alpha else ())
    zeros = (jax.tree.map(jnp.zeros_like, params),
             {name: jnp.zeros((), jnp.float32) for name in names})
    micro_batches = _split_micro_batches(batch, grad_accum_steps)
    (grads, sums), _ = jax.lax.scan(micro_step, zeros,
                                    (jnp.arange(grad_accum_steps), micro_batches))
    return grads, sums

  def train_step(state: TrainState, batch: Batch):
    rng = jax.random.fold_in(state.rng, state.step)  # the dropout key depends on the step only
    grads, sums = gradients(state.params, batch, rng)
    weight_sum = sums['num_tokens']
    denominator = jnp.maximum(weight_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denominator, grads)  # mean over non-pad tokens
    loss, grad_norm = sums['loss'] / denominator, optax.tree.norm(grads)
    # Decided before the update so that XLA fuses the select into the optimizer's elementwise
    # pass; finite gradients give a finite update (Adam's is bounded by the learning rate).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics = {'loss': loss, 'accuracy': sums['correct'] / denominator, 'grad_norm': grad_norm,
               'learning_rate': schedule(state.step), 'num_tokens': weight_sum,
               'finite': finite}
    if 'rdrop_kl' in sums:
      metrics['rdrop_kl'] = sums['rdrop_kl'] / denominator
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
                   grad_accum_steps: int = 1, rules: Rules | None = None, z_loss: float = 0.0,
                   rdrop_alpha: float = 0.0):
  """`make_train_step` compiled for `mesh`: the state laid out by `state.state_shardings`
  and donated (updated in place), the batch split over data x fsdp, the metrics replicated."""
  rules = mesh_lib.rules() if rules is None else rules
  shardings = state_lib.state_shardings(config, tx, mesh, rules)
  replicated, batch_sharding = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
  step = make_train_step(config, tx, schedule, label_smoothing=label_smoothing,
                         grad_accum_steps=grad_accum_steps, z_loss=z_loss,
                         rdrop_alpha=rdrop_alpha)
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
