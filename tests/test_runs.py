"""tfjax/training/runs.py: reading a run back (config, step, params) on another device count."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from tfjax.training import train
from run_helpers import REPO, train_losses



def test_run_saved_on_two_cpu_devices_restores_and_resumes_on_one(tmp_path):
  workdir = str(tmp_path / "run")
  overrides = [f"--config.{k}={v}" for k, v in (
      ("data.name", "copy"), ("model.d_model", 32), ("model.num_layers", 1),
      ("model.num_heads", 2), ("model.d_ff", 64), ("train.num_steps", 4),
      ("train.batch_size", 8), ("train.eval_batch_size", 8), ("train.eval_batches", 1),
      ("train.eval_every", 4), ("train.checkpoint_every", 4), ("train.log_every", 1),
      ("mesh.cpu_devices", 2))]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="",
             TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "train.py"),
                        f"--workdir={workdir}", *overrides], check=True, env=env, cwd=REPO,
                       capture_output=True, text=True)
  assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1} over 2 cpu devices" in run.stderr + run.stdout
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["mesh"]["cpu_devices"] == 2
  from tfjax.training import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)  # this process: 1 device
  config, step, params = run.config, run.step, run.params
  assert step == 4 and jax.device_count() == 1
  assert all(np.all(np.isfinite(p)) for p in jax.tree.leaves(params))
  config.train.num_steps = 6
  train.train_and_evaluate(config, workdir)  # resumes the 2-device run on 1 device
  assert sorted(train_losses(workdir)) == list(range(1, 7))
  assert not os.path.exists(os.path.join(workdir, "checkpoints_unreadable"))
