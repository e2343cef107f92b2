"""Token and classification losses, always computed in float32.

Label smoothing uses optax.smooth_labels' convention: the target distribution is
  q = (1 - eps) * onehot(target) + eps / V          (V = vocabulary / class count),
so the true class gets 1 - eps + eps / V. The loss is the plain cross entropy -sum_v q_v log p_v
against q; its minimum is the entropy of q (> 0 when eps > 0), not 0 — T5 subtracts that constant,
we do not. Report perplexity from an eps = 0 loss.

Sequence losses return (sum, weight_sum) rather than a mean so that callers can add them up across
micro-batches and devices before dividing once. Positions with weight 0 (padding) contribute
nothing, whatever their logits or targets (targets there may even be out of range).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp


def _check_label_smoothing(label_smoothing) -> None:
  if isinstance(label_smoothing, numbers.Real) and not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1)")


def _weights_or_ones(weights_BxL, targets_BxL):
  if weights_BxL is None:
    return jnp.ones(targets_BxL.shape, jnp.float32)
  return jnp.asarray(weights_BxL, jnp.float32)


def cross_entropy(logits_BxLxV, targets_BxL, weights_BxL=None, label_smoothing: float = 0.0):
  """(sum of weight * CE against the smoothed targets, sum of weights), both float32 scalars.

  Works for any leading shape: logits [..., V], targets and weights [...]. weights None = all 1.
  -sum_v q_v log p_v = -(1 - eps) log p_target - eps * mean_v log p_v. log p_target is a sum of
  log p masked to the target's column, not a gather (take_along_axis): the mask's gradient is an
  elementwise select that fuses into the softmax's gradient, where a gather's gradient is a
  scatter-add into a zeroed [..., V] float32 buffer, a separate pass over the largest tensor of
  an LM's step. The mask is an iota comparison that the compiler fuses; no one-hot is stored.
  """
  _check_label_smoothing(label_smoothing)
  vocab = logits_BxLxV.shape[-1]
  log_probs_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  # Clamp so padding targets (e.g. -1) still index in range; those positions are zeroed below.
  safe_targets_BxL = jnp.clip(targets_BxL, 0, vocab - 1).astype(jnp.int32)
  vocab_ids_BxLxV = jax.lax.broadcasted_iota(jnp.int32, log_probs_BxLxV.shape,
                                             log_probs_BxLxV.ndim - 1)
  target_log_prob_BxL = jnp.sum(
      jnp.where(vocab_ids_BxLxV == safe_targets_BxL[..., None], log_probs_BxLxV, 0.0), -1)
  loss_BxL = -target_log_prob_BxL
  if label_smoothing:
    loss_BxL = ((1.0 - label_smoothing) * loss_BxL
                - label_smoothing * jnp.mean(log_probs_BxLxV, axis=-1))
  weights_BxL = _weights_or_ones(weights_BxL, targets_BxL)
  # where, not just *: 0 * inf (an extreme logit at a padded position) would be NaN.
  loss_BxL = jnp.where(weights_BxL != 0, loss_BxL * weights_BxL, 0.0)
  return jnp.sum(loss_BxL), jnp.sum(weights_BxL)


def token_accuracy(logits_BxLxV, targets_BxL, weights_BxL=None):
  """(weighted count of positions whose argmax equals the target, sum of weights), float32."""
  weights_BxL = _weights_or_ones(weights_BxL, targets_BxL)
  correct_BxL = jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL
  return jnp.sum(jnp.where(correct_BxL, weights_BxL, 0.0)), jnp.sum(weights_BxL)

