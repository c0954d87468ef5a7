"""Label-smoothed cross-entropy: the reference formula and a fused one with its own gradient;
the symmetric KL divergence of R-Drop.

Smoothing puts `confidence = 1 - ls` on the target and `low = ls / (vocab - 1)` on every other
token. The loss is the cross-entropy against that distribution minus its entropy (the constant
normaliser), so a model predicting exactly that distribution has loss 0.

The fused version exists because on CPU the loss is a visible share of a small model's step:
the `[tokens, vocab]` logits are the largest tensor of the step, and autodiff of the reference
formula writes the log-probabilities out, scatters the target's gradient into a zero tensor
and adds broadcasts back together, each a full pass over `[tokens, vocab]`. Its gradient is
known in closed form,

    d loss / d logits = softmax(logits) - low - (confidence - low) * onehot(target),

which one elementwise pass computes from the logits and the saved log-sum-exp.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp


def _smoothing(label_smoothing: float, vocab: int) -> tuple[float, float, float]:
  """(confidence, low, normaliser) of the smoothed target distribution."""
  confidence = 1.0 - label_smoothing
  if not label_smoothing:
    return confidence, 0.0, 0.0
  low = label_smoothing / (vocab - 1)
  normaliser = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low))
  return confidence, low, normaliser


def smoothed_cross_entropy(logits: jax.Array, targets: jax.Array,
                           label_smoothing: float) -> jax.Array:
  """Reference: `[batch, len, vocab]`, `[batch, len]` -> per-token loss `[batch, len]` (f32)."""
  confidence, low, normaliser = _smoothing(label_smoothing, logits.shape[-1])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  if not label_smoothing:
    return -target_logp
  loss = -(confidence * target_logp + low * (logp.sum(-1) - target_logp))
  return loss - normaliser


def cross_entropy_and_accuracy(logits: jax.Array, targets: jax.Array,
                               label_smoothing: float) -> tuple[jax.Array, jax.Array]:
  """Fused: `[batch, len, vocab]`, `[batch, len]` -> (per-token loss, correct), both
  `[batch, len]` f32. Equal to `smoothed_cross_entropy` (value and gradient) up to rounding.

  `correct` is 1 where the target's logit is the largest (a tie counts as correct, unlike
  `argmax`, which picks the first index; ties of float logits do not happen in practice). It
  reuses the maximum the log-sum-exp needs instead of a separate argmax pass; it carries no
  gradient.
  """
  return _fused_loss(logits, targets, float(label_smoothing))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fused_loss(logits, targets, label_smoothing):
  outputs, _ = _fused_loss_fwd(logits, targets, label_smoothing)
  return outputs


def _fused_loss_fwd(logits, targets, label_smoothing):
  confidence, low, normaliser = _smoothing(label_smoothing, logits.shape[-1])
  logits32 = logits.astype(jnp.float32)
  max_logit = logits32.max(-1)
  log_sum_exp = max_logit + jnp.log(jnp.exp(logits32 - max_logit[..., None]).sum(-1))
  target_logit = jnp.take_along_axis(logits32, targets[..., None], axis=-1)[..., 0]
  target_logp = target_logit - log_sum_exp
  loss = -confidence * target_logp
  if label_smoothing:
    sum_logp = logits32.sum(-1) - logits.shape[-1] * log_sum_exp
    loss = loss - low * (sum_logp - target_logp) - normaliser
  correct = (target_logit >= max_logit).astype(jnp.float32)
  return (loss, correct), (logits, targets, log_sum_exp)


def _fused_loss_bwd(label_smoothing, residuals, cotangents):
  logits, targets, log_sum_exp = residuals
  d_loss, _ = cotangents  # `correct` is piecewise constant: no gradient
  confidence, low, _ = _smoothing(label_smoothing, logits.shape[-1])
  probs = jnp.exp(logits.astype(jnp.float32) - log_sum_exp[..., None])
  vocab_ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  is_target = vocab_ids == targets[..., None]
  d_logits = probs - low - jnp.where(is_target, confidence - low, 0.0)
  return (d_logits * d_loss[..., None]).astype(logits.dtype), None


_fused_loss.defvjp(_fused_loss_fwd, _fused_loss_bwd)



def symmetric_kl(logits_1: jax.Array, logits_2: jax.Array) -> jax.Array:
  """KL(P1 || P2) + KL(P2 || P1) per position, P = softmax(logits): `[batch, len, vocab]` x 2
  -> `[batch, len]` (f32). R-Drop's regulariser (Liang et al. 2021, eq. 2 without its 1/2),
  with a gradient to both sides, as the paper's code.

  Fused as the cross-entropy is, for the same reason (the `[tokens, vocab]` tensors are the
  step's largest): the forward pass keeps each side's log-sum-exp and KL, and the gradient is
  one elementwise pass in closed form. With d = log P1 - log P2,

      d S / d logits_1 = P1 (d - KL(P1 || P2)) + P1 - P2,
      d S / d logits_2 = -P2 (d + KL(P2 || P1)) + P2 - P1.
  """
  return _fused_kl(logits_1, logits_2)


def _log_sum_exp(logits32: jax.Array) -> jax.Array:
  max_logit = logits32.max(-1)
  return max_logit + jnp.log(jnp.exp(logits32 - max_logit[..., None]).sum(-1))


@jax.custom_vjp
def _fused_kl(logits_1, logits_2):
  return _fused_kl_fwd(logits_1, logits_2)[0]


def _fused_kl_fwd(logits_1, logits_2):
  logits32 = logits_1.astype(jnp.float32), logits_2.astype(jnp.float32)
  lse_1, lse_2 = (_log_sum_exp(x) for x in logits32)
  logp_1, logp_2 = logits32[0] - lse_1[..., None], logits32[1] - lse_2[..., None]
  kl_12 = (jnp.exp(logp_1) * (logp_1 - logp_2)).sum(-1)
  kl_21 = (jnp.exp(logp_2) * (logp_2 - logp_1)).sum(-1)
  return kl_12 + kl_21, (logits_1, logits_2, lse_1, lse_2, kl_12, kl_21)


def _fused_kl_bwd(residuals, d_kl):
  logits_1, logits_2, lse_1, lse_2, kl_12, kl_21 = residuals
  logp_1 = logits_1.astype(jnp.float32) - lse_1[..., None]
  logp_2 = logits_2.astype(jnp.float32) - lse_2[..., None]
  p_1, p_2, d = jnp.exp(logp_1), jnp.exp(logp_2), logp_1 - logp_2
  g = d_kl[..., None]
  d_1 = g * (p_1 * (d - kl_12[..., None]) + p_1 - p_2)
  d_2 = g * (p_2 * (-d - kl_21[..., None]) + p_2 - p_1)
  return d_1.astype(logits_1.dtype), d_2.astype(logits_2.dtype)


_fused_kl.defvjp(_fused_kl_fwd, _fused_kl_bwd)


def symmetric_kl_reference(logits_1: jax.Array, logits_2: jax.Array) -> jax.Array:
  """`symmetric_kl` by autodiff of its formula (the fused one's reference)."""
  logp_1 = jax.nn.log_softmax(logits_1.astype(jnp.float32), axis=-1)
  logp_2 = jax.nn.log_softmax(logits_2.astype(jnp.float32), axis=-1)
  return ((jnp.exp(logp_1) - jnp.exp(logp_2)) * (logp_1 - logp_2)).sum(-1)
