"""tfjax's nanoGPT-shaped decoder + train step against an independent PyTorch implementation.

Runs only where PyTorch is installed (it is not a tfjax dependency; CI skips this file):
experiments/torch_nanogpt.py initializes the model in PyTorch, copies the weights into our params
and trains both on the same batches with the same learning-rate curve. Equal losses at every step
pin down the forward pass, the loss, clipping, AdamW and which weights decay.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.model.num_layers=2", "--config.model.d_model=64", "--config.model.d_ff=256",
         "--config.model.num_heads=2", "--config.model.max_len=32", "--config.data.seq_len=32",
         "--config.train.batch_size=8", "--config.optimizer.warmup_steps=5"]


def lockstep(tmp_path, *overrides):
  rng = np.random.default_rng(0)
  vocabulary = "to be or not that is the question whether tis nobler in mind suffer".split()
  words = rng.choice(vocabulary, 8000)  # letters inside a word are predictable: loss must fall
  text_file = tmp_path / "corpus.txt"
  text_file.write_text(" ".join(words))
  out = tmp_path / "out"
  subprocess.run(
      [sys.executable, os.path.join(ROOT, "experiments", "torch_nanogpt.py"),
       f"--config={os.path.join(ROOT, 'configs', 'shakespeare_char.py')}:cpu",
       "--config.data.name=text", f"--config.data.path={text_file}", *SMALL, *overrides,
       "--mode=lockstep", "--steps=30", f"--out={out}"],
      check=True, capture_output=True, cwd=ROOT)
  return json.loads((out / "torch_nanogpt_lockstep.json").read_text())


def test_train_step_matches_pytorch_step_for_step(tmp_path):
  result = lockstep(tmp_path)
  losses = np.array(result["losses"]["tfjax"])
  assert losses[-1] < losses[0] - 0.5  # it trains
  assert result["max_abs_loss_diff"] < 2e-5, result["max_abs_loss_diff"]
  assert result["final_max_abs_param_diff"] < 2e-5, result["final_max_abs_param_diff"]


@pytest.mark.slow  # 18 s: the negative control of the lockstep test above
def test_lockstep_detects_a_different_decay_mask(tmp_path):
  # Decaying the LayerNorm scales (which nanoGPT never decays) must show up as a mismatch.
  result = lockstep(tmp_path, "--config.optimizer.decay_exclude=biases")
  assert result["final_max_abs_param_diff"] > 1e-4, result["final_max_abs_param_diff"]
