"""tfjax.aot: target names, HLO accounting on hand-written HLO, and real compiles for TPU (libtpu,
in the test extra) and H100 (the CUDA plugin: `aot_gpu`, skipped without it) from this CPU."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from run_helpers import run_in_cpu_only_process
from tfjax.aot import hlo, targets
from tfjax.nn import ops

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
# Compiling for another platform from a CPU host: the programs must be traced on CPU (a GPU or TPU
# host would pick its own kernels).
ON_CPU = jax.default_backend() == "cpu"
needs_libtpu = pytest.mark.skipif(not (HAS_LIBTPU and ON_CPU),
                                  reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")


@pytest.mark.parametrize("name, platform, devices, topology", [
    ("v4-8", "tpu", 4, "2x2x1"), ("v5p-128", "tpu", 64, "4x4x4"), ("v5p-256", "tpu", 128, "4x4x8"),
    ("v5e-8", "tpu", 8, "2x4"), ("v6e-256", "tpu", 256, "16x16"), ("v5e-1", "tpu", 1, "1x1"),
    ("h100", "cuda", 1, "1x1x1"), ("h100x8", "cuda", 8, "1x1x8"), ("h200x8", "cuda", 8, "1x1x8"),
    ("a100x4", "cuda", 4, "1x1x4")])
def test_target_names_follow_cloud_tpu_and_gpu_nodes(name, platform, devices, topology):
  target = targets.parse_target(name)
  assert (target.platform, target.devices, target.topology) == (platform, devices, topology)
  # The slice shape holds exactly the devices (v4 / v5p count two TensorCores per chip).
  assert math.prod(int(n) for n in topology.split("x")) == devices


@pytest.mark.parametrize("name", ["v5e-3", "v4-7", "v5p-6", "h100x3", "tpu", "b200x8"])
def test_unknown_targets_list_the_valid_names(name):
  with pytest.raises(ValueError, match=r"is not a known target; use one of v4-N"):
    targets.parse_target(name)


def test_every_target_has_sourced_peaks_and_gpu_specs_without_unknown_fields():
  for gen, peak in targets.PEAKS.items():
    assert peak.bf16_flops > 1e14 and peak.hbm_bytes > 8 * targets.GIB and peak.source, gen
  for gen in targets.GPU_SPECS:
    text = targets.Target(gen, "cuda", gen, 1, "1x1x1").gpu_target_config()
    proto = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    assert "gpu_device_info {" in proto and "collective_memory_granularity" not in proto
    size = int(text.split("device_memory_size:")[1].split()[0])
    assert size == targets.PEAKS[gen].hbm_bytes  # the table plans with XLA's own number


# A while loop (trip count 12) holding an async all-gather over 4 of 8 devices and a
# reduce-scatter over the mesh axes 'a' (2) x 'b' (2); an all-reduce and a cuBLAS GEMM outside.
HLO = """HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%body (p: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  %w = bf16[16,32]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %ags = (bf16[16,32]{1,0}, bf16[64,32]{1,0}) all-gather-start(%w), replica_groups=[2,4]<=[8], dimensions={0}
  %agd = bf16[64,32]{1,0} all-gather-done(%ags)
  %rs = f32[8,32]{1,0} reduce-scatter(%agd), replica_groups=mesh['a'=2,'b'=2,'c'=2] {'a','b'}, dimensions={0}, to_apply=%add
  ROOT %t = (s32[], bf16[64,32]{1,0}) tuple(%i, %agd)
}

%cond (p: (s32[], bf16[64,32])) -> pred[] {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[128,256], b: f32[256,512]) -> f32[128,512] {
  %a = f32[128,256]{1,0} parameter(0)
  %b = f32[256,512]{1,0} parameter(1)
  %loop = (s32[], bf16[64,32]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %ar = f32[1000]{0} all-reduce(%g), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %mm = (f32[128,512]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %r = f32[128,512]{1,0} get-tuple-element(%mm), index=0
}
"""


def test_collectives_counted_per_loop_iteration_with_their_groups():
  found = {c.kind: c for c in hlo.collectives(HLO, num_devices=8)}
  assert set(found) == {"all-gather", "reduce-scatter", "all-reduce"}
  assert (found["all-gather"].bytes, found["all-gather"].group, found["all-gather"].count) == (
      64 * 32 * 2, 4, 12)
  # reduce-scatter: the whole operand = result x group (2 x 2 of the mesh axes named).
  assert (found["reduce-scatter"].bytes, found["reduce-scatter"].group) == (8 * 32 * 4 * 4, 4)
  assert found["reduce-scatter"].count == 12
  assert (found["all-reduce"].bytes, found["all-reduce"].group, found["all-reduce"].count) == (
      4000, 8, 1)
  assert hlo.bytes_by_kind(list(found.values())) == {
      "all-gather": 12 * 4096, "reduce-scatter": 12 * 4096, "all-reduce": 4000}
  # Ring wire bytes: (n-1)/n of a gather / scatter, 2(n-1)/n of an all-reduce.
  assert hlo.wire_bytes(list(found.values())) == pytest.approx(
      12 * 4096 * 3 / 4 * 2 + 4000 * 2 * 7 / 8)


# XLA:TPU records no known_trip_count: the loop bound is read from its condition.
HLO_TPU_LOOP = """HloModule m

%cond (p: (s32[], f32[8])) -> pred[] {
  %n = s32[]{:T(128)} constant(5)
  %p = (s32[]{:T(128)}, f32[8]{0}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[]{:T(128)}, f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %ar = f32[8]{0:T(128)} all-reduce(%x), replica_groups=[1,2]<=[2], to_apply=%add
  ROOT %t = (s32[]{:T(128)}, f32[8]{0}) tuple(%i, %ar)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %loop = (s32[]{:T(128)}, f32[8]{0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8]{0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_without_a_recorded_trip_count_uses_its_condition_bound():
  (found,) = hlo.collectives(HLO_TPU_LOOP, num_devices=2)
  assert (found.kind, found.bytes, found.group, found.count) == ("all-reduce", 32, 2, 5)


def test_library_gemm_flops_are_two_mnk():
  assert hlo.library_gemm_flops(HLO) == 2 * 128 * 512 * 256


def _cli(*args, timeout=600):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
             TFJAX_DATA_DIR=os.environ.get("TFJAX_DATA_DIR", "/nonexistent"))
  return subprocess.run([sys.executable, "-m", "tfjax.aot", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_cli_unknown_target_and_indivisible_mesh_are_one_error_line():
  result = _cli("--config=configs/default.py", "--target=v5e-3")
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.strip().splitlines()[-1].startswith("error: --target='v5e-3' is not a known")
  if HAS_LIBTPU:
    result = _cli("--config=configs/default.py", "--target=v5e-4", "--config.mesh.data=3")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "does not divide the 4 available devices" in result.stderr.strip().splitlines()[-1]


def _compile_default(target_name: str, what: str = "train"):
  from tfjax.aot import devices, program, report  # pylint: disable=import-outside-toplevel
  from tfjax.training.config import defaults  # pylint: disable=import-outside-toplevel
  target = targets.parse_target(target_name)
  config = defaults.get_config()
  # float32 compute: the collectives checked below are then the float32 params' bytes (model.dtype
  # 'auto' is bfloat16 on a TPU/GPU target, whose gradients XLA all-reduces in bfloat16)
  config.model.dtype = "float32"
  prog = program.build(config, devices.compile_only_devices(target), what)
  compiled = program.compile_for(prog, target.platform, target.generation)
  measured = report.measure(compiled, target.platform, target.devices)
  return prog, report.build_report(prog, measured, target)


def _param_bytes(prog) -> int:
  params = prog.args[0].params if prog.what == "train" else prog.args[0]
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def _check_data_parallel_report(prog, rep, devices: int):
  m = rep.measured
  assert rep.fits and 0 < m.memory["total"] < rep.target.peak.hbm_bytes
  # The state is donated: every output buffer aliases an argument.
  assert m.memory["arguments"] >= _param_bytes(prog) * 3 / devices  # params + 2 Adam moments
  assert 0.8 < m.flops / rep.analytic_flops < 1.3, (m.flops, rep.analytic_flops)
  # Data parallelism: the gradients cross the mesh once, all-reduced (the layout's minimum).
  by_kind = hlo.bytes_by_kind(m.collectives)
  assert set(by_kind) == {"all-reduce"}, by_kind
  assert _param_bytes(prog) <= by_kind["all-reduce"] < 1.05 * _param_bytes(prog)
  assert rep.minimum == {"all-reduce": _param_bytes(prog)}
  line = json.loads(rep.json_line())
  assert list(line) == ["target", "fits", "bytes_per_device", "hbm_bytes", "flops_per_step",
                        "xla_flops_per_step", "est_step_s", "mfu_bound",
                        "est_step_kernel_sum_s", "kernel_sum_s_by_kind", "roofline_compute_s",
                        "roofline_memory_s", "collectives", "attention_impl",
                        "attention_kernel_calls", "square_buffer", "mfu_kernel_sum", "params",
                        "param_bytes", "param_bytes_per_device"]
  assert line["param_bytes"] == line["param_bytes_per_device"] == _param_bytes(prog)  # replicated
  assert 0 < line["mfu_bound"] < 1 and line["est_step_s"] > 0
  assert line["est_step_s"] >= max(line["roofline_compute_s"], line["roofline_memory_s"])  # + network
  # The kernel-sum model is offered for GPU targets with measured rates only.
  if rep.target.platform == "tpu":
    assert line["est_step_kernel_sum_s"] is None and line["kernel_sum_s_by_kind"] is None
  else:
    assert line["est_step_kernel_sum_s"] == pytest.approx(sum(line["kernel_sum_s_by_kind"].values()))


@needs_libtpu
def test_default_train_step_compiles_for_a_v5e_slice():
  prog, rep = _compile_default("v5e-4")
  _check_data_parallel_report(prog, rep, 4)


@needs_libtpu
def test_pallas_and_auto_lower_the_tpu_kernels():
  """A program traced on this CPU host and compiled for TPU carries the compiled Mosaic kernels
  (forward, dK/dV, dQ), for 'pallas' and for 'auto'."""
  check_kernels_lowered_for("tpu", "v5e-1", "tpu_custom_call")


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_pallas_and_auto_lower_the_triton_kernels_for_h100():
  run_in_cpu_only_process(__file__, "check_kernels_lowered_for", "cuda", "h100", "__gpu$xla.gpu.triton")


def check_kernels_lowered_for(platform, target, kernel_call):
  from tfjax.aot import devices  # pylint: disable=import-outside-toplevel
  mesh = Mesh(np.array(devices.compile_only_devices(targets.parse_target(target))), ("x",))
  arg = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16, sharding=NamedSharding(
      mesh, PartitionSpec()))
  for implementation in ("pallas", "auto"):
    loss = lambda q, impl=implementation: ops.dot_product_attention(  # pylint: disable=cell-var-from-loop
        q, q, q, causal=True, implementation=impl).astype(jnp.float32).sum()
    text = jax.jit(jax.grad(loss)).trace(arg).lower(lowering_platforms=(platform,)).compile(
        ).as_text()
    assert text.count(f'custom_call_target="{kernel_call}"') == 3, implementation


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_default_train_step_compiles_for_h100s():
  run_in_cpu_only_process(__file__, "check_default_compiles_data_parallel", "h100x2", 2)


def check_default_compiles_data_parallel(target: str, devices: int):
  prog, rep = _compile_default(target)
  _check_data_parallel_report(prog, rep, devices)


@pytest.mark.slow
@needs_libtpu
def test_cli_exits_1_with_a_verdict_when_it_does_not_fit():
  result = _cli("--config=configs/default.py", "--target=v5e-1",
                "--config.train.batch_size=1048576")
  assert result.returncode == 1, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  line = json.loads(lines[-1])
  assert line["fits"] is False and line["bytes_per_device"] > line["hbm_bytes"]
  verdict = lines[-2]
  assert verdict.startswith("does not fit:") and "--config." in verdict


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("what", ["eval", "decode"])
def test_eval_and_decode_steps_compile_and_match_the_forward_flops(what):
  prog, rep = _compile_default("v5e-4", what)
  assert rep.fits and 0.8 < rep.measured.flops / rep.analytic_flops < 1.3
  # Nothing to synchronise but the eval sums: no gradient all-reduce.
  assert sum(hlo.bytes_by_kind(rep.measured.collectives).values()) < _param_bytes(prog) / 100


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_cli_shows_the_pallas_kernels_resources_on_h100():
  result = _cli("--config=configs/default.py", "--target=h100",
                "--config.model.attention_impl=pallas", "--config.model.dropout=0.0")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()
          if line.strip().startswith("tfjax_flash_")}
  assert sorted(rows) == ["tfjax_flash_dkdv", "tfjax_flash_dq", "tfjax_flash_forward"]
  for cells in rows.values():
    registers, spills, shared_kib = int(cells[1]), int(cells[2]), float(cells[3])
    assert 0 < registers <= 255 and spills == 0 and 0 < shared_kib <= 227
