"""The training loop leaves the devices alone between sync points (logs, evals, checkpoints, the
end): no device value is read back on other steps, and the next call's batches are placed while
the current call runs (tfjax/training/loop/train.py, experiment.make_step_runner)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_helpers import one_device_placement, read_metrics, tiny_config
from tfjax.data import datasets
from tfjax.training.loop import experiment, train

# Every way a host turns a jax.Array into a Python or NumPy value.
_READS = ("__int__", "__float__", "__bool__", "__index__", "__array__", "item", "tolist")


def count_host_reads(monkeypatch) -> list:
  """Wraps jax.Array's conversions and jax.device_get; returns the list each read appends to."""
  reads = []
  array_type = type(jnp.zeros(()))
  for name in _READS:
    original = getattr(array_type, name)

    def wrapped(self, *args, _original=original, _name=name, **kwargs):
      reads.append(_name)
      return _original(self, *args, **kwargs)
    monkeypatch.setattr(array_type, name, wrapped)
  device_get = jax.device_get

  def counted_device_get(tree):
    reads.append("device_get")
    return device_get(tree)
  monkeypatch.setattr(jax, "device_get", counted_device_get)
  return reads


def reads_of_run(tmp_path, monkeypatch, name, **train_overrides):
  config = tiny_config(**{"eval_every": 1000, "checkpoint_every": 1000, **train_overrides})
  with monkeypatch.context() as patch:
    reads = count_host_reads(patch)
    train.train_and_evaluate(config, str(tmp_path / name))
  return len(reads)


def test_steps_between_sync_points_read_nothing_back(tmp_path, monkeypatch):
  # Same sync points (2 logs, 1 checkpoint at the end), 4x the steps between them: a read per
  # step would add 18 or more.
  short = reads_of_run(tmp_path, monkeypatch, "short", num_steps=4, log_every=2)
  long = reads_of_run(tmp_path, monkeypatch, "long", num_steps=16, log_every=8)
  assert long == short
  assert short >= 2  # the counter sees the loop's reads: each log's device_get at least


def test_divergence_found_at_a_log_names_the_first_bad_step(tmp_path):
  """The flags stay on the device for 6 steps; the stop still names the first bad step and no
  checkpoint holds a state after it."""
  from tfjax.training.checkpointing import checkpoint  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import divergence  # pylint: disable=import-outside-toplevel
  config = tiny_config(num_steps=12, eval_every=100, log_every=6, checkpoint_every=6)
  config.data.test_lengths = (4,)
  config.optimizer.update(lr=1e30, warmup_steps=20, min_lr=0.0)
  workdir = str(tmp_path / "run")
  with pytest.raises(divergence.Diverged) as info:
    train.train_and_evaluate(config, workdir)
  bad = info.value.step
  # the same run logging and checkpointing every step stops at the same first bad step
  every = tiny_config(num_steps=12, eval_every=100, log_every=1, checkpoint_every=1)
  every.data.test_lengths = (4,)
  every.optimizer.update(lr=1e30, warmup_steps=20, min_lr=0.0)
  with pytest.raises(divergence.Diverged) as reference:
    train.train_and_evaluate(every, str(tmp_path / "every"))
  assert bad == reference.value.step and bad < 12
  assert read_metrics(workdir)[-1] == {"step": bad, "train/diverged": 1}
  saved = checkpoint.Checkpointer(workdir).steps()
  assert all(s < bad for s in saved)


def test_prefetch_places_the_next_batch_ahead_in_data_order():
  config = tiny_config(num_steps=4)
  exp = experiment.prepare(config)
  placement = one_device_placement(config)
  layout = experiment.state_layout(exp, placement)
  iterator = datasets.DataIterator(exp.dataset, config.train.batch_size)
  runner = experiment.make_step_runner(exp, placement, layout, iterator)
  state = layout.init()
  with placement.axis_rules():
    state, _ = runner.run(state, 1)
    runner.prefetch(1)
    # batch 1 is already built and on the devices; the checkpointable position is still 1
    assert iterator.state() == {"index": 2} and runner.data_state() == {"index": 1}
    state, _ = runner.run(state, 1)
    assert iterator.state() == {"index": 2} and runner.data_state() == {"index": 2}
  # the same two steps without prefetching give the same state: the data order is unchanged
  plain_iterator = datasets.DataIterator(exp.dataset, config.train.batch_size)
  plain = experiment.make_step_runner(exp, placement, layout, plain_iterator)
  plain_state = layout.init()
  with placement.axis_rules():
    for _ in range(2):
      plain_state, _ = plain.run(plain_state, 1)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(plain_state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_loop_prefetches_before_it_waits(tmp_path, monkeypatch):
  """Each call's batches are placed right after the call before it is dispatched (not when the
  call itself starts), and every prefetched batch is the one the next call consumes."""
  events = []
  make = experiment.make_step_runner

  def spying_runner(*args):
    runner = make(*args)

    def run(state, n):
      events.append(("run", n))
      return runner.run(state, n)

    def prefetch(n):
      events.append(("prefetch", n))
      runner.prefetch(n)
    return experiment.StepRunner(run, runner.program, runner.abstract_args, prefetch,
                                 runner.data_state)
  monkeypatch.setattr(train, "make_step_runner", spying_runner)
  config = tiny_config(num_steps=7, steps_per_call=3, log_every=3, eval_every=100,
                       checkpoint_every=100)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  # calls of 3, 3, 1 steps: each after the first was prefetched right after the one before
  assert events == [("run", 3), ("prefetch", 3), ("run", 3), ("prefetch", 1), ("run", 1)]
