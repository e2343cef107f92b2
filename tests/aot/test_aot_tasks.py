"""tfjax-aot compiles every registered task's train step through its task plugin
(tfjax/training/tasks/): ViT, CLIP, Whisper and Funnel (MLM and classification) for a deviceless
TPU from this CPU. The parameters it reports are tfjax-params' count times 4 bytes (float32
params), FLOPs are the task's analytic count where it has one (ViT's, checked against XLA's own
count of the compiled program) and "unknown" otherwise, never a guess."""

import importlib.util
import json
import os
import runpy
import subprocess
import sys

import jax
import pytest

from run_helpers import REPO
from tfjax.training.entry import params_main

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
ON_CPU = jax.default_backend() == "cpu"
needs_libtpu = pytest.mark.skipif(not (HAS_LIBTPU and ON_CPU),
                                  reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")
FLOAT32_BYTES = 4

# (config file argument, whether its task has an analytic FLOPs count). Each compile takes
# 10-60 s on a 2-core VM; Funnel MLM's (relative-shift attention, decoder) is the longest.
CONFIGS = [
    ("configs/vit_synthetic.py:test", True),
    ("configs/clip_synthetic.py:test", False),
    ("configs/whisper_synthetic.py:test", False),
    pytest.param("configs/funnel_synthetic.py:test", False, marks=pytest.mark.slow),
    ("configs/funnel_synthetic.py:classify_test", False),
]


def _aot(*args):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
             TFJAX_DATA_DIR=os.environ.get("TFJAX_DATA_DIR", "/nonexistent"))
  return subprocess.run([sys.executable, "-m", "tfjax.aot", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def _config(config_arg: str):
  path, arg = config_arg.split(":")
  return runpy.run_path(os.path.join(REPO, path))["get_config"](arg)


def _params_total(config_arg: str, capsys) -> int:
  """tfjax-params' `total: N` line for the config (its own code path, in this process)."""
  config = _config(config_arg)
  capsys.readouterr()
  params_main._plan_and_print(config, None, None)  # pylint: disable=protected-access
  last = capsys.readouterr().out.strip().splitlines()[-1]
  assert last.startswith("total: "), last
  return int(last.split()[1])


@needs_libtpu
@pytest.mark.parametrize("config_arg, knows_flops", CONFIGS)
def test_every_task_trains_ahead_of_time_with_its_parameters_and_flops(config_arg, knows_flops,
                                                                      capsys):
  result = _aot(f"--config={config_arg}", "--target=v5e-1")
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout.strip().splitlines()
  line = json.loads(out[-1])
  assert line["fits"] and 0 < line["bytes_per_device"] < line["hbm_bytes"]
  # Memory per device is the compiler's; the parameters are what tfjax-params counts.
  total = _params_total(config_arg, capsys)
  assert line["params"] == total
  assert line["param_bytes"] == line["param_bytes_per_device"] == total * FLOAT32_BYTES
  assert any(l.startswith(f"parameters: {total:,} ") for l in out)
  # The train step's inputs hold the parameters and Adam's two moments at least.
  assert line["bytes_per_device"] >= 3 * total * FLOAT32_BYTES
  assert line["xla_flops_per_step"] > 0
  if knows_flops:
    assert 0.8 < line["xla_flops_per_step"] / line["flops_per_step"] < 1.3, line
    assert 0 < line["mfu_bound"] < 1
  else:
    assert line["flops_per_step"] is None and line["mfu_bound"] is None
    assert any(l.split()[:2] == ["analytic", "unknown"] for l in out), result.stdout
    assert "MFU bound unknown" in result.stdout


@needs_libtpu
def test_an_own_model_task_compiles_its_eval_step_and_refuses_decode():
  from tfjax.aot import devices, program, report, targets  # pylint: disable=import-outside-toplevel
  target = targets.parse_target("v5e-1")
  config = _config("configs/vit_synthetic.py:test")
  prog = program.build(config, devices.compile_only_devices(target), "eval")
  compiled = program.compile_for(prog, target.platform, target.generation)
  rep = report.build_report(prog, report.measure(compiled, "tpu", 1), target)
  # A forward pass: a third of the training count, against the compiler's count.
  assert 0.8 < rep.measured.flops / rep.analytic_flops < 1.3
  assert rep.params[1] == 4 * sum(x.size for x in jax.tree.leaves(prog.args[0]))
  result = _aot("--config=configs/vit_synthetic.py:test", "--target=v5e-1", "--what=decode")
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --what=decode compiles a text decoder's KV-cache step; config.task='vit' (model "
      "'vit'): use --what=train or --what=eval")
