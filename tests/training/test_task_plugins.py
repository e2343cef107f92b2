"""Every task with a model of its own (tfjax/training/tasks/: vit, clip, whisper, funnel,
funnel_classification) through the main loop, as the text tasks are: the loss falls on its
learnable synthetic data, a run stopped and resumed writes the rows of an uninterrupted one bit
for bit, a 2-device mesh gives the 1-device losses, every parameter has logical axes, tfjax-params
counts what the run trained, and packed seeds equal separate runs. The runs are
tests/task_plugins_helper.py in two child processes (1 and 2 CPU devices) started at once."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from tfjax.training import tasks
from tfjax.training.checkpointing import runs
from tfjax.training.loop import experiment
from tfjax.training.tasks import own_model
from run_helpers import read_metrics, train_losses
import task_plugins_helper as helper

REPO = helper.REPO
TIMING = ("train/tokens_per_sec", "train/mfu")


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
  root = tmp_path_factory.mktemp("task_plugins")
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.path.join(REPO, "tests"),
         "JAX_PLATFORMS": "cpu"}
  children = {}
  for mesh, flags in (("one", ""), ("two", "--xla_force_host_platform_device_count=2")):
    children[mesh] = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "task_plugins_helper.py"), str(root), mesh],
        env={**env, "XLA_FLAGS": flags}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
  for mesh, child in children.items():
    out, err = child.communicate(timeout=900)
    assert child.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"devices": 1 if mesh == "one" else 2}
  return root


def rows_without_timing(workdir):
  return [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(workdir)]


@pytest.mark.parametrize("task", helper.TASKS)
def test_task_trains_resumes_and_splits_over_devices(runs_root, task):
  full = os.path.join(runs_root, "one", task, "full")
  evals = {row["step"]: row["eval/loss"] for row in read_metrics(full) if "eval/loss" in row}
  assert sorted(evals) == [0, helper.STEPS]
  assert evals[helper.STEPS] < 0.9 * evals[0], evals  # learns its synthetic data
  # Stopped after step STOP (a checkpoint at step STOP) and resumed: the same rows, bit for bit.
  assert rows_without_timing(os.path.join(runs_root, "one", task, "resumed")) == \
      rows_without_timing(full)
  one, two = train_losses(full), train_losses(os.path.join(runs_root, "two", task, "full"))
  assert sorted(one) == sorted(two) == list(range(1, helper.STEPS + 1))
  np.testing.assert_allclose([two[s] for s in one], [one[s] for s in one], rtol=1e-4)
  # tfjax-params' total is the size of the parameter tree the run checkpointed.
  restored = runs.restore_run(full)
  assert restored.step == helper.STEPS
  with open(os.path.join(runs_root, "one", task, "params.txt"), encoding="utf-8") as f:
    total = f.read().strip().splitlines()[-1]
  assert total == f"total: {sum(np.size(x) for x in jax.tree.leaves(restored.params))}"


@pytest.mark.parametrize("task", helper.TASKS)
def test_every_parameter_has_logical_axes(task):
  exp = experiment.prepare(helper.tiny(task))
  boxed = own_model.boxed_param_shapes(exp.task, exp.config, exp.model_config, exp.dataset)
  leaves = jax.tree_util.tree_flatten_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  unnamed = [jax.tree_util.keystr(path) for path, leaf in leaves
             if not isinstance(leaf, nn.Partitioned) or len(leaf.names) != len(leaf.value.shape)]
  assert leaves and not unnamed


def test_tasks_are_registered_plugins():
  assert set(helper.TASKS) | {"lm", "mlm", "seq2seq", "classification"} <= set(tasks.TASKS)
  with pytest.raises(ValueError, match=r"config\.task='speech' is invalid; choose one of"):
    tasks.get_task("speech")
  config = helper.tiny("vit")
  config.data.classes = 3
  with pytest.raises(ValueError, match="num_classes=4 differs from config.data.classes=3"):
    experiment.prepare(config)
  config = helper.tiny("clip")
  config.optimizer.grad_accum_steps = 2
  with pytest.raises(ValueError, match="negatives from the whole batch"):
    experiment.prepare(config)
  config = helper.tiny("vit")
  config.mesh.context = 2
  with pytest.raises(ValueError, match="no context-parallel form"):
    experiment.prepare(config, num_devices=2)


SWEEP = '''
import importlib.util
spec = importlib.util.spec_from_file_location("h", {helper!r})
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)

def get_config(scale=None):
  config = helper.tiny("vit")
  config.train.update(num_steps=4, checkpoint_every=4, eval_every=4)
  return config

def get_sweep(scale=None):
  return [{{"seed": 0}}, {{"seed": 1}}]
'''


def test_packed_seeds_of_a_modality_task_equal_separate_runs(tmp_path):
  from tfjax.research import sweep, sweep_packed  # pylint: disable=import-outside-toplevel
  path = tmp_path / "vit_sweep.py"
  path.write_text(SWEEP.format(helper=os.path.join(REPO, "tests", "task_plugins_helper.py")))
  loaded = sweep.load_sweep(str(path))
  separate, packed_root = str(tmp_path / "separate"), str(tmp_path / "packed")
  assert sweep_packed.run_packed(loaded, packed_root, loaded.points, 2) == {
      "seed=0": "done", "seed=1": "done"}
  sweep.run_sweep(loaded, separate)
  for point in loaded.points:
    want = train_losses(os.path.join(separate, point.name))
    got = train_losses(os.path.join(packed_root, point.name))
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=2e-5)
