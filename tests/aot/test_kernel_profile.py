"""tfjax.aot.kernel_profile: device time per kernel from a jax.profiler trace (run here on CPU,
whose trace carries the same hlo_op / hlo_module stats as a GPU's)."""

import jax
import jax.numpy as jnp
import pytest

from tfjax.aot import kernel_profile


@pytest.mark.parametrize("hlo_op, kernel, expected", [
    ("custom-call.3", "tfjax_flash_forward", "attention"),
    ("gemm_fusion_dot.12", "gemm_fusion_dot_12", "matmul"),
    ("custom-call.7", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("loop_transpose_fusion", "loop_transpose_fusion", "copy/transpose"),
    ("input_reduce_fusion.2", "input_reduce_fusion_2", "reduction"),
    ("all-reduce.1", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "collective"),
    ("", "Memcpy HtoD (Pinned to Device)", "memcpy"),
    ("loop_multiply_fusion", "loop_multiply_fusion", kernel_profile.OTHER),
])
def test_category_of_known_kernel_names(hlo_op, kernel, expected):
  assert kernel_profile.category(hlo_op, kernel) == expected


def test_trace_of_a_matmul_program(tmp_path):
  f = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2.0)
  a = jnp.ones((256, 256), jnp.float32)
  f(a, a).block_until_ready()
  with jax.profiler.trace(str(tmp_path)):
    for _ in range(3):
      f(a, a).block_until_ready()
  xspace = kernel_profile.load_xspace(str(tmp_path))
  rows = kernel_profile.kernel_rows(xspace)
  hlo = f.lower(a, a).compile().as_text()
  assert rows and all(r.hlo_op and r.hlo_op in hlo for r in rows), [r.hlo_op for r in rows]
  assert all(r.count == rows[0].count for r in rows)  # every op of the program, once a call
  busy, span = kernel_profile.busy_span_ns(xspace)
  assert 0 < busy <= span
  summary = kernel_profile.summarize(rows, steps=3, busy_ns=busy, span_ns=span)
  assert summary["kernel_s_per_step"] == pytest.approx(sum(summary["by_category_s"].values()))
  assert summary["kernel_s_per_step"] == pytest.approx(sum(r.total_ns for r in rows) / 3e9)
  assert sum(summary["by_category_share"].values()) == pytest.approx(1.0)


def test_missing_trace_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="xplane"):
    kernel_profile.load_xspace(str(tmp_path))
