"""scripts/gpu_summary.py over a hand-made results folder: each phase's numbers reach the summary
(the recipes' best evaluation is the minimum, every bench_train folder is named with its config),
and missing or broken phases do not hide the others."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench_train(folder, config, step_ms):
  folder.mkdir(parents=True)
  (folder / "bench_train.json").write_text(json.dumps({
      "config": config, "batch_size": 64, "seq_len": 256, "step_ms": step_ms,
      "tokens_per_s": 64 * 256 / step_ms * 1e3, "mfu": None, "compile_s": 12.0}))


def test_summary_reports_every_phase_it_finds(tmp_path):
  _bench_train(tmp_path / "train_vocab", "configs/gpt2_small.py", 35.5)
  _bench_train(tmp_path / "profile_recipe_bfloat16", "configs/shakespeare_char.py", 9.25)
  (tmp_path / "recipe_bf16_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
      {"step": 250, "eval/loss": 2.01}, {"step": 1750, "eval/loss": 1.4711},
      {"step": 2000, "eval/loss": 1.4802}, {"step": 2000, "time/elapsed_s": 91.4}]) + "\n")
  (tmp_path / "peaks").mkdir()
  (tmp_path / "peaks" / "bench_peaks.json").write_text(json.dumps({
      "device": "NVIDIA H100", "gemm_n": 8192, "gemm_tflops": 701.2, "gemm_float32_tflops": 355.0,
      "copy_mib": 2048, "copy_gb_per_s": 3010.0,
      "gemms": [{"batch": 1, "m": 16384, "k": 384, "n": 1536, "dtype": "float32", "ms": 0.08,
                 "tflops": 241.6},
                {"batch": 384, "m": 256, "k": 64, "n": 256, "dtype": "bfloat16", "ms": 0.031,
                 "tflops": 207.8}]}))
  (tmp_path / "tune").mkdir()
  (tmp_path / "tune" / "tuning.json").write_text("{not json")  # a phase cut mid-write
  printed = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_summary.py"),
                            str(tmp_path)], capture_output=True, text=True, check=True).stdout
  assert "train_vocab gpt2_small: 64x256 tokens, step 35.5 ms" in printed
  assert "profile_recipe_bfloat16 shakespeare_char: 64x256 tokens, step 9.2 ms" in printed
  assert ("recipe_bf16 shakespeare_char: last eval step 2000 loss 1.4802; best 1.4711 at step "
          "1750; elapsed 91 s") in printed
  assert "GEMM 8192^3 bf16 701 TFLOP/s, float32 355 TFLOP/s; copy 2048 MiB 3010 GB/s" in printed
  assert "GEMM 16384x384x1536 float32: 242 TFLOP/s (0.080 ms)" in printed
  assert "GEMM 384x256x64x256 bfloat16: 208 TFLOP/s (0.031 ms)" in printed
  assert "tune" not in printed.replace("tuning", "")  # unreadable: skipped, nothing invented
