"""tfjax.aot.kernel_model: kernels, FLOPs and bytes read off an optimized GPU HLO module, and the
kernel-sum step time, checked against counts done by hand on a small module."""

import types

import pytest

from tfjax.aot import kernel_model, targets

HLO = """HloModule jit_step, entry_computation_layout={(bf16[64,32]{1,0}, bf16[32,16]{1,0})->f32[64,16]{1,0}}

%gemm_fusion_dot.1_computation (parameter_0: bf16[64,32], parameter_1: bf16[32,16]) -> bf16[64,16] {
  %parameter_0 = bf16[64,32]{1,0} parameter(0)
  %parameter_1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,16]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (param_0: f32[64,16]) -> f32[64,16] {
  %param_0 = f32[64,16]{1,0} parameter(0)
  ROOT %add.1 = f32[64,16]{1,0} add(%param_0, %param_0)
}

%body (p: (s32[], f32[64,16])) -> (s32[], f32[64,16]) {
  %p = (s32[], f32[64,16]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%p), index=0
  %gte.1 = f32[64,16]{1,0} get-tuple-element(%p), index=1
  %loop_add_fusion = f32[64,16]{1,0} fusion(%gte.1), kind=kLoop, calls=%fused_add
  ROOT %t = (s32[], f32[64,16]{1,0}) tuple(%gte.0, %loop_add_fusion)
}

%cond (p.1: (s32[], f32[64,16])) -> pred[] {
  %p.1 = (s32[], f32[64,16]{1,0}) parameter(0)
  ROOT %c.1 = pred[] constant(true)
}

ENTRY %main (a: bf16[64,32], b: bf16[32,16]) -> f32[64,16] {
  %a = bf16[64,32]{1,0} parameter(0)
  %b = bf16[32,16]{1,0} parameter(1)
  %gemm_fusion_dot.1 = bf16[64,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot.1_computation
  %pallas_call.1 = (bf16[2,8,4,16]{3,2,1,0}, f32[2,4,8]{2,1,0}) custom-call(%a), custom_call_target="__gpu$xla.gpu.triton"
  %convert_fusion = f32[64,16]{1,0} fusion(%gemm_fusion_dot.1), kind=kLoop, calls=%fused_add
  %zero = s32[] constant(0)
  %init = (s32[], f32[64,16]{1,0}) tuple(%zero, %convert_fusion)
  %while.1 = (s32[], f32[64,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %out = f32[64,16]{1,0} get-tuple-element(%while.1), index=1
}
"""


def by_name():
  return {k.name: k for k in kernel_model.kernels(HLO)}


def test_kernels_flops_bytes_and_launches_by_hand():
  found = by_name()
  assert set(found) == {"gemm_fusion_dot.1", "pallas_call.1", "convert_fusion", "loop_add_fusion"}
  gemm = found["gemm_fusion_dot.1"]
  assert (gemm.kind, gemm.flops, gemm.launches) == ("matmul", 2 * 64 * 16 * 32, 1)
  assert gemm.bytes == 64 * 16 * 2 + 64 * 32 * 2 + 32 * 16 * 2  # result + both operands
  attention = found["pallas_call.1"]
  assert (attention.kind, attention.flops) == ("attention", 0.0)
  assert attention.bytes == 2 * 8 * 4 * 16 * 2 + 2 * 4 * 8 * 4 + 64 * 32 * 2
  loop = found["loop_add_fusion"]  # inside the while body: once per iteration
  assert (loop.kind, loop.launches, loop.bytes) == ("memory", 5, 2 * 64 * 16 * 4)
  assert found["convert_fusion"].bytes == 64 * 16 * 4 + 64 * 16 * 2


def test_step_time_sums_each_kernels_own_bound():
  peak = targets.Peak(bf16_flops=1e6, hbm_bytes=1, hbm_bytes_per_s=1e6, link_bytes_per_s=1,
                      source="test")
  eff = kernel_model.Efficiency(matmul=0.5, memory=0.25, launch_s=1e-3, source="test")
  result = kernel_model.step_time(kernel_model.kernels(HLO), peak, eff, "bfloat16",
                                  attention_s=0.125)
  found = by_name()
  gemm = found["gemm_fusion_dot.1"]
  expected_matmul = max(gemm.flops / 0.5e6, gemm.bytes / 0.25e6)
  expected_memory = (found["convert_fusion"].bytes + 5 * found["loop_add_fusion"].bytes) / 0.25e6
  assert result["by_kind_s"]["matmul"] == pytest.approx(expected_matmul)
  assert result["by_kind_s"]["memory"] == pytest.approx(expected_memory)
  assert result["by_kind_s"]["attention"] == 0.125
  assert result["launches"] == 1 + 1 + 1 + 5
  assert result["by_kind_s"]["launch gaps"] == pytest.approx(8e-3)
  assert result["step_s"] == pytest.approx(sum(result["by_kind_s"].values()))


def test_attention_rate_is_the_nearest_benchmarked_case():
  assert kernel_model.attention_tflops("h200", True, 1024, 64) == 193
  assert kernel_model.attention_tflops("h200", True, 2000, 64) == 193  # log2 distance 0.97 < 1.03
  assert kernel_model.attention_tflops("h200", True, 2200, 128) == 299
  assert kernel_model.attention_tflops("h200", False, 30000, 128) == 343
  assert kernel_model.attention_tflops("a100", True, 1024, 64) is None


def test_attention_flops_follow_the_benchmark_convention():
  class Cfg:  # a 2-layer decoder, 4 heads of 8
    family, num_layers, dim_per_head, decoder_layers = "decoder", 2, 8, 0
    attention = types.SimpleNamespace(num_heads=4)
  causal, full = kernel_model.attention_flops(Cfg, rows_per_device=3, seq_len=16, what="train")
  assert full == 0.0
  assert causal == 2 * (4 * 3 * 16 ** 2 * 4 * 8) / 2 * 3.5
  Cfg.family = "encoder"
  assert kernel_model.attention_flops(Cfg, 3, 16, "eval") == (0.0, 2 * 4 * 3 * 16 ** 2 * 4 * 8)
