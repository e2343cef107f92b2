"""tfjax/training/tasks.py: task names, what each task feeds its model, and its loss statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from tfjax.nn.models import build_model
from tfjax.training import tasks


def test_every_task_names_its_family_and_bad_pairs_are_errors():
  for task, family in tasks.TASK_FAMILY.items():
    assert tasks.check_task(task, family) == task
  with pytest.raises(ValueError, match=r"config.task='translate'.*choose one of"):
    tasks.check_task("translate")
  with pytest.raises(ValueError, match=r"needs model.family='encoder_decoder'"):
    tasks.check_task("seq2seq", "decoder")


def test_model_inputs_and_row_lengths_per_task():
  ids = np.zeros((2, 5), np.int32)
  lm = {"inputs": ids, "positions": ids + 1}
  args, kwargs = tasks.model_inputs(lm, "lm")
  assert args[0] is ids and kwargs == {"segment_ids": None, "positions": lm["positions"]}
  assert tasks.row_lengths(lm, "lm") == (5, None)
  s2s = {"encoder_inputs": np.zeros((2, 7), np.int32), "decoder_inputs": ids}
  args, kwargs = tasks.model_inputs(s2s, "seq2seq")
  assert args == (s2s["encoder_inputs"], ids) and set(kwargs) == {"encoder_segment_ids",
                                                                  "decoder_segment_ids"}
  assert tasks.row_lengths(s2s, "seq2seq") == (5, 7)
  assert "token_type_ids" in tasks.model_inputs({"inputs": ids}, "mlm")[1]


def test_forward_statistics_equal_numpy_cross_entropy_and_row_accuracy():
  cfg = tiny_config(family="decoder", vocab_size=7)
  model = build_model(cfg)
  rng = np.random.default_rng(0)
  inputs = rng.integers(1, 7, (3, 4)).astype(np.int32)
  targets = rng.integers(1, 7, (3, 4)).astype(np.int32)
  weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  batch = {"inputs": inputs, "targets": targets, "weights": weights}
  params = model.init(jax.random.PRNGKey(0), inputs)["params"]
  stats = tasks.forward(model, params, batch, "lm")
  logits = np.asarray(model.apply({"params": params}, inputs), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(stats["loss_sum"], (nll * weights).sum(), rtol=1e-5)
  assert float(stats["weight_sum"]) == weights.sum()
  right = logits.argmax(-1) == targets
  assert float(stats["correct_sum"]) == (right * weights).sum()
  rows = [bool(np.all(right[r][weights[r] > 0])) and weights[r].any() for r in range(3)]
  np.testing.assert_array_equal(stats["row_correct"], rows)
  np.testing.assert_array_equal(stats["row_count"], [True, True, False])
  assert jnp.asarray(stats["loss_sum"]).dtype == jnp.float32
