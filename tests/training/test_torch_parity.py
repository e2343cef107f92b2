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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
      check=True, capture_output=True, cwd=ROOT,
      # One torch thread, as one_torch_thread below does in process: on a shared 2-core machine
      # torch's default thread pool made this tiny model's steps 3x slower (31 s -> 10 s CPU).
      env={**os.environ, "OMP_NUM_THREADS": "1"})
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


# ---- --mode=reference (experiments/torch_nanogpt_reference.py), in process: no subprocess start
sys.path.append(os.path.join(ROOT, "experiments"))  # appended: its script names shadow nothing


@pytest.fixture(autouse=True)
def one_torch_thread():
  """One intra-op thread for in-process torch: tiny tensors, and the suite runs a worker per core
  (two threads each would oversubscribe the CPU and multiply the run time)."""
  import torch  # pylint: disable=import-outside-toplevel
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def tiny_recipe(tmp_path, **train):
  """The GPU recipe config (dropout 0.2 everywhere) shrunk to test size, on a word corpus."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "shakespeare_char", os.path.join(ROOT, "configs", "shakespeare_char.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  text_file = tmp_path / "corpus.txt"
  text_file.write_text(" ".join(np.random.default_rng(0).choice(["to", "be", "or", "not"], 4000)))
  config.data.update(name="text", path=str(text_file), seq_len=16)
  config.model.update(num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)
  config.train.update(batch_size=4, eval_batch_size=64, eval_batches=2, eval_every=3,
                      log_every=100, **train)
  config.optimizer.warmup_steps = 2
  return config, experiment.prepare(config)


def test_reference_loop_reports_the_val_curve_and_its_best(tmp_path):
  from torch_nanogpt_reference import run_reference  # pylint: disable=import-outside-toplevel
  config, exp = tiny_recipe(tmp_path)
  assert exp.model_config.dropout == exp.model_config.attention.dropout == 0.2  # nanoGPT's
  result = run_reference(config, exp, 7, device="auto", use_compile=False, warmup_steps=2)
  assert sorted(result["evals"]) == [0, 3, 6, 7]
  vals = {step: e["val"] for step, e in result["evals"].items()}
  assert result["best_val_step"] == min(vals, key=vals.get)
  assert result["best_val_loss"] == min(vals.values()) < vals[0]
  assert result["compile"] == "off" and result["steps_done"] == 7
  assert not result["stopped_at_max_seconds"]
  assert result["train_s"] + result["eval_s"] == pytest.approx(result["wall_s"], rel=1e-6)
  assert result["tokens_per_s"] == pytest.approx(4 * 16 / result["step_ms"] * 1e3)


def test_reference_max_seconds_stops_early_and_evaluates_there(tmp_path):
  from torch_nanogpt_reference import run_reference  # pylint: disable=import-outside-toplevel
  config, exp = tiny_recipe(tmp_path)
  result = run_reference(config, exp, 7, device="cpu", use_compile=False, max_seconds=1e-9)
  assert result["stopped_at_max_seconds"] and result["steps_done"] == 1
  assert sorted(result["evals"]) == [0, 1]


def test_device_cuda_without_a_gpu_is_a_clear_error():
  import torch  # pylint: disable=import-outside-toplevel
  from torch_nanogpt_reference import resolve_device  # pylint: disable=import-outside-toplevel
  if torch.cuda.is_available():
    pytest.skip("a CUDA GPU is present")
  assert resolve_device("auto") == "cpu"
  with pytest.raises(ValueError, match="--device=cuda but .* no CUDA GPU"):
    resolve_device("cuda")


def test_compile_failure_falls_back_to_eager_and_says_so(monkeypatch, capsys):
  import torch  # pylint: disable=import-outside-toplevel
  from torch_nanogpt_reference import CompileFallback  # pylint: disable=import-outside-toplevel

  def broken(*args, **kwargs):
    raise RuntimeError("no C++ compiler\nsecond line")
  monkeypatch.setattr(torch, "compile", lambda model: broken)
  eager, retried = torch.nn.Linear(2, 2), []
  runner = CompileFallback(eager, use_compile=True)
  out = runner(lambda m: m(torch.ones(2)), on_retry=lambda: retried.append(True))
  assert torch.equal(out, eager(torch.ones(2))) and retried == [True]
  assert runner.status == "failed, eager: RuntimeError: no C++ compiler"
  assert "torch.compile failed (RuntimeError: no C++ compiler); running eager" in (
      capsys.readouterr().out)


def test_dropout_sits_where_nanogpt_puts_it():
  import torch  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  from torch_nanogpt_model import torch_gpt  # pylint: disable=import-outside-toplevel
  base = dict(family="decoder", vocab_size=11, d_model=16, num_layers=1, num_heads=2, d_ff=32,
              max_len=8)
  idx = torch.randint(11, (2, 8))

  def twice(**rates):  # two train-mode losses, then two eval-mode ones
    torch.manual_seed(0)
    model = torch_gpt(ModelConfig.from_flat({**base, **rates}))
    train = [model(idx, idx).item() for _ in range(2)]
    model.eval()
    return train, [model(idx, idx).item() for _ in range(2)]
  for rates in ({"dropout": 0.5}, {"attention_dropout": 0.5}):  # each rate alone is live
    train, evaluation = twice(**rates)
    assert train[0] != train[1] and evaluation[0] == evaluation[1], rates
  train, evaluation = twice()  # rate 0: no random draws, train mode equals eval mode
  assert train == evaluation
