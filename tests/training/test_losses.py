"""Losses against NumPy written out here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.training.optim import losses

B, L, V = 2, 5, 7


def numpy_cross_entropy(logits, targets, weights, eps):
  """sum_i w_i * -sum_v q_iv log p_iv with q = (1 - eps) * onehot + eps / V, in float64."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  onehot = np.eye(logits.shape[-1])[targets]
  q = (1 - eps) * onehot + eps / logits.shape[-1]
  per_token = -(q * log_probs).sum(-1)
  return float((weights * per_token).sum()), float(weights.sum())


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(B, L, V)).astype(np.float32) * 3
  targets = rng.integers(0, V, size=(B, L))
  weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
  return logits, targets, weights


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_cross_entropy_matches_numpy(batch, eps):
  logits, targets, weights = batch
  loss_sum, weight_sum = losses.cross_entropy(logits, targets, weights, label_smoothing=eps)
  expected_sum, expected_weight = numpy_cross_entropy(logits, targets, weights, eps)
  assert loss_sum.dtype == jnp.float32
  assert float(loss_sum) == pytest.approx(expected_sum, rel=1e-5)
  assert float(weight_sum) == expected_weight


def test_padding_never_counts(batch):
  logits, targets, weights = batch
  reference = losses.cross_entropy(logits, targets, weights, label_smoothing=0.1)
  pad = weights == 0
  garbage_logits = np.where(pad[..., None], 1e30, logits).astype(np.float32)
  garbage_targets = np.where(pad, -1, targets)  # out-of-range padding ids are fine too
  changed = losses.cross_entropy(garbage_logits, garbage_targets, weights, label_smoothing=0.1)
  np.testing.assert_array_equal(np.asarray(changed), np.asarray(reference))
  grad = jax.grad(lambda x: losses.cross_entropy(x, targets, weights, 0.1)[0])(jnp.asarray(logits))
  assert np.all(np.asarray(grad)[pad] == 0)
  assert np.all(np.isfinite(np.asarray(grad)))


def test_no_weights_means_all_ones(batch):
  logits, targets, _ = batch
  loss_sum, weight_sum = losses.cross_entropy(logits, targets)
  expected_sum, _ = numpy_cross_entropy(logits, targets, np.ones((B, L)), 0.0)
  assert float(loss_sum) == pytest.approx(expected_sum, rel=1e-5)
  assert float(weight_sum) == B * L


def test_low_precision_logits_are_reduced_in_float32(batch):
  logits, targets, weights = batch
  bf16 = jnp.asarray(logits, jnp.bfloat16)
  loss_sum, _ = losses.cross_entropy(bf16, targets, weights, label_smoothing=0.1)
  expected_sum, _ = numpy_cross_entropy(np.asarray(bf16, np.float32), targets, weights, 0.1)
  assert loss_sum.dtype == jnp.float32
  assert float(loss_sum) == pytest.approx(expected_sum, rel=1e-5)


def test_uniform_logits_cost_log_vocab_for_any_smoothing():
  logits = jnp.zeros((1, 3, V))
  for eps in (0.0, 0.3):
    loss_sum, weight_sum = losses.cross_entropy(logits, jnp.array([[0, 3, 6]]), label_smoothing=eps)
    assert float(loss_sum / weight_sum) == pytest.approx(np.log(V), rel=1e-6)


def test_token_accuracy():
  logits = jnp.array([[[0.0, 5.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]]])
  targets = jnp.array([[1, 1, 2, 0]])  # correct, wrong, correct, correct-but-padding
  correct, total = losses.token_accuracy(logits, targets, jnp.array([[1.0, 1.0, 1.0, 0.0]]))
  assert (float(correct), float(total)) == (2.0, 3.0)
  correct, total = losses.token_accuracy(logits, targets)
  assert (float(correct), float(total)) == (3.0, 4.0)


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_cross_entropy_of_class_logits_with_masked_rows(eps):
  """Classification shapes (logits [B, C], labels [B]): rows with weight 0 (a padded eval batch's
  filler) add nothing to either sum."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 4)).astype(np.float32)
  labels = rng.integers(0, 4, size=6)
  expected_sum, count = numpy_cross_entropy(logits, labels, np.ones(6), eps)
  loss_sum, weight_sum = losses.cross_entropy(logits, labels, label_smoothing=eps)
  assert float(loss_sum) == pytest.approx(expected_sum, rel=1e-5) and float(weight_sum) == count
  weights = np.array([1, 1, 1, 1, 0, 0], np.float32)
  masked_sum, masked_count = numpy_cross_entropy(logits, labels, weights, eps)
  loss_sum, weight_sum = losses.cross_entropy(logits, labels, weights, label_smoothing=eps)
  assert float(loss_sum) == pytest.approx(masked_sum, rel=1e-5)
  assert float(weight_sum) == masked_count == 4
  assert [float(x) for x in losses.cross_entropy(logits, labels, np.zeros(6))] == [0.0, 0.0]


def test_label_smoothing_out_of_range():
  with pytest.raises(ValueError, match="label_smoothing"):
    losses.cross_entropy(jnp.zeros((1, 1, V)), jnp.zeros((1, 1), jnp.int32), label_smoothing=1.0)
