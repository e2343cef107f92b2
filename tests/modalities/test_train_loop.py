"""tfjax/modalities/train.py and experiments/train_modality.py on a tiny ViT: the run's files,
reading them back, export of the trained model, the loss going down, and the refusals. (The
three configs' own training runs are the `slow` tests beside each model's parity tests.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_collections
import jax
import numpy as np
import pytest

from tfjax.modalities import tasks, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_vit(**train_overrides):
  config = ml_collections.ConfigDict()
  config.task = "vit"
  config.model = dict(image_size=8, patch_size=4, channels=3, d_model=16, num_layers=1,
                      num_heads=2, d_ff=32, num_classes=2, init_std=0.2)
  config.data = dict(classes=2, noise=0.3)
  config.train = dict(num_steps=25, batch_size=16, learning_rate=1e-2, warmup_steps=2,
                      weight_decay=0.0, seed=0, log_every=5, eval_batches=1,
                      **train_overrides)
  return ml_collections.ConfigDict(config)


def test_train_writes_the_run_and_lowers_the_loss(tmp_path):
  result = train.train(tiny_vit(), str(tmp_path / "run"))
  assert result["final_loss"] < 0.8 * result["first_loss"]
  with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
    lines = [json.loads(line) for line in f]
  assert [l["step"] for l in lines[:-1]] == [1, 5, 10, 15, 20, 25]
  assert lines[-1]["eval/accuracy"] == pytest.approx(result["eval_accuracy"])
  task, params = train.load_run(str(tmp_path / "run"))
  assert task.cfg.d_model == 16 and params["classifier"]["kernel"].shape == (16, 2)
  batch = task.batch(np.random.default_rng(3), 4)
  logits = jax.jit(task.model().apply)({"params": params}, batch["images"])["logits"]
  assert logits.shape == (4, 2) and np.all(np.isfinite(logits))
  with pytest.raises(ValueError, match="already holds a trained model"):
    train.train(tiny_vit(), str(tmp_path / "run"))


def test_tasks_refuse_mismatched_configs():
  config = tiny_vit()
  config.data.classes = 3
  with pytest.raises(ValueError, match="num_classes=2 differs from config.data.classes=3"):
    tasks.build(config)
  config.task = "speech"
  with pytest.raises(ValueError, match="config.task='speech' is not a modality task"):
    tasks.build(config)


def test_cli_names_a_bad_config_file(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "experiments", "train_modality.py"),
       "--config=configs/vit_synthetic.py:gpu", f"--workdir={tmp_path / 'w'}"],
      cwd=REPO, capture_output=True, text=True, check=False,
      env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2, proc.stderr
  assert "takes no argument or 'test'" in proc.stderr
  assert not os.path.exists(tmp_path / "w")
