"""tfjax-aot says which attention implementation is in the compiled per-device program: the Pallas
kernel calls it finds (Mosaic TPU, Triton, Mosaic GPU) or cuDNN's, else none (xla or chunked),
and whether a float buffer with two trailing dimensions equal to the sequence length (the
[B, H, L, L] weights) is held (tfjax/aot/report.py `attention`, tfjax/aot/hlo.py
`buffer_shapes`)."""

import importlib.util
import json

import jax
import pytest

from tfjax.aot import hlo

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not (HAS_LIBTPU and jax.default_backend() == "cpu"),
                                  reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")

HLO = """HloModule m

%fused_softmax (p: f32[2,4,8,8]) -> f32[2,4,8,8] {
  %p = f32[2,4,8,8]{3,2,1,0} parameter(0)
  ROOT %e = f32[2,4,8,8]{3,2,1,0} exponential(%p)
}

%body (t: (s32[], bf16[2,8,8])) -> (s32[], bf16[2,8,8]) {
  %t = (s32[], bf16[2,8,8]{2,1,0}) parameter(0)
  %w = bf16[2,8,8]{2,1,0} get-tuple-element(%t), index=1
  ROOT %r = (s32[], bf16[2,8,8]{2,1,0}) tuple(%i, %w)
}

ENTRY %main (a: f32[2,4,8,8], s: f32[3,8,8]) -> f32[2,4,8,8] {
  %a = f32[2,4,8,8]{3,2,1,0} parameter(0)
  %s = f32[3,8,8]{2,1,0} parameter(1)
  %m = pred[2,4,8,8]{3,2,1,0} parameter(2)
  %f = f32[2,4,8,8]{3,2,1,0:T(8,128)} fusion(%a), kind=kLoop, calls=%fused_softmax
  %k = (bf16[2,8,8]{2,1,0}, f32[2,4,8,1]{3,2,1,0}) custom-call(%a), custom_call_target="tpu_custom_call"
  ROOT %o = f32[2,4,8,8]{3,2,1,0} add(%f, %f)
}
"""


def test_buffers_are_the_values_outside_fusion_bodies():
  shapes = hlo.buffer_shapes(HLO)
  assert ("f32", (2, 4, 8, 8)) in shapes and ("f32", (3, 8, 8)) in shapes
  assert ("bf16", (2, 8, 8)) in shapes  # a loop body's values are buffers; tuples split
  assert not any(dtype == "pred" for dtype, _ in shapes)  # float buffers only
  # [..., L, L] float buffers, largest first; a parameter's own shape (stacked [layers, d, d]
  # weights with d = L) is excluded, and so is a 2-D [L, L] one.
  assert hlo.square_buffers(shapes, 8, exclude={(3, 8, 8)}) == [("f32", (2, 4, 8, 8)),
                                                                ("bf16", (2, 8, 8))]
  assert hlo.square_buffers(shapes, 16) == []
  # A value only a fusion body computes is no buffer.
  inside = hlo.buffer_shapes(HLO.replace("%f = f32[2,4,8,8]", "%f = f32[2,4,9,9]")
                             .replace("ROOT %o = f32[2,4,8,8]", "ROOT %o = f32[2,4,9,9]")
                             .replace("%a = f32[2,4,8,8]{3,2,1,0} parameter(0)",
                                      "%a = f32[2,4,9,9]{3,2,1,0} parameter(0)"))
  assert ("f32", (2, 4, 8, 8)) not in inside


def _default_on_v5e4(impl: str):
  from tfjax.aot import devices, program, report  # pylint: disable=import-outside-toplevel
  from tfjax.aot import targets  # pylint: disable=import-outside-toplevel
  from tfjax.training.config import defaults  # pylint: disable=import-outside-toplevel
  target = targets.parse_target("v5e-4")
  config = defaults.get_config()  # configs/default.py: 2 layers, 4 heads, 34 tokens, 64 rows
  config.model.attention_impl = impl
  prog = program.build(config, devices.compile_only_devices(target), "train")
  compiled = program.compile_for(prog, target.platform, target.generation)
  rep = report.build_report(prog, report.measure(compiled, "tpu", 4), target)
  return rep, report.table(rep, prog, "header"), json.loads(rep.json_line())


@needs_libtpu
def test_xla_on_four_chips_holds_the_weights_and_no_kernel():
  rep, text, line = _default_on_v5e4("xla")
  assert rep.attention.implementation == "none" and rep.attention.kernels == {}
  # 64 rows over 4 chips, 4 heads, L = 34: the per-device [B, H, L, L] weights.
  assert line["attention_impl"] == "none"
  assert line["square_buffer"] in ("f32[16,4,34,34]", "bf16[16,4,34,34]")
  assert "no attention kernel call (xla or chunked)" in text
  assert "[16,4,34,34]" in text


@needs_libtpu
def test_pallas_on_four_chips_runs_the_mosaic_kernels_per_device_without_the_weights():
  """Each chip's program calls the Mosaic kernels on its own rows (tfjax/nn/sharded_attention.py:
  a shard_map manual over every mesh axis, as jax requires of a Mosaic kernel, size-1 axes
  included)."""
  rep, text, line = _default_on_v5e4("pallas")
  # 2 layers x (forward, dK/dV, dQ) Mosaic kernels in the one program every chip runs.
  assert rep.attention.kernels == {"mosaic_tpu": 6}
  assert line["attention_impl"] == "pallas" and line["attention_kernel_calls"] == {
      "mosaic_tpu": 6}
  assert line["square_buffer"] is None and rep.attention.square_buffers == []
  assert "Pallas, Mosaic TPU: 6 kernel calls per step" in text
  assert "none (L = 34)" in text


SWITCH = """HloModule s

%branch_0 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %k = f32[4]{0} custom-call(%p), custom_call_target="tpu_custom_call"
}

%branch_1 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %k = f32[4]{0} custom-call(%p), custom_call_target="tpu_custom_call"
}

ENTRY %main (i: s32[], a: f32[4]) -> f32[4] {
  %i = s32[] parameter(0)
  %a = f32[4]{0} parameter(1)
  ROOT %c = f32[4]{0} conditional(%i, %a, %a), branch_computations={%branch_0, %branch_1}
}
"""


def test_a_switch_runs_one_branch_of_kernel_calls():
  """The zigzag chunk calls are a lax.switch over chunks: one branch runs per step."""
  assert hlo.custom_calls(SWITCH) == {"tpu_custom_call": 1}
