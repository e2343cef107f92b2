"""A run whose loss turns NaN/inf (tfjax/training/loop/divergence.py): stop at once or skip, and
never checkpoint a non-finite state."""

import os

import jax
import numpy as np
import pytest

from run_helpers import read_metrics, tiny_config
from tfjax.training.checkpointing import checkpoint
from tfjax.training.loop import divergence, steps, train


def exploding_config(**train_overrides):
  """run_helpers' 1-layer copy-task decoder with a learning rate of 1e30: finite for the first
  steps of the warmup, NaN/inf within a few more."""
  config = tiny_config(num_steps=12, **{"eval_every": 100, "checkpoint_every": 1, **train_overrides})
  config.data.test_lengths = (4,)
  config.optimizer.update(lr=1e30, warmup_steps=20, min_lr=0.0)
  return config


def all_finite(tree):
  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))


def restored_params(workdir, config):
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  del config
  return runs.restore_run(workdir).params


def test_nan_loss_stops_the_run_at_that_step_and_keeps_the_last_finite_checkpoint(tmp_path):
  workdir = str(tmp_path / "run")
  config = exploding_config()
  with pytest.raises(divergence.Diverged, match=r"training diverged at step \d+") as info:
    train.train_and_evaluate(config, workdir)
  bad = info.value.step
  logged = read_metrics(workdir)
  assert logged[-1] == {"step": bad, "train/diverged": 1}
  # Every step logged before it was finite, and nothing was logged after it.
  finite_steps = [r["step"] for r in logged if "train/loss" in r]
  assert finite_steps == list(range(1, bad))
  assert all(np.isfinite(r["train/loss"]) and np.isfinite(r["train/grad_norm"])
             for r in logged if "train/loss" in r)
  saved = checkpoint.Checkpointer(workdir).steps()
  assert saved and max(saved) == bad - 1  # one checkpoint per step up to the last finite one
  assert f"newest checkpoint (step {bad - 1})" in str(info.value)
  # the lr the user set, not the warmup-scaled rate of that step (issue 60)
  assert "Lower optimizer.lr (set to 1e+30; the schedule's rate at step" in str(info.value)
  assert all_finite(restored_params(workdir, config))
  assert not os.path.exists(os.path.join(workdir, "train.lock"))  # released on the way out


def test_skip_nonfinite_skips_and_counts_the_updates(tmp_path):
  workdir = str(tmp_path / "run")
  config = exploding_config(skip_nonfinite=True, steps_per_call=3, log_every=3,
                            checkpoint_every=6)
  train.train_and_evaluate(config, workdir)
  logged = [r for r in read_metrics(workdir) if "train/skipped_steps" in r]
  assert [r["step"] for r in logged] == [3, 6, 9, 12]
  counts = [r["train/skipped_steps"] for r in logged]
  assert counts == sorted(counts) and counts[-1] > 0  # cumulative, and it did skip
  assert not any(r.get("train/diverged") for r in read_metrics(workdir))
  assert checkpoint.Checkpointer(workdir).steps()[-1] == 12
  assert all_finite(restored_params(workdir, config))


def test_multi_step_counts_nonfinite_steps_and_names_the_first():
  """steps.make_multi_step adds up the per-step flags of one call and keeps the first step."""
  def fake_step(state, batch):  # a 'loss' that is NaN on the batches marked bad
    bad = batch["bad"] > 0
    return state + 1, {"train/loss": 0.0, steps.NONFINITE: bad.astype("int32"),
                       steps.FIRST_NONFINITE: jax.numpy.where(bad, state + 1, -1)}
  multi = jax.jit(steps.make_multi_step(fake_step))
  batches = {"bad": np.asarray([0, 0, 1, 0, 1, 1], np.int32)}
  state, metrics = multi(np.int32(10), batches, np.int32(5))
  assert int(state) == 15
  assert int(metrics[steps.NONFINITE]) == 2 and int(metrics[steps.FIRST_NONFINITE]) == 13
  _, clean = multi(np.int32(0), batches, np.int32(2))
  assert int(clean[steps.NONFINITE]) == 0 and int(clean[steps.FIRST_NONFINITE]) == -1
