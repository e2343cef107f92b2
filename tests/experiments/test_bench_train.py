"""experiments/bench_train.py end to end: the JSON and markdown it writes, and that its numbers
agree with each other (tokens/s from the step time, MFU from tokens/s, FLOPs/token and the peak)."""

import json
import math
import os
import subprocess
import sys

from tfjax.training.accounting import flops
from tfjax.training.loop import experiment
from tfjax.training.accounting import params as tfparams

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The default config (synthetic reversal, no files) at test size, two steps per jitted call.
OVERRIDES = ["--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
             "--config.train.batch_size=8", "--config.train.eval_batch_size=8",
             "--config.train.steps_per_call=2", "--config.train.num_steps=3",
             "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
             "--config.train.log_every=1",
             # One eval length (the config has four, each an eval program --full_run compiles).
             "--config.data.test_lengths=(8,)"]


def test_bench_train_writes_consistent_json_and_markdown(tmp_path):
  out = tmp_path / "bench"
  peak = 2e9
  env = dict(os.environ, TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run(
      [sys.executable, "experiments/bench_train.py", "--config=configs/default.py", *OVERRIDES,
       "--steps=3", "--warmup=1", f"--peak_flops={peak}", "--full_run", f"--out={out}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((out / "bench_train.json").read_text())

  assert result["config"] == "configs/default.py" and result["backend"] == "cpu"
  assert result["jax"] and result["date"] and "bench_train.py" in result["command"]
  # 3 timed steps at 2 steps per call round up to 2 whole calls.
  assert result["steps_per_call"] == 2 and result["timed_steps"] == 4
  assert result["compile_s"] > 0 and result["step_ms"] > 0
  tokens_per_step = result["batch_size"] * result["seq_len"]
  assert result["batch_size"] == 8
  assert math.isclose(result["tokens_per_s"], tokens_per_step / (result["step_ms"] / 1e3),
                      rel_tol=1e-9)

  # FLOPs/token for the model the config builds (vocabulary from the synthetic task).
  sys.path.insert(0, REPO)
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.model.update(num_layers=1, d_model=32, d_ff=64)
  config.data.update(test_lengths=(8,))
  exp = experiment.prepare(config)
  assert result["seq_len"] == exp.dataset.train_batch(0, 1)["inputs"].shape[-1]
  assert result["params"] == tfparams.analytic_count(exp.model_config)
  assert result["flops_per_token"] == flops.flops_per_token(exp.model_config,
                                                               result["seq_len"])
  assert result["peak_flops_per_device"] == peak
  assert math.isclose(result["mfu"], result["tokens_per_s"] * result["flops_per_token"]
                      / (peak * result["num_devices"]), rel_tol=1e-9)

  # --full_run trained the whole (3-step) config through train_and_evaluate.
  assert result["num_steps"] == 3 and result["full_run_s"] > 0
  assert math.isfinite(result["final_eval_loss"])

  table = (out / "bench_train.md").read_text().splitlines()
  assert table[:2] == ["| metric | value |", "| --- | --- |"]
  assert "| timed_steps | 4 |" in table and any(r.startswith("| step_ms | ") for r in table)


def test_bench_train_without_a_known_peak_leaves_mfu_out(tmp_path):
  """No --peak_flops and a device missing from the table (a CPU): MFU is null, not a guess."""
  out = tmp_path / "bench"
  run = subprocess.run(
      [sys.executable, "experiments/bench_train.py", "--config=configs/default.py", *OVERRIDES,
       "--config.train.steps_per_call=1", "--steps=2", "--warmup=0", f"--out={out}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((out / "bench_train.json").read_text())
  assert result["mfu"] is None and result["peak_flops_per_device"] is None
  assert result["timed_steps"] == 2 and "full_run_s" not in result


def test_bench_ab_pairs_the_two_variants_call_by_call(tmp_path):
  out = tmp_path / "ab"
  env = dict(os.environ, TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run(
      [sys.executable, "experiments/bench_ab.py", "--config=configs/default.py", *OVERRIDES,
       "--b=model.attention_impl=chunked,train.steps_per_call=1", "--rounds=3", f"--out={out}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((out / "bench_ab.json").read_text())
  assert result["rounds"] == 3 and result["jax"] and "bench_ab.py" in result["command"]
  a, b = result["a_step_ms"], result["b_step_ms"]
  assert len(a) == len(b) == 3 and min(a + b) > 0
  ratios = sorted(y / x for x, y in zip(a, b))
  assert math.isclose(result["ratio_b_over_a_median"], ratios[1], rel_tol=1e-12)
  assert result["a_compile_s"] > 0 and result["b_compile_s"] > 0
  assert "| ratio_b_over_a_median |" in (out / "bench_ab.md").read_text()


def test_bench_ab_rejects_an_unknown_override_key(tmp_path):
  run = subprocess.run(
      [sys.executable, "experiments/bench_ab.py", "--config=configs/default.py",
       "--b=model.atention_impl=chunked", f"--out={tmp_path / 'ab'}"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert run.returncode != 0
  assert "unknown override key 'model.atention_impl'" in run.stderr
  assert "did you mean 'model.attention_impl'" in run.stderr
  assert not (tmp_path / "ab").exists()
