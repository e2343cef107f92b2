"""tfjax/training/loop/steps.py: the train step math (multi-step calls, gradient accumulation)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training.loop import experiment, steps
from tfjax.training.parallel import cpu_fusion, sharding
from tfjax.nn.models import build_model
from run_helpers import one_device_placement, tiny_config
from conftest import fast_jit  # these tests compare values: unoptimized programs compile faster



def test_multi_step_equals_single_steps_and_ignores_padding():
  """make_multi_step over 5 of 8 stacked batches = 5 train_step calls (the 3 padded rows unread);
  its metrics are the 5th step's."""
  config = tiny_config()
  exp = experiment.prepare(config)
  model = build_model(exp.model_config.replace(deterministic=False))
  step_fn = steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.0, 1)
  state = experiment.state_layout(exp, one_device_placement(config)).init()
  batches = [exp.dataset.train_batch(i, 8) for i in range(5)]
  single = fast_jit(step_fn)
  expected = state
  for batch in batches:
    expected, expected_metrics = single(expected, batch)
  stacked = experiment.stack_batches(batches, 8)
  for key in stacked:  # other batches in the padding must not matter
    stacked[key][5:] = np.asarray(batches[0][key])[::-1]
  got, got_metrics = fast_jit(steps.make_multi_step(step_fn))(state, stacked, np.int32(5))
  assert int(got.step) == 5
  # atol: the scanned and the single-step programs round differently (up to ~9e-7 on weights near
  # zero with XLA:CPU's older fusion emitters, which the suite compiles with); a padded batch read
  # would move weights by ~lr = 3e-3.
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(expected.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)
  for key in expected_metrics:
    np.testing.assert_allclose(got_metrics[key], expected_metrics[key], rtol=1e-5)


def test_gradient_accumulation_equals_one_big_batch():
  config = tiny_config()
  exp = experiment.prepare(config)
  model = build_model(exp.model_config)
  placement = sharding.BatchPlacement.for_config(config)
  mesh = placement.mesh
  state = experiment.state_layout(exp, placement).init()
  batch = {k: jnp.asarray(v) for k, v in exp.dataset.train_batch(0, 8).items()}
  one = fast_jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 1))
  four = fast_jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 4))
  # Rows carry different numbers of answer tokens, so a mean of micro-batch means would differ.
  weights = np.asarray(batch["weights"]).sum(1)
  assert len(set(weights.tolist())) > 1
  # The same four micro-batches, summed by cpu_fusion.summed_over_shards' flat all-reduce.
  flat = functools.partial(cpu_fusion.summed_over_shards, mesh=mesh,
                           batch_spec=placement.sharding.spec)
  four_flat = fast_jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 4,
                                            flat))
  state_one, metrics_one = one(state, batch)
  for state_four, metrics_four in (four(state, batch), four_flat(state, batch)):
    np.testing.assert_allclose(metrics_one["train/loss"], metrics_four["train/loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 state_one.params, state_four.params)


def test_headline_eval_loss_covers_the_trained_lengths_and_each_length_has_its_own():
  # A stand-in eval step returning each group's sums: the expected values are plain arithmetic.
  sums = {"len_8": dict(loss_sum=2.0, weight_sum=4.0, correct_sum=3.0, exact_sum=1.0, row_sum=2.0),
          "len_16": dict(loss_sum=6.0, weight_sum=4.0, correct_sum=1.0, exact_sum=0.0, row_sum=2.0),
          "len_24": dict(loss_sum=40.0, weight_sum=8.0, correct_sum=0.0, exact_sum=0.0,
                         row_sum=2.0)}
  batches = [(name, name) for name in sums]
  out = steps.evaluate(lambda params, name: sums[name], None, batches, trained_lengths=(1, 16))
  assert out["eval/loss"] == (2.0 + 6.0) / (4.0 + 4.0)  # lengths 8 and 16, not 24
  assert out["eval/accuracy"] == (3.0 + 1.0) / 8.0
  assert out["eval/loss_all_lengths"] == 48.0 / 16.0
  assert (out["eval/loss@8"], out["eval/loss@16"], out["eval/loss@24"]) == (0.5, 1.5, 5.0)
  assert out["eval/exact_match@8"] == 0.5
  # Without trained lengths (text data: one group) the headline is every group's average.
  plain = steps.evaluate(lambda params, name: sums[name], None, batches)
  assert plain["eval/loss"] == 48.0 / 16.0 and "eval/loss_all_lengths" not in plain
