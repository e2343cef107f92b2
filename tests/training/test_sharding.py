"""Mesh, sharding rules, 8-device training equivalence, cross-mesh restore, memory planning.

The 8-device checks run in ONE subprocess (tests/scaleout_helper.py with
XLA_FLAGS=--xla_force_host_platform_device_count=8) so this process keeps its single device.
"""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tfjax.training.accounting import params as param_accounting
from tfjax.training.parallel import sharding
from tfjax.nn.config import ModelConfig

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)

import scaleout_config  # pylint: disable=wrong-import-position
from scaleout_helper import FAST_COMPILE, MESHES  # pylint: disable=wrong-import-position


RULES = sharding.DEFAULT_RULES


def spec(axes, shape, mesh):
  return sharding.partition_spec(shape, axes, RULES, sharding.axis_sizes(mesh))


# ---- Rules and mesh (no devices needed) ---------------------------------------------------------
def test_default_rules_give_fsdp_and_megatron_layouts():
  mesh = (2, 2, 2)
  # Weights: embed over fsdp (ZeRO-3), heads / mlp / vocab over tensor (Megatron).
  assert spec(("embed", "heads", "head_dim"), (32, 4, 8), mesh) == P("fsdp", "tensor", None)
  assert spec(("heads", "head_dim", "embed"), (4, 8, 32), mesh) == P("tensor", None, "fsdp")
  assert spec(("embed", "mlp"), (32, 64), mesh) == P("fsdp", "tensor")
  assert spec(("mlp", "embed"), (64, 32), mesh) == P("tensor", "fsdp")
  assert spec(("vocab", "embed"), (16, 32), mesh) == P("tensor", "fsdp")
  assert spec(("layers", "embed", "mlp"), (2, 32, 64), mesh) == P(None, "fsdp", "tensor")
  # Activations: batch takes data x fsdp first, so embed is not split over fsdp again.
  assert spec(("batch", "length", "embed"), (8, 4, 32), mesh) == P(("data", "fsdp"), None, None)
  assert spec(("batch", "length", "heads", "head_dim"), (8, 4, 4, 8), mesh) == P(
      ("data", "fsdp"), None, "tensor", None)
  assert spec(("batch", "length", "mlp"), (8, 4, 64), mesh) == P(("data", "fsdp"), None, "tensor")


def test_indivisible_dimensions_are_replicated_and_size_one_axes_dropped():
  # MQA: one KV head cannot split over tensor=4.
  assert spec(("embed", "kv_heads", "head_dim"), (32, 1, 8), (1, 2, 4)) == P("fsdp", None, None)
  assert spec(("vocab", "embed"), (10, 32), (1, 1, 4)) == P(None, None)
  assert spec(("embed", "mlp"), (32, 64), (8, 1, 1)) == P(None, None)


def test_mesh_shape_fills_and_validates():
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2, 1)
  assert sharding.mesh_shape({"data": 1, "fsdp": -1, "tensor": 1}, 8) == (1, 8, 1, 1)
  # The context axis (sequence parallelism); a config written before it existed means 1.
  assert sharding.mesh_shape({"data": -1, "fsdp": 1, "tensor": 1, "context": 4}, 8) == (
      2, 1, 1, 4)
  assert sharding.mesh_shape({"data": 1, "fsdp": 1, "tensor": 1, "context": -1}, 8) == (
      1, 1, 1, 8)
  with pytest.raises(ValueError, match="at most one axis"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="does not divide"):
    sharding.mesh_shape({"data": 3, "fsdp": 1, "tensor": 1}, 8)
  assert sharding.batch_shards((2, 2, 2), RULES) == 4
  assert sharding.batch_shards((1, 1, 8), RULES) == 1
  assert sharding.batch_shards((2, 1, 1, 4), RULES) == 2  # context splits the length, not rows


def test_the_context_axis_splits_every_activations_length():
  mesh = (1, 2, 2, 2)
  assert spec(("batch", "length", "embed"), (8, 16, 32), mesh) == P("fsdp", "context", None)
  assert spec(("batch", "length", "heads", "head_dim"), (8, 16, 4, 8), mesh) == P(
      "fsdp", "context", "tensor", None)
  assert spec(("embed", "heads", "head_dim"), (32, 4, 8), mesh) == P("fsdp", "tensor", None)


def test_batch_that_does_not_split_over_the_mesh_is_a_clear_error(monkeypatch):
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  config = scaleout_config.get_config()
  config.train.batch_size = 12
  config.mesh.update(data=8, fsdp=1, tensor=1)
  monkeypatch.setattr("jax.device_count", lambda: 8)
  with pytest.raises(ValueError, match="12 rows do not split over the 8 batch shards"):
    experiment.prepare(config)


# ---- 8 devices, in one subprocess -------------------------------------------------------------
def test_eight_devices_train_like_one_shard_by_the_rules_and_resume_across_meshes(tmp_path):
  """One test (one subprocess, whatever pytest-xdist does): every check on its report."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "  # the suite's (tests/conftest.py)
                       f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
  result = subprocess.run([sys.executable, os.path.join(TESTS, "scaleout_helper.py"),
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
  assert result.returncode == 0, result.stderr[-5000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  check_every_mesh_trains_like_one_device(report)
  check_data_parallel_cpu_sums_gradients_in_one_flat_all_reduce(report)
  check_fsdp8_gives_every_device_an_eighth_of_every_weight_and_moment(report)
  check_tensor_parallel_splits_heads_and_mlp(report)
  check_checkpoint_from_one_mesh_resumes_on_another(report)


def check_every_mesh_trains_like_one_device(eight_devices):
  expected = eight_devices["losses"]["1"]
  assert len(expected) == 5 and expected[-1] < expected[0]
  for name in [",".join(map(str, mesh)) for mesh in MESHES] + ["2,2,2/accum2"]:
    np.testing.assert_allclose(eight_devices["losses"][name], expected, rtol=2e-5, err_msg=name)


def check_data_parallel_cpu_sums_gradients_in_one_flat_all_reduce(eight_devices):
  """cpu_fusion.summed_over_shards on the pure data mesh: the gradients and loss sums of every
  parameter travel in one f32 vector; meshes that shard parameters keep GSPMD's per-tensor
  reductions."""
  data_only = eight_devices["all_reduces"]["8,1,1"]
  assert len(data_only) == 1, data_only
  [shape] = data_only
  count = sum(int(np.prod(p)) for p, _ in _param_shapes(eight_devices, "8,1,1")) + 3  # + sums
  assert shape == f"f32[{count}]{{0}}", (shape, count)
  assert len(eight_devices["all_reduces"]["2,2,2"]) > 1


def _param_shapes(report, mesh):
  return [v for k, v in report["shards"][mesh].items() if k.startswith("params/")]


def _shards(report, mesh):
  return {k: (tuple(g), [tuple(s) for s in shards])
          for k, (g, shards) in report["shards"][mesh].items()}


def check_fsdp8_gives_every_device_an_eighth_of_every_weight_and_moment(eight_devices):
  shards = _shards(eight_devices, "1,8,1")
  weights = [k for k in shards if k.startswith("params/")]
  moments = [k for k in shards if "/mu/" in k or "/nu/" in k]
  assert len(weights) == 2 * 9 + 3 and len(moments) == 2 * len(weights)  # 9 per layer
  for name in weights + moments:
    full, per_device = shards[name]
    assert len(per_device) == 8
    for shard in per_device:
      assert math.prod(shard) * 8 == math.prod(full), (name, full, shard)


def check_tensor_parallel_splits_heads_and_mlp(eight_devices):
  for mesh, t, f in (("2,2,2", 2, 2), ("1,2,4", 4, 2)):
    shards = _shards(eight_devices, mesh)
    layer = "decoder/layers_0/"
    expect = {
        layer + "self_attention/query/kernel": (32 // f, 4 // t, 8),
        layer + "self_attention/key/kernel": (32 // f, 4 // t, 8),
        layer + "self_attention/out/kernel": (4 // t, 8, 32 // f),
        layer + "ffn/wi/kernel": (32 // f, 64 // t),
        layer + "ffn/wi_gate/kernel": (32 // f, 64 // t),
        layer + "ffn/wo/kernel": (64 // t, 32 // f),
        "embed/tokens/embedding": (16 // t, 32 // f),
        "lm_head/kernel": (32 // f, 16 // t),
    }
    for name, shape in expect.items():
      for prefix in ("params/", "opt_state/1/mu/", "opt_state/1/nu/"):
        assert set(shards[prefix + name][1]) == {shape}, (mesh, name)
  # Pure data parallelism: everything whole on every device.
  for name, (full, per_device) in _shards(eight_devices, "8,1,1").items():
    assert set(per_device) == {full}, name


def check_checkpoint_from_one_mesh_resumes_on_another(eight_devices):
  assert eight_devices["saved_steps"] == ["3"]  # written on (8, 1, 1)
  resumed = eight_devices["resumed"]  # steps 1-3 on (8, 1, 1), 4-5 restored onto (2, 2, 2)
  assert sorted(resumed, key=int) == ["1", "2", "3", "4", "5"]
  np.testing.assert_allclose([resumed[str(s)] for s in range(1, 6)],
                             eight_devices["losses"]["1"], rtol=2e-5)
  # A state replicated over all 8 devices is written from one replica (checkpoint._one_replica)
  # and comes back bitwise, on every device, with the shardings asked for.
  assert eight_devices["replicated_checkpoint"] == {
      "step": 1, "data": {"position": 7}, "equal": True, "target_shardings": True,
      "devices": [8]}


# ---- Memory planning ---------------------------------------------------------------------------
def _hand_activations(cfg, rows, seq, tensor):
  """The documented formula (tfjax/training/accounting/params.py) for a decoder, remat none, xla
  attention."""
  d, h, kv, dh, f, v = cfg.d_model, cfg.attention.num_heads, cfg.attention.kv_heads, \
      cfg.dim_per_head, cfg.feed_forward.d_ff, cfg.vocab_size
  tokens = rows * seq
  layer = (4 * d + (2 * h * dh + 2 * kv * dh + 3 * f) / tensor) * tokens * 4
  layer += h / tensor * seq * seq * rows * 4
  return cfg.num_layers * layer + 2 * v / tensor * tokens * 4


def test_params_cli_prints_per_device_memory_and_ends_with_total():
  result = subprocess.run(
      [sys.executable, "-m", "tfjax.params", f"--config={TESTS}/scaleout_config.py",
       "--mesh=1,4,1", "--seq_len=16"],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  total = int(re.fullmatch(r"total: (\d+)", lines[-1]).group(1))
  cfg = ModelConfig.from_config(scaleout_config.get_config().model)
  assert total == param_accounting.analytic_count(cfg)
  got = {m.group(1): int(m.group(2).replace(",", "")) for m in (
      re.match(r"\s+([a-z ]+):\s+([\d,]+) bytes", line) for line in lines) if m}
  assert got["params"] == total * 4 // 4  # float32, split 4 ways by fsdp
  assert got["gradients"] == got["params"]
  assert 2 * got["params"] <= got["optimizer state"] <= 2 * got["params"] + 64  # Adam mu, nu
  assert got["activations"] == _hand_activations(cfg, rows=8 // 4, seq=16, tensor=1)
  assert got["sum"] == sum(got[k] for k in ("params", "gradients", "optimizer state",
                                            "activations"))
  assert "mesh data=1 fsdp=4 tensor=1" in result.stdout


# ---- config.mesh.cpu_devices: one XLA:CPU device per core ------------------------------------
def _cpu_devices_config(cpu_devices, batch=12, eval_batch=12, accum=1):
  import ml_collections  # pylint: disable=import-outside-toplevel
  return ml_collections.ConfigDict({
      "mesh": {"data": -1, "fsdp": 1, "tensor": 1, "cpu_devices": cpu_devices},
      "train": {"batch_size": batch, "eval_batch_size": eval_batch},
      "optimizer": {"grad_accum_steps": accum}})


@pytest.mark.parametrize("cores,batch,eval_batch,accum,expected", [
    (2, 12, 12, 1, 2), (8, 12, 12, 1, 6), (4, 12, 12, 1, 4), (4, 12, 8, 1, 4),
    (2, 12, 12, 4, 1),  # micro-batches of 3 rows do not split in two
    (16, 64, 64, 1, 16), (3, 10, 10, 1, 2)])
def test_cpu_device_count_is_the_most_cores_that_divide_the_batches(cores, batch, eval_batch,
                                                                    accum, expected):
  config = _cpu_devices_config(-1, batch, eval_batch, accum)
  assert sharding.cpu_device_count(config, cores=cores) == expected
  assert sharding.cpu_device_count(_cpu_devices_config(3), cores=cores) == 3
  assert sharding.cpu_device_count(_cpu_devices_config(0), cores=cores) == 0


def test_cpu_devices_rejects_a_bad_value():
  with pytest.raises(ValueError, match="cpu_devices=-2"):
    sharding.cpu_device_count(_cpu_devices_config(-2))


@pytest.mark.parametrize("preset", ["", "--xla_force_host_platform_device_count=3"])
def test_configure_cpu_devices_splits_the_host_before_jax_starts(preset):
  # A fresh process: the flag only works before JAX opens its CPU backend. A user's own
  # device-count flag wins over the config.
  code = ("import sys; sys.path[:0] = ['tests', 'tests/training']; from test_sharding import _cpu_devices_config;"
          "from tfjax.training.parallel import sharding;"
          "sharding.configure_cpu_devices(_cpu_devices_config(2));"
          "import jax; print(jax.device_count())")
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=preset)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert out.stdout.split()[-1] == ("3" if preset else "2")
