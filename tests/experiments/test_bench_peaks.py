"""experiments/bench_peaks.py on the CPU at toy sizes: the JSON it writes, its rates recomputed
from its times (2 M K N FLOPs per GEMM, 8 bytes per copied float32 element), and the extra (batched)
GEMM shapes' parsing and errors."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "experiments", "bench_peaks.py")


def _module():
  spec = importlib.util.spec_from_file_location("bench_peaks_under_test", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_bench_peaks_writes_rates_that_match_its_times(tmp_path):
  out = tmp_path / "peaks"
  run = subprocess.run(
      [sys.executable, SCRIPT, "--gemm=64", "--copy_mib=1", "--iters=2", "--repeats=1",
       "--gemm_shapes=48x16x8,3x8x32x24", f"--out={out}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((out / "bench_peaks.json").read_text())
  assert result["backend"] == "cpu" and result["jax"] and result["date"]
  assert math.isclose(result["gemm_tflops"], 2 * 64 ** 3 / (result["gemm_ms"] / 1e3) / 1e12)
  assert math.isclose(result["gemm_float32_tflops"],
                      2 * 64 ** 3 / (result["gemm_float32_ms"] / 1e3) / 1e12)
  elements = (1 << 20) // 4
  assert math.isclose(result["copy_gb_per_s"], 2 * 4 * elements / (result["copy_ms"] / 1e3) / 1e9)
  # Each extra shape in both dtypes, in the order given.
  assert [(g["batch"], g["m"], g["k"], g["n"], g["dtype"]) for g in result["gemms"]] == [
      (1, 48, 16, 8, "bfloat16"), (1, 48, 16, 8, "float32"),
      (3, 8, 32, 24, "bfloat16"), (3, 8, 32, 24, "float32")]
  for g in result["gemms"]:
    assert g["ms"] > 0
    assert math.isclose(g["tflops"],
                        2 * g["batch"] * g["m"] * g["k"] * g["n"] / (g["ms"] / 1e3) / 1e12)
  markdown = (out / "bench_peaks.md").read_text()
  assert "| 3 | 8 | 32 | 24 | float32 |" in markdown and "| gemm_float32_tflops |" in markdown


def test_gemm_shapes_parse_and_bad_ones_name_the_spelling():
  module = _module()
  assert module.parse_shape("16384x384X1536") == (1, 16384, 384, 1536)
  assert module.parse_shape("384x256x64x256") == (384, 256, 64, 256)
  for bad in ("16384x384", "16384x0x8", "axbxc", "1x2x3x4x5", "2x-3x4"):
    with pytest.raises(ValueError, match="MxKxN or BxMxKxN"):
      module.parse_shape(bad)
