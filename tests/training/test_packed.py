"""tfjax/training/loop/packed.py: K seeds in one program train as their K separate runs would
(losses, eval, records, final checkpoints), diverge per seed, and resume exactly."""

import json
import os

import jax
import numpy as np
import pytest

from tfjax.data import datasets
from tfjax.nn.models import build_model
from tfjax.training.loop import divergence, experiment, packed, steps, train
from tfjax.training.parallel import cpu_fusion
from tfjax.training.parallel.sharding import BatchPlacement
from run_helpers import read_metrics, tiny_config, train_losses

STEPS = 16  # past the resume test's stop at step 7, with two evals each


def _decoder(seed, **train_overrides):
  config = tiny_config(num_steps=STEPS, eval_every=8, checkpoint_every=8, **train_overrides)
  config.data.test_lengths = (8,)  # one eval length: packing is what's tested, not the lengths
  config.model.dropout = 0.1  # the dropout stream must follow each seed's rng too
  config.seed = seed
  return config


def _encoder_decoder(seed, **train_overrides):
  config = _decoder(seed, **train_overrides)
  config.task = "seq2seq"
  config.data.update(name="reverse", form="seq2seq")
  config.model.family = "encoder_decoder"
  return config


def _rows(workdir, key):
  return {m["step"]: m[key] for m in read_metrics(workdir) if key in m}


# The encoder-decoder case takes ~40 s on 2 cores: -m slow (the decoder case runs by default).
@pytest.mark.parametrize("make_config", [
    _decoder, pytest.param(_encoder_decoder, marks=pytest.mark.slow)])
def test_packed_seeds_equal_separate_runs(tmp_path, make_config, caplog):
  seeds = (0, 3)
  configs = [make_config(s) for s in seeds]
  configs[1].data.seed = 7  # a different data order too
  separate = [str(tmp_path / f"separate{s}") for s in seeds]
  for config, workdir in zip(configs, separate):
    train.train_and_evaluate(config, workdir)
  group = [str(tmp_path / f"packed{s}") for s in seeds]
  caplog.clear()
  with caplog.at_level("INFO", logger="tfjax"):
    outcomes = packed.train_packed(configs, group, str(tmp_path / "group"))
  # One log line per seed and step, each saying which seed it is (they were two unlabeled
  # `step N ...` lines).
  step_lines = [r.getMessage() for r in caplog.records if " step " in f" {r.getMessage()}"
                and "train/loss=" in r.getMessage()]
  assert step_lines, caplog.text
  assert all(line.startswith(("seed 0: step ", "seed 3: step ")) for line in step_lines), \
      step_lines[:4]
  assert ([line.split(" train/")[0] for line in step_lines[:2]]
          == ["seed 0: step 1", "seed 3: step 1"])
  for k in range(len(seeds)):
    want, got = train_losses(separate[k]), train_losses(group[k])
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                               rtol=2e-5, atol=1e-6)
    want_eval, got_eval = _rows(separate[k], "eval/loss"), _rows(group[k], "eval/loss")
    assert sorted(got_eval) == sorted(want_eval) == [8, 16]
    np.testing.assert_allclose([got_eval[s] for s in (8, 16)],
                               [want_eval[s] for s in (8, 16)], rtol=2e-5)
    assert outcomes[k]["eval/loss"] == pytest.approx(want_eval[STEPS], rel=2e-5)
    # The records a separate run writes: its config.json, and its final checkpoint.
    with open(os.path.join(group[k], "config.json")) as f, \
        open(os.path.join(separate[k], "config.json")) as g:
      assert json.load(f) == json.load(g)
    assert os.listdir(os.path.join(group[k], "checkpoints")) == [str(STEPS)]
  # The seeds really differ (different init, dropout and data): not one run copied K times.
  assert train_losses(group[0])[STEPS] != train_losses(group[1])[STEPS]


def test_a_diverging_seed_is_frozen_and_recorded_while_the_others_finish(tmp_path, monkeypatch):
  configs = [_decoder(0), _decoder(1)]
  separate = str(tmp_path / "separate0")
  train.train_and_evaluate(configs[0], separate)
  stack = packed.stack_seeds

  def blown_up_second_seed(trees):  # huge but finite weights: its first loss overflows to inf
    state = stack(trees)
    params = jax.tree.map(lambda x: x.at[1].multiply(1e30), state.params)
    return state.replace(params=params)
  monkeypatch.setattr(packed, "stack_seeds", blown_up_second_seed)
  group = [str(tmp_path / "packed0"), str(tmp_path / "packed1")]
  outcomes = packed.train_packed(configs, group, str(tmp_path / "group"))
  assert isinstance(outcomes[1], divergence.Diverged) and outcomes[1].step == 1
  assert read_metrics(group[1]) == [{"step": 1, "train/diverged": 1}]
  assert not os.path.exists(os.path.join(group[1], "checkpoints"))
  assert isinstance(outcomes[0], dict)  # the other seed trained on, unaffected
  want, got = train_losses(separate), train_losses(group[0])
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=2e-5, atol=1e-6)
  assert sorted(got) == list(range(1, STEPS + 1))


def test_only_seeds_may_differ_in_a_group(tmp_path):
  with pytest.raises(ValueError, match=r"differ in more than.*train.batch_size"):
    packed.train_packed([_decoder(0), _decoder(1, batch_size=16)], ["a", "b"],
                        str(tmp_path / "refused"))
  assert not os.path.exists(tmp_path / "refused")


def test_packed_group_killed_mid_run_resumes_exactly(tmp_path):
  configs = [_decoder(0), _decoder(1)]
  straight = [str(tmp_path / f"straight{k}") for k in range(2)]
  packed.train_packed(configs, straight, str(tmp_path / "g_straight"))
  resumed = [str(tmp_path / f"resumed{k}") for k in range(2)]
  group = str(tmp_path / "g_resumed")
  stopped = packed.train_packed(configs, resumed, group, stop_after_step=7)
  assert all(isinstance(o, dict) for o in stopped)
  assert sorted(os.listdir(os.path.join(group, "checkpoints"))) == ["7"]
  assert not os.path.exists(os.path.join(resumed[0], "checkpoints"))  # only when finished
  packed.train_packed(configs, resumed, group)
  for k in range(2):
    want, got = train_losses(straight[k]), train_losses(resumed[k])
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(8, STEPS + 1):  # bitwise equal after the restart
      assert got[step] == want[step], (k, step)
  with pytest.raises(ValueError, match="packed group of"):  # another group's checkpoints
    packed.train_packed(configs, [resumed[1], resumed[0]], group)


def test_packed_step_keeps_the_cpu_fusion_boundary():
  """Under vmap a cond on a batched predicate becomes a select of both branches, which XLA fuses
  across; the packed step branches on an unbatched predicate instead, so it has the one-seed
  step's conds (tfjax/training/parallel/cpu_fusion.py), its compiled program keeps them (XLA cannot
  fold the predicate), and it has none with the policy off."""
  config = _decoder(0)
  placement = BatchPlacement.for_config(config)
  counts = {}
  try:
    for policy in ("on", "off"):
      config.train.cpu_fusion = policy
      exp = experiment.prepare(config)
      layout = experiment.state_layout(exp, placement)
      batch = datasets.DataIterator(exp.dataset, config.train.batch_size).next()
      batches = experiment.stack_batches([experiment.stack_batches([batch, batch], 2)], 1)
      state = packed.stack_seeds([layout.init(), layout.init()])
      args = (state, np.ones(2, bool), batches, np.int32(1))
      step = packed.make_packed_step(exp, stop_on_nonfinite=True)
      counts[policy] = str(jax.make_jaxpr(step)(*args)).count("cond[")
      model = build_model(exp.model_config.replace(deterministic=False))
      one = steps.make_train_step(model, exp.optimizer, exp.schedule, config.task, 0.0, 1)
      counts[policy, "one seed"] = str(jax.make_jaxpr(one)(layout.init(), batch)).count("cond[")
      if policy == "on":
        counts["compiled"] = step.lower(*args).compile().as_text().count(" conditional(")
  finally:
    cpu_fusion.install("auto")
  # (a jaxpr holds each cond twice: in the JVP and in its transpose)
  assert counts["on"] == counts["on", "one seed"] == 2 * counts["compiled"] >= 4, counts
  assert counts["off"] == counts["off", "one seed"] == 0, counts
