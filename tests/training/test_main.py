"""tfjax/training/entry/main.py: the training command line (console script, bad configs)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from run_helpers import read_metrics, run_cli



def test_console_script_trains_the_default_config_into_a_fresh_run_directory(tmp_path):
  """`tfjax-train` with no --config and no --workdir: configs/default.py into runs/default-<time>
  under the current directory (here shrunk by overrides to a few steps)."""
  script = shutil.which("tfjax-train", path=os.path.dirname(sys.executable))
  if script is None:
    pytest.skip("the tfjax-train console script is not installed here (pip install -e .)")
  env = dict(os.environ, TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run(
      [script, "--config.model.num_layers=1", "--config.model.d_model=32",
       "--config.model.d_ff=64", "--config.train.num_steps=2", "--config.train.eval_every=2",
       "--config.train.checkpoint_every=2", "--config.train.batch_size=8",
       "--config.train.eval_batch_size=8", "--config.train.eval_batches=1",
       "--config.data.test_lengths=(8,)"],  # one eval program of the default's four
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  [name] = os.listdir(tmp_path / "runs")
  assert re.fullmatch(r"default-\d{8}-\d{6}", name), name
  workdir = tmp_path / "runs" / name
  assert f"done: {os.path.join('runs', name)} " in run.stdout
  assert json.loads((workdir / "config.json").read_text())["data"]["name"] == "reverse"
  records = read_metrics(workdir)
  assert [m["step"] for m in records if "eval/exact_match@8" in m] == [0, 2]  # the reversal task
  assert [m["step"] for m in records if "train/loss" in m] == [2]
  assert os.listdir(workdir / "checkpoints") == ["2"]


@pytest.mark.parametrize("override,message", [
    ("--config.model.no_such_key=1", "no_such_key"),
    ("--config.model.position=fourier", "model.position='fourier' is invalid"),
    ("--config.model.num_heads=5", "not divisible by model.num_heads=5"),
    ("--config.optimizer.schedule=cos", "schedule"),
    ("--config.train.steps_per_call=0", "train.steps_per_call=0 must be a positive integer"),
    ("--config.train.cpu_fusion=fast", "train.cpu_fusion='fast' is invalid; choose one of"),
])
def test_cli_rejects_bad_config_without_making_a_workdir(tmp_path, override, message):
  workdir = tmp_path / "run"
  result = run_cli([f"--workdir={workdir}", override], cwd=tmp_path)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert not workdir.exists()
