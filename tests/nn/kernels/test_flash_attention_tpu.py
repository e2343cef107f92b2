"""The Mosaic TPU flash-attention kernels (tfjax/nn/kernels/flash_attention_tpu.py) against the xla
reference and the NumPy oracle of test_kernels, run on CPU through TPU interpret mode
(pltpu.InterpretParams, which simulates Mosaic's grid, block copies and VMEM scratch), plus their
lowering for the TPU platform from this machine.

Small tiles (32 or 64 query rows, 128 keys: the fewest keys the (8, 128) tiling allows) and lengths
up to ~300 make every case span several query and key blocks, partial ones included.
"""

import functools
import importlib
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import ops
from tfjax.nn.kernels import _blocks, pallas
from tfjax.nn.kernels.flash_attention_tpu import TpuTiling, TpuTilings, flash_attention_tpu

from test_kernels import (assert_close, numpy_attention, random_qkv, tiny_model_losses,
                          value_and_grads)
from test_kernels import draw_case as kernel_case

# The module (its name in tfjax.nn.kernels is the function).
tpu_module = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMALL = TpuTilings(TpuTiling(32, 128), TpuTiling(64, 128))
interpreted = functools.partial(flash_attention_tpu, tilings=SMALL, interpret=True)


def xla(q, k, v, **kw):
  return ops.dot_product_attention(q, k, v, implementation="xla", **kw)


def draw_case(seed):
  """test_kernels' random case, over several 128-key blocks: lengths up to 300, windows up to 200,
  group sizes 1 / 2 / 4, ALiBi half the time with slopes down to 2^-6."""
  return kernel_case(seed, max_len=300, max_window=200, group_sizes=(1, 2, 4), same_length=0.4,
                     alibi=0.5, max_slope_exponent=6)


def check_case(seed):
  shapes, kw, dtype = draw_case(seed)
  q, k, v, d_out = random_qkv(seed, **shapes, dtype=dtype)
  out, grads = value_and_grads(interpreted, q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(xla, q, k, v, d_out, kw)
  # Relative to max |expected|; bf16 rounds inputs, p and dS at 2^-8 relative precision.
  out_tol, grad_tol = (2e-5, 1e-4) if dtype == jnp.float32 else (1.5e-2, 2e-2)
  case = f"{shapes} {sorted(kw)} {jnp.dtype(dtype).name}"
  # A query that sees one key has dq == 0 exactly (its softmax is constant); the kernels get it as
  # p * (dO.V - rowsum(O * dO)), two fp32 sums of O(1) terms in different orders, ~1e-7 apart.
  # Gradients are therefore measured against at least 1e-2 (inputs and dO are O(1)), which keeps
  # the bound relative wherever a gradient is not degenerate.
  grad_floor = 1e-2
  assert_close(out, ref_out, out_tol, f"out vs xla, {case}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, grad_tol, f"d{name} vs xla, {case}", grad_floor)
  np_out, np_grads = numpy_attention(*(x.astype(jnp.float32) for x in (q, k, v)), d_out, **kw)
  assert_close(out, np_out, out_tol, f"out vs numpy, {case}")
  for name, g, ref in zip("qkv", grads, np_grads):
    assert_close(g, ref, grad_tol, f"d{name} vs numpy, {case}", grad_floor)


# Seeds 0-11 cover every (mask kind, segment case) pair. The default run takes two that together
# have causal and window masks, packed / q-padding segment ids, ALiBi, GQA, T != S over several
# key blocks, fp32 and bf16 (test_block_aligned_lengths adds an unpadded bf16 GQA case); the slow
# run takes the rest of 0-29.
DEFAULT_SEEDS = (3, 4)


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_random_sweep_matches_xla_and_numpy(seed):
  check_case(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [s for s in range(30) if s not in DEFAULT_SEEDS])
def test_random_sweep_matches_xla_and_numpy_slow(seed):
  check_case(seed)


@pytest.mark.parametrize("q_len, kv_len, kw, dtype", [
    pytest.param(256, 384, dict(causal=True), jnp.float32, marks=pytest.mark.slow),
    (160, 256, dict(window=150, alibi_slopes=np.array([0.3, 0.1, 0.05, 0.01])), jnp.bfloat16)])
def test_block_aligned_lengths(q_len, kv_len, kw, dtype):
  # Without padding or segment ids the kernels skip the mask on fully visible tiles; the random
  # sweep's odd lengths always pad, so cover the masked / unmasked tile split here.
  q, k, v, d_out = random_qkv(1, batch=1, q_len=q_len, kv_len=kv_len, heads=4, kv_heads=2,
                              head_dim=64, dtype=dtype)
  out, grads = value_and_grads(interpreted, q, k, v, d_out, kw)
  np_out, np_grads = numpy_attention(*(x.astype(jnp.float32) for x in (q, k, v)), d_out, **kw)
  out_tol, grad_tol = (2e-5, 1e-4) if dtype == jnp.float32 else (1.5e-2, 2e-2)
  assert_close(out, np_out, out_tol, "out")
  for name, g, ref in zip("qkv", grads, np_grads):
    assert_close(g, ref, grad_tol, f"d{name}")


def test_hidden_blocks_are_never_computed():
  # One query block at positions 496..511 with a window of 100 sees keys 412..511, all in key
  # block 3. Keys 0..383 (blocks 0-2) are NaN: had any of their tiles been computed, the NaNs would
  # reach the output (0 * NaN = NaN) or dK/dV; skipped, the result equals attention over block 3.
  q, k, v, d_out = random_qkv(2, batch=1, q_len=16, kv_len=512, heads=2, kv_heads=1, head_dim=32)
  poison = jnp.arange(512)[None, :, None, None] < 384
  k_nan, v_nan = (jnp.where(poison, jnp.nan, x) for x in (k, v))
  out, (dq, dk, dv) = value_and_grads(interpreted, q, k_nan, v_nan, d_out, dict(window=100))
  np_out, (np_dq, np_dk, np_dv) = numpy_attention(q, k, v, d_out, window=100)
  assert_close(out, np_out, 2e-5, "out")
  assert_close(dq, np_dq, 1e-4, "dq")
  np.testing.assert_array_equal(dk[:, :384], 0.0)
  np.testing.assert_array_equal(dv[:, :384], 0.0)
  assert_close(dk[:, 384:], np_dk[:, 384:], 1e-4, "dk")
  assert_close(dv[:, 384:], np_dv[:, 384:], 1e-4, "dv")


@pytest.mark.parametrize("causal, window, q_len, kv_len", [
    (True, None, 100, 300), (True, 37, 300, 300), (True, 129, 64, 500), (False, None, 50, 200)])
def test_block_ranges_are_exactly_the_visible_blocks(causal, window, q_len, kv_len):
  """The shared bounds against the mask written out per (query, key) pair: [lo, hi) holds every
  key block with a visible pair and no other, [full_lo, full_hi) only fully visible ones (so
  skipping the mask there is exact), and the clamped fetch index never leaves [lo, hi)."""
  block_q, block_k = 16, 32
  nq, nk = -(-q_len // block_q), -(-kv_len // block_k)
  cfg = _blocks.BlockConfig(scale=1.0, causal=causal or window is not None, window=window,
                            offset=kv_len - q_len, groups=1, has_segments=False, has_alibi=False)
  rel = (np.arange(nq * block_q)[:, None] + kv_len - q_len) - np.arange(nk * block_k)[None, :]
  visible = np.ones_like(rel, bool) if not cfg.causal else rel >= 0
  if window is not None:
    visible &= rel < window
  tiles = visible.reshape(nq, block_q, nk, block_k)
  for i in range(nq):
    lo, hi, full_lo, full_hi = (int(x) for x in _blocks.kv_block_range(cfg, i, block_q, block_k,
                                                                         nk))
    any_visible = tiles[i].any(axis=(0, 2))
    np.testing.assert_array_equal(np.arange(nk)[any_visible], np.arange(lo, hi), f"q block {i}")
    assert tiles[i][:, full_lo:full_hi].all()
    fetched = {int(tpu_module._clamp(j, (lo, hi))) for j in range(nk)}
    assert fetched <= set(range(lo, hi)) or (lo == hi and fetched == {lo})
  for j in range(nk):
    lo, hi, full_lo, full_hi = (int(x) for x in _blocks.q_block_range(cfg, j, block_q, block_k,
                                                                        nq))
    any_visible = tiles[:, :, j].any(axis=(1, 2))
    np.testing.assert_array_equal(np.arange(nq)[any_visible], np.arange(lo, hi), f"kv block {j}")
    assert tiles[full_lo:full_hi, :, j].all()


def test_fully_masked_rows_return_zero_with_zero_grads():
  q, k, v, d_out = random_qkv(0, batch=1, q_len=40, kv_len=24, heads=2, kv_heads=1, head_dim=32)
  q_ids = np.ones((1, 40), np.int32)
  q_ids[:, :3] = 0
  kw = dict(causal=True, q_segment_ids=q_ids, kv_segment_ids=np.ones((1, 24), np.int32),
            alibi_slopes=np.array([0.5, 0.25]))
  out, (dq, dk, dv) = value_and_grads(interpreted, q, k, v, d_out, kw)
  empty_rows = np.r_[0:16]  # positions -16..-1 see no key; rows 0-2 are also padding
  np.testing.assert_array_equal(out[:, empty_rows], 0.0)
  np.testing.assert_array_equal(dq[:, empty_rows], 0.0)
  np_out, np_grads = numpy_attention(q, k, v, d_out, **kw)
  assert_close(out, np_out, 2e-5, "out")
  for g, ref in zip((dq, dk, dv), np_grads):
    assert_close(g, ref, 1e-4, "grad")


def test_alibi_slope_gradient_matches_xla():
  q, k, v, d_out = random_qkv(3, batch=1, q_len=60, kv_len=150, heads=4, kv_heads=2,
                              head_dim=32)
  slopes = jnp.asarray([0.5, 0.25, 0.125, 0.0625])

  def slope_grad(fn):
    loss = lambda s: jnp.sum(fn(q, k, v, causal=True, alibi_slopes=s) * d_out)
    return np.asarray(jax.jit(jax.grad(loss))(slopes))

  assert_close(slope_grad(interpreted), slope_grad(xla), 1e-4, "d alibi_slopes")


def test_auto_resolves_to_the_tpu_kernel_on_a_tpu_backend(monkeypatch):
  calls = []

  def recording_tpu_kernel(q, k, v, **kw):
    calls.append(kw)
    return interpreted(q, k, v, **kw)

  monkeypatch.setattr(pallas, "flash_attention_tpu", recording_tpu_kernel)
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert ops._resolve("auto", 128, 128) == "pallas"
  assert pallas.pallas_kernel_for_backend("gpu") is pallas.flash_attention
  q, k, v, _ = random_qkv(6, batch=1, q_len=40, kv_len=40, heads=2, kv_heads=1, head_dim=32)
  out = ops.dot_product_attention(q, k, v, causal=True, implementation="auto")
  assert len(calls) == 1 and calls[0]["causal"]
  monkeypatch.undo()
  assert_close(np.asarray(out), np.asarray(xla(q, k, v, causal=True)), 2e-5, "auto on tpu")


@pytest.mark.slow  # 36 s on CPU-2: the kernel's outputs and gradients are tested above
def test_small_model_trains_the_same_as_xla(monkeypatch):
  """20 steps of test_kernels' tiny causal LM (ALiBi, GQA) with model.attention_impl='pallas'
  routed to the TPU kernels (interpreted, default tilings) follow the xla run's losses."""
  reference = tiny_model_losses("xla")
  tpu_interpreted = functools.partial(flash_attention_tpu, interpret=True)
  monkeypatch.setattr(pallas, "pallas_kernel_for_backend", lambda backend: tpu_interpreted)
  np.testing.assert_allclose(tiny_model_losses("pallas"), reference, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("head_dim, dtype, generation", [
    (64, jnp.bfloat16, "v5e"), (128, jnp.float32, "v4"), (256, jnp.bfloat16, "v6e")])
def test_lowers_for_tpu(head_dim, dtype, generation):
  """Forward + backward lower to three Mosaic kernels for the TPU platform with the default
  tilings (no TPU needed: Pallas' Mosaic lowering checks the block shapes against the (8, 128)
  tiling and rejects primitives Mosaic cannot lower)."""
  tilings = tpu_module.default_tilings(head_dim, dtype, generation)

  def loss(q, k, v, slopes, q_ids, kv_ids):
    out = flash_attention_tpu(q, k, v, causal=True, window=700, alibi_slopes=slopes,
                              q_segment_ids=q_ids, kv_segment_ids=kv_ids, tilings=tilings,
                              interpret=False)
    return jnp.sum(out.astype(jnp.float32))

  spec = jax.ShapeDtypeStruct
  args = (spec((2, 1500, 8, head_dim), dtype), spec((2, 1500, 2, head_dim), dtype),
          spec((2, 1500, 2, head_dim), dtype), spec((8,), jnp.float32),
          spec((2, 1500), jnp.int32), spec((2, 1500), jnp.int32))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(
      lowering_platforms=("tpu",))
  assert lowered.as_text().count("tpu_custom_call") == 3  # fwd, dK/dV, dQ


def test_tiling_table_fits_vmem_and_the_vreg_tiling():
  for (generation, head_dim_p, itemsize), tilings in tpu_module.TPU_TILINGS.items():
    limit = tpu_module.VMEM_LIMIT_BYTES[generation]
    dtype = jnp.bfloat16 if itemsize == 2 else jnp.float32
    for tiling, kernel in ((tilings.forward, "forward"), (tilings.backward, "dkdv"),
                           (tilings.backward, "dq")):
      tpu_module._check_tiling(tiling, dtype)
      used = tpu_module.vmem_bytes(tiling, head_dim_p, itemsize, kernel)
      assert used <= limit // 2, (generation, head_dim_p, itemsize, kernel, used)
  # Every generation has a row for every supported (head_dim, dtype).
  assert len(tpu_module.TPU_TILINGS) == 4 * 2 * 2


@pytest.mark.parametrize("kind, generation", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5p", "v5p"),
    ("TPU v5", "v5p"), ("TPU v6 lite", "v6e"), ("TPU v6e", "v6e"), ("cpu", "v5e")])
def test_tpu_generation_from_device_kind(kind, generation):
  assert tpu_module.tpu_generation(kind) == generation


@pytest.mark.parametrize("kw, dtype, head_dim, message", [
    (dict(), jnp.float16, 64, "float32 or all bfloat16"),
    (dict(), jnp.float32, 320, "head_dim 320"),
    (dict(tilings=TpuTilings(TpuTiling(16, 64), TpuTiling(16, 128))), jnp.float32, 64,
     "block_k of 128"),
    (dict(tilings=TpuTilings(TpuTiling(8, 128), TpuTiling(16, 128))), jnp.bfloat16, 64,
     "block_q a multiple of 16"),
    (dict(bias=np.zeros((1, 1, 8, 8), np.float32)), jnp.float32, 64,
     "only supported by implementation"),
    (dict(q_positions=np.arange(200)[None]), jnp.float32, 64, "only supported by implementation"),
])
def test_unsupported_inputs_raise(kw, dtype, head_dim, message):
  q, k, v, _ = random_qkv(7, batch=1, q_len=200, kv_len=200, heads=2, kv_heads=1,
                          head_dim=head_dim, dtype=dtype)
  with pytest.raises(ValueError, match=message):
    flash_attention_tpu(q, k, v, interpret=True, **kw)


def test_refuses_gpu_backend(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  q, k, v, _ = random_qkv(7, batch=1, q_len=8, kv_len=8, heads=2, kv_heads=1, head_dim=16)
  with pytest.raises(ValueError, match="Triton kernel"):
    flash_attention_tpu(q, k, v)


def test_benchmark_tpu_peers_lower_for_tpu():
  """experiments/bench_attention.py's TPU implementations (JAX's bundled flash and splash
  attention as peers, and ours) lower forward + backward for the TPU platform, GQA included, so
  the benchmark runs as written the day a TPU is available."""
  bench = _load_bench_attention()
  spec = jax.ShapeDtypeStruct
  for impl in bench.DEFAULT_IMPLS["tpu"]:
    for gqa in (False, True):
      if impl == "xla" or (impl == "flash_tpu_bundled" and gqa):  # no GQA in that peer
        continue
      attention = bench.attention_fn(impl, True, None, gqa)
      if impl == "pallas":  # on this CPU 'pallas' resolves to Triton; ask for the Mosaic kernels
        attention = functools.partial(flash_attention_tpu, causal=True, interpret=False)
      loss = lambda q, k, v, attention=attention: jnp.sum(attention(q, k, v).astype(jnp.float32))
      args = (spec((1, 512, 4, 128), jnp.bfloat16),) + (spec((1, 512, 2 if gqa else 4, 128),
                                                              jnp.bfloat16),) * 2
      lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*args).lower(
          lowering_platforms=("tpu",))
      assert "tpu_custom_call" in lowered.as_text(), (impl, gqa)


def test_benchmarks_doc_table_is_the_tiling_table():
  """docs/benchmarks/kernels.md prints TPU_TILINGS for readers; it must say what the code uses."""
  doc = open(os.path.join(REPO, "docs", "benchmarks", "kernels.md")).read()
  section = doc.split("## TPU (not measured yet)")[1].split("\n## ")[0]
  printed = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 5 or not cells[1].isdigit():
      continue
    to_tile = lambda text: TpuTiling(*(int(n) for n in text.split(" x ")))
    for generation in cells[0].split(", "):
      key = (generation, int(cells[1]), {"bf16": 2, "fp32": 4}[cells[2]])
      printed[key] = TpuTilings(to_tile(cells[3]), to_tile(cells[4]))
  assert printed == tpu_module.TPU_TILINGS


def _load_bench_attention():
  path = os.path.join(REPO, "experiments", "bench_attention.py")
  spec = importlib.util.spec_from_file_location("bench_attention", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module
