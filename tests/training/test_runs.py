"""tfjax/training/checkpointing/runs.py: reading a run back (config, step, params) on another device
count."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tfjax.training.checkpointing import runs
from tfjax.training.loop import train
from run_helpers import REPO, train_losses



def test_run_saved_on_two_cpu_devices_restores_and_resumes_on_one(tmp_path):
  workdir = str(tmp_path / "run")
  overrides = [f"--config.{k}={v}" for k, v in (
      ("data.name", "copy"), ("data.test_lengths", "(8,)"),  # one eval program, not four
      ("model.d_model", 32), ("model.num_layers", 1), ("model.num_heads", 2), ("model.d_ff", 64), ("train.num_steps", 4),
      ("train.batch_size", 8), ("train.eval_batch_size", 8), ("train.eval_batches", 1),
      ("train.eval_every", 4), ("train.checkpoint_every", 4), ("train.log_every", 1),
      ("mesh.cpu_devices", 2))]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="",
             TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "train.py"),
                        f"--workdir={workdir}", *overrides], check=True, env=env, cwd=REPO,
                       capture_output=True, text=True)
  assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1, 'context': 1} over 2 cpu devices" in run.stderr + run.stdout
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["mesh"]["cpu_devices"] == 2
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)  # this process: 1 device
  config, step, params = run.config, run.step, run.params
  assert step == 4 and jax.device_count() == 1
  assert all(np.all(np.isfinite(p)) for p in jax.tree.leaves(params))
  config.train.num_steps = 6
  train.train_and_evaluate(config, workdir)  # resumes the 2-device run on 1 device
  assert sorted(train_losses(workdir)) == list(range(1, 7))
  assert not os.path.exists(os.path.join(workdir, "checkpoints_unreadable"))


def test_config_changes_lists_each_changed_setting_and_the_history_records_it(tmp_path):
  from run_helpers import tiny_config  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path)
  assert runs.config_changes(workdir, tiny_config()) == []  # a new workdir
  runs.prepare_workdir(workdir, tiny_config(num_steps=2))
  changed = tiny_config(num_steps=5)
  changed.optimizer.lr = 1e-3
  changes = runs.config_changes(workdir, changed)
  assert changes == [("optimizer.lr", 3e-3, 1e-3), ("train.num_steps", 2, 5)]
  runs.record_config_changes(workdir, changes, step=2)
  runs.record_config_changes(workdir, [("train.num_steps", 5, 7)], step=5)
  with open(os.path.join(workdir, runs.HISTORY_FILE)) as f:
    assert [json.loads(line) for line in f] == [
        {"step": 2, "key": "optimizer.lr", "old": 3e-3, "new": 1e-3},
        {"step": 2, "key": "train.num_steps", "old": 2, "new": 5},
        {"step": 5, "key": "train.num_steps", "old": 5, "new": 7}]


@pytest.mark.slow  # two short trainings (~15 s on 2 cores)
def test_a_resume_with_changed_settings_records_them_and_a_model_change_is_refused(
    tmp_path, caplog):
  from run_helpers import tiny_config  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(tiny_config(num_steps=2, checkpoint_every=2, eval_every=2), workdir)
  changed = tiny_config(num_steps=3, checkpoint_every=2, eval_every=2)
  changed.optimizer.lr = 1e-3
  with caplog.at_level("WARNING"):
    train.train_and_evaluate(changed, workdir)
  with open(os.path.join(workdir, runs.HISTORY_FILE)) as f:
    history = [json.loads(line) for line in f]
  assert history == [{"step": 2, "key": "optimizer.lr", "old": 3e-3, "new": 1e-3},
                     {"step": 2, "key": "train.num_steps", "old": 2, "new": 3}]
  assert "optimizer.lr 0.003 -> 0.001" in caplog.text
  assert "train.num_steps 2 -> 3 (the run is extended)" in caplog.text
  with open(os.path.join(workdir, runs.CONFIG_FILE)) as f:
    assert json.load(f)["optimizer"]["lr"] == 1e-3
  other_model = tiny_config(num_steps=4)
  other_model.model.d_ff = 128
  with pytest.raises(ValueError, match="different model"):
    train.train_and_evaluate(other_model, workdir)
  with open(os.path.join(workdir, runs.HISTORY_FILE)) as f:
    assert len(f.readlines()) == 2  # a refused resume records nothing
