"""Blockwise attention kernels (chunked, pallas) against the xla reference and a NumPy oracle.

Pallas runs through its CPU interpreter here, with small tiles so that short sequences still span
several blocks (and several partial ones). GPU-only checks skip elsewhere.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from tfjax.nn import ops
from tfjax.nn.kernels import chunked_attention, flash_attention
from tfjax.nn.kernels.flash_attention import KernelTiling, Tilings

# fp32 products at full precision: on a GPU both XLA and the Triton kernels default to TF32
# (~1e-3 off the float64 NumPy oracle); the kernels follow the same setting (_common.matmul_precision).
pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMALL_TILINGS = Tilings(KernelTiling(16, 32), KernelTiling(32, 16))
IMPLS = {
    "chunked": lambda q, k, v, **kw: chunked_attention(q, k, v, block_q=16, block_k=24, **kw),
    "pallas": lambda q, k, v, **kw: flash_attention(q, k, v, tilings=SMALL_TILINGS, **kw),
}


def numpy_attention(q, k, v, d_out, *, causal=False, window=None, q_segment_ids=None,
                    kv_segment_ids=None, alibi_slopes=None, q_positions=None, kv_positions=None):
  """float64 output and (dq, dk, dv) for loss = sum(out * d_out), written from the definitions."""
  q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
  batch, q_len, heads, head_dim = q.shape
  kv_len, groups = k.shape[1], heads // k.shape[2]
  k_h, v_h = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)  # head h -> kv h // G
  q_pos = np.arange(q_len) + kv_len - q_len if q_positions is None else np.asarray(q_positions)
  kv_pos = np.arange(kv_len) if kv_positions is None else np.asarray(kv_positions)
  rel = np.broadcast_to(q_pos[..., :, None] - kv_pos[..., None, :], (batch, q_len, kv_len))
  visible = np.ones((batch, q_len, kv_len), bool)
  if causal or window is not None:
    visible &= rel >= 0
  if window is not None:
    visible &= rel < window
  q_ids = None if q_segment_ids is None else np.asarray(q_segment_ids)[:, :, None]
  kv_ids = None if kv_segment_ids is None else np.asarray(kv_segment_ids)[:, None, :]
  if q_ids is not None and kv_ids is not None:
    visible &= (q_ids == kv_ids) & (kv_ids != 0)
  elif kv_ids is not None:
    visible &= kv_ids != 0
  elif q_ids is not None:
    visible &= q_ids != 0
  visible = visible[:, None]  # [B, 1, T, S]
  logits = np.einsum("bthd,bshd->bhts", q, k_h) / np.sqrt(head_dim)
  if alibi_slopes is not None:
    slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64), (batch, heads))
    logits = logits - slopes[:, :, None, None] * np.abs(rel)[:, None]
  logits = np.where(visible, logits, -np.inf)
  row_max = logits.max(-1, keepdims=True)
  e = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))
  total = e.sum(-1, keepdims=True)
  p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)  # empty rows -> 0
  out = np.einsum("bhts,bshd->bthd", p, v_h)
  dp = np.einsum("bthd,bshd->bhts", d_out, v_h)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True))
  dq = np.einsum("bhts,bshd->bthd", ds, k_h) / np.sqrt(head_dim)
  group_sum = lambda x: x.reshape(batch, kv_len, -1, groups, head_dim).sum(3)
  dk = group_sum(np.einsum("bhts,bthd->bshd", ds, q)) / np.sqrt(head_dim)
  dv = group_sum(np.einsum("bhts,bthd->bshd", p, d_out))
  return out, (dq, dk, dv)


def draw_case(seed, *, max_len=90, max_window=24, group_sizes=(1, 2, 3), same_length=0.5,
              alibi=0.4, max_slope_exponent=4):
  """Random shapes (leaving partial blocks); mask kind, segments and dtype cycle with the seed so
  that every combination family appears in a short sweep. The keywords size the draw to a
  kernel's blocks (the TPU kernel's tests draw longer sequences)."""
  r = np.random.default_rng(seed)
  batch, kv_heads, groups = int(r.integers(1, 3)), int(r.choice([1, 2])), int(r.choice(group_sizes))
  q_len = int(r.integers(1, max_len))
  kv_len = q_len if r.random() < same_length else int(r.integers(1, max_len))
  kw = {}
  kind = ("causal", "window", "full")[seed % 3]
  if kind == "causal":
    kw["causal"] = True
  elif kind == "window":
    kw["window"] = int(r.integers(1, max_window))
  if r.random() < alibi:
    kw["alibi_slopes"] = 2.0 ** -r.uniform(0, max_slope_exponent, size=(kv_heads * groups,))
  ids = lambda n: np.sort(r.integers(0, 4, size=(batch, n)), axis=1)[:, ::-1]  # 0s trail
  segments = ("packed", "none", "kv_padding", "q_padding")[seed % 4]
  if segments == "packed":
    kw["q_segment_ids"], kw["kv_segment_ids"] = ids(q_len), ids(kv_len)
  elif segments == "kv_padding":
    kw["kv_segment_ids"] = ids(kv_len)
  elif segments == "q_padding":
    kw["q_segment_ids"] = ids(q_len)
  shapes = dict(batch=batch, q_len=q_len, kv_len=kv_len, heads=kv_heads * groups,
                kv_heads=kv_heads, head_dim=int(r.choice([32, 64, 128, 40])))
  dtype = jnp.bfloat16 if seed % 5 in (2, 4) else jnp.float32
  return shapes, kw, dtype


def random_qkv(seed, batch, q_len, kv_len, heads, kv_heads, head_dim, dtype=jnp.float32):
  r = np.random.default_rng(1000 + seed)
  q = r.normal(size=(batch, q_len, heads, head_dim))
  k = r.normal(size=(batch, kv_len, kv_heads, head_dim))
  v = r.normal(size=(batch, kv_len, kv_heads, head_dim))
  d_out = r.normal(size=(batch, q_len, heads, head_dim))
  return (*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(d_out, jnp.float32))


def value_and_grads(fn, q, k, v, d_out, kw):
  """out and (dq, dk, dv) of the random projection loss sum(out * d_out)."""
  def loss(q, k, v):
    arrays = {name: jnp.asarray(x) if isinstance(x, (list, np.ndarray)) else x
              for name, x in kw.items()}
    out = fn(q, k, v, **arrays)
    return jnp.sum(out.astype(jnp.float32) * d_out), out
  grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]


def assert_close(actual, expected, tol, what, floor=1e-3):
  """Max error relative to max |expected|, or to `floor` where the expected values are all
  smaller (so an exactly-zero reference still tolerates rounding)."""
  scale = max(float(np.abs(expected).max()), floor)
  err = float(np.abs(np.asarray(actual, np.float64) - expected).max()) / scale
  assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
  assert err < tol, f"{what}: max error {err:.2e} (relative to max |expected| {scale:.2e})"


@pytest.mark.parametrize("impl", ["chunked", "pallas"])
@pytest.mark.parametrize("seed", range(8))
def test_random_sweep_matches_xla_and_numpy(impl, seed):
  shapes, kw, dtype = draw_case(seed)
  q, k, v, d_out = random_qkv(seed, **shapes, dtype=dtype)
  out, grads = value_and_grads(IMPLS[impl], q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(
      lambda *a, **kw: ops.dot_product_attention(*a, implementation="xla", **kw), q, k, v, d_out,
      kw)
  # Relative to max |expected|; bf16 rounds inputs, p and dS at 2^-8 relative precision.
  out_tol, grad_tol = (2e-5, 1e-4) if dtype == jnp.float32 else (1.5e-2, 2e-2)
  case = f"{impl} {shapes} {sorted(kw)} {jnp.dtype(dtype).name}"
  assert_close(out, ref_out, out_tol, f"out vs xla, {case}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, grad_tol, f"d{name} vs xla, {case}")
  # The NumPy oracle sees the same (rounded) inputs in float64.
  np_out, np_grads = numpy_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                                     v.astype(jnp.float32), d_out, **kw)
  assert_close(out, np_out, out_tol, f"out vs numpy, {case}")
  for name, g, ref in zip("qkv", grads, np_grads):
    assert_close(g, ref, grad_tol, f"d{name} vs numpy, {case}")


@pytest.mark.parametrize("q_len, kv_len, kw", [
    (64, 128, dict(causal=True)), (96, 64, dict(window=40, alibi_slopes=np.array([0.3, 0.1])))])
def test_pallas_block_aligned_lengths(q_len, kv_len, kw):
  # Without padding or segment ids the kernels skip the mask on fully visible tiles; the random
  # sweep's odd lengths always pad, so cover the [masked | unmasked | masked] loop split here.
  q, k, v, d_out = random_qkv(1, batch=1, q_len=q_len, kv_len=kv_len, heads=2, kv_heads=1,
                              head_dim=32)
  out, grads = value_and_grads(IMPLS["pallas"], q, k, v, d_out, kw)
  np_out, np_grads = numpy_attention(q, k, v, d_out, **kw)
  assert_close(out, np_out, 2e-5, "out")
  for g, ref in zip(grads, np_grads):
    assert_close(g, ref, 1e-4, "grad")


@pytest.mark.parametrize("impl", ["chunked", "pallas"])
def test_fully_masked_rows_return_zero_with_zero_grads(impl):
  # Row 0-2: padding queries (id 0); with q_len > kv_len and causal, the first queries also sit
  # at negative positions, before every key.
  q, k, v, d_out = random_qkv(0, batch=1, q_len=40, kv_len=24, heads=2, kv_heads=1, head_dim=32)
  q_ids = np.ones((1, 40), np.int32)
  q_ids[:, :3] = 0
  kw = dict(causal=True, q_segment_ids=q_ids, kv_segment_ids=np.ones((1, 24), np.int32),
            alibi_slopes=np.array([0.5, 0.25]))
  out, (dq, dk, dv) = value_and_grads(IMPLS[impl], q, k, v, d_out, kw)
  empty_rows = np.r_[0:16]  # positions -16..-1 see no key; rows 0-2 are also padding
  np.testing.assert_array_equal(out[:, empty_rows], 0.0)
  np.testing.assert_array_equal(dq[:, empty_rows], 0.0)
  assert np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
  np_out, np_grads = numpy_attention(q, k, v, d_out, **kw)
  assert_close(out, np_out, 2e-5, "out")
  for g, ref in zip((dq, dk, dv), np_grads):
    assert_close(g, ref, 1e-4, "grad")


@pytest.mark.parametrize("impl", ["chunked", "pallas"])
def test_alibi_slope_gradient_matches_xla(impl):
  q, k, v, d_out = random_qkv(3, batch=2, q_len=33, kv_len=33, heads=4, kv_heads=2, head_dim=32)
  slopes = jnp.asarray([0.5, 0.25, 0.125, 0.0625])

  def slope_grad(fn):
    loss = lambda s: jnp.sum(fn(q, k, v, causal=True, alibi_slopes=s) * d_out)
    return np.asarray(jax.jit(jax.grad(loss))(slopes))

  expected = slope_grad(lambda *a, **kw: ops.dot_product_attention(*a, **kw))
  assert_close(slope_grad(IMPLS[impl]), expected, 1e-4, "d alibi_slopes")


def test_chunked_explicit_positions_match_xla():
  q, k, v, d_out = random_qkv(4, batch=2, q_len=20, kv_len=50, heads=2, kv_heads=2, head_dim=32)
  kw = dict(window=9, q_positions=np.stack([np.arange(20) * 2, np.arange(20) + 30]),
            kv_positions=np.tile(np.arange(50), (2, 1)))
  out, grads = value_and_grads(IMPLS["chunked"], q, k, v, d_out, kw)
  np_out, np_grads = numpy_attention(q, k, v, d_out, **kw)
  assert_close(out, np_out, 2e-5, "out")
  for g, ref in zip(grads, np_grads):
    assert_close(g, ref, 1e-4, "grad")


@pytest.mark.parametrize("kw", [
    dict(causal=True), dict(window=3), dict(q_positions=np.arange(12)[None] * 3, window=4),
    dict(q_segment_ids=[[1] * 6 + [2] * 5 + [0]], kv_segment_ids=[[1] * 4 + [2] * 8]),
    dict(kv_segment_ids=[[1] * 10 + [0] * 2], alibi_slopes=[0.5, 0.1]),
    dict(q_segment_ids=[[0] * 2 + [1] * 10], causal=True)])
def test_xla_reference_matches_numpy_mask_semantics(kw):
  q, k, v, d_out = random_qkv(5, batch=1, q_len=12, kv_len=12, heads=2, kv_heads=1, head_dim=8)
  kw = {name: np.asarray(x) if isinstance(x, list) else x for name, x in kw.items()}
  out, grads = value_and_grads(ops.dot_product_attention, q, k, v, d_out, kw)
  np_out, np_grads = numpy_attention(q, k, v, d_out, **kw)
  assert_close(out, np_out, 2e-5, "out")
  for g, ref in zip(grads, np_grads):
    assert_close(g, ref, 1e-4, "grad")


@pytest.mark.parametrize("impl", ["chunked", "pallas"])
def test_registered_with_ops(impl):
  q, k, v, _ = random_qkv(6, batch=1, q_len=16, kv_len=16, heads=2, kv_heads=1, head_dim=16)
  out = ops.dot_product_attention(q, k, v, causal=True, implementation=impl)
  ref = ops.dot_product_attention(q, k, v, causal=True, implementation="xla")
  assert_close(out, np.asarray(ref), 2e-5, impl)


@pytest.mark.parametrize("impl, kw, message", [
    ("chunked", dict(bias=np.zeros((1, 1, 8, 8), np.float32)), "only supported by implementation"),
    ("pallas", dict(bias=np.zeros((1, 1, 8, 8), np.float32)), "only supported by implementation"),
    ("pallas", dict(q_positions=np.arange(8)[None]), "only supported by implementation"),
    ("cudnn", dict(alibi_slopes=[0.5, 0.5]), "only supported by implementation"),
    ("cudnn", dict(kv_positions=np.arange(8)[None]), "only supported by implementation"),
    # pallas applies dropout (test_dropout.py); the others refuse it.
    ("chunked", dict(dropout_rate=0.1, dropout_rng=jax.random.PRNGKey(0)), "'xla' or 'pallas'"),
    ("cudnn", dict(dropout_rate=0.1, dropout_rng=jax.random.PRNGKey(0)), "'xla' or 'pallas'"),
])
def test_unsupported_combinations_raise(impl, kw, message):
  q, k, v, _ = random_qkv(7, batch=1, q_len=8, kv_len=8, heads=2, kv_heads=1, head_dim=16)
  with pytest.raises(ValueError, match=message):
    ops.dot_product_attention(q, k, v, implementation=impl, **kw)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the non-GPU error")
def test_cudnn_refuses_non_gpu_backend():
  q, k, v, _ = random_qkv(7, batch=1, q_len=8, kv_len=8, heads=2, kv_heads=1, head_dim=16,
                          dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
    ops.dot_product_attention(q, k, v, implementation="cudnn")


@pytest.mark.parametrize("head_dim, dtype", [(64, jnp.bfloat16), (128, jnp.float16),
                                             (80, jnp.float32)])
def test_pallas_lowers_through_triton(head_dim, dtype):
  """Forward + backward lower to Triton kernels for CUDA, with the default GPU tilings (no GPU
  needed: this catches non-power-of-two tiles and primitives Triton cannot lower)."""
  def loss(q, k, v, slopes, q_ids, kv_ids):
    out = flash_attention(q, k, v, causal=True, window=200, alibi_slopes=slopes,
                          q_segment_ids=q_ids, kv_segment_ids=kv_ids, interpret=False)
    return jnp.sum(out.astype(jnp.float32))

  spec = jax.ShapeDtypeStruct
  exported = export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
          spec((2, 300, 8, head_dim), dtype), spec((2, 300, 2, head_dim), dtype),
          spec((2, 300, 2, head_dim), dtype), spec((8,), jnp.float32),
          spec((2, 300), jnp.int32), spec((2, 300), jnp.int32))
  assert exported.mlir_module().count("__gpu$xla.gpu.triton") == 3  # fwd, dk/dv, dq


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("impl", ["pallas", "cudnn"])
def test_gpu_compiled_matches_xla(impl):
  q, k, v, d_out = random_qkv(8, batch=2, q_len=1024, kv_len=1024, heads=8, kv_heads=2,
                              head_dim=64, dtype=jnp.bfloat16)
  kw = dict(causal=True, window=300)
  if impl == "pallas":
    kw["alibi_slopes"] = 2.0 ** -np.arange(1, 9)
  fn = lambda *a, **kw: ops.dot_product_attention(*a, implementation=impl, **kw)
  out, grads = value_and_grads(fn, q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(ops.dot_product_attention, q, k, v, d_out, kw)
  assert_close(out, ref_out, 3e-2, "out")
  for g, ref in zip(grads, ref_grads):
    assert_close(g, ref, 5e-2, "grad")


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("seed", range(10))
def test_gpu_sweep_default_tilings_matches_xla_and_numpy(seed):
  """The seeded sweep compiled by Triton with the production tilings (GPU_TILINGS), at lengths
  spanning several of their blocks: outputs and gradients against xla and NumPy, bf16 and fp32."""
  shapes, kw, dtype = draw_case(seed, max_len=700, max_window=300)
  q, k, v, d_out = random_qkv(seed, **shapes, dtype=dtype)
  pallas = lambda *a, **kw: ops.dot_product_attention(*a, implementation="pallas", **kw)
  xla = lambda *a, **kw: ops.dot_product_attention(*a, implementation="xla", **kw)
  out, grads = value_and_grads(pallas, q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(xla, q, k, v, d_out, kw)
  np_out, np_grads = numpy_attention(*(x.astype(jnp.float32) for x in (q, k, v)), d_out, **kw)
  out_tol, grad_tol = (5e-5, 2e-4) if dtype == jnp.float32 else (1.5e-2, 2e-2)
  case = f"{shapes} {sorted(kw)} {jnp.dtype(dtype).name}"
  for ref_name, r_out, r_grads in (("xla", ref_out, ref_grads), ("numpy", np_out, np_grads)):
    assert_close(out, r_out, out_tol, f"out vs {ref_name}, {case}")
    for name, g, ref in zip("qkv", grads, r_grads):
      assert_close(g, ref, grad_tol, f"d{name} vs {ref_name}, {case}")


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_gpu_fp32_follows_default_matmul_precision():
  """Under the default (TF32) setting the kernel rounds fp32 products as XLA does: both land
  ~1e-3 off the float64 oracle and close to each other; under 'float32' both are exact."""
  q, k, v, d_out = random_qkv(11, batch=1, q_len=512, kv_len=512, heads=4, kv_heads=4,
                              head_dim=64)
  np_out, _ = numpy_attention(q, k, v, d_out, causal=True)
  errors = {}
  for setting in ("tensorfloat32", "float32"):
    with jax.default_matmul_precision(setting):
      for impl in ("pallas", "xla"):
        out = np.asarray(ops.dot_product_attention(q, k, v, causal=True, implementation=impl))
        errors[setting, impl] = float(np.abs(out - np_out).max() / np.abs(np_out).max())
  assert errors["float32", "pallas"] < 1e-5 and errors["float32", "xla"] < 1e-5, errors
  assert errors["tensorfloat32", "pallas"] > 1e-5, errors  # TF32 really used
  assert errors["tensorfloat32", "pallas"] < 5 * max(errors["tensorfloat32", "xla"], 1e-4), errors


def test_bench_smoke_writes_outputs(tmp_path):
  subprocess.run([sys.executable, os.path.join(REPO, "experiments", "bench_attention.py"),
                  "--smoke", "--out", str(tmp_path)], check=True, cwd=REPO, timeout=120)
  for name in ("results.json", "results.md", "results.png"):
    path = tmp_path / name
    assert path.exists() and path.stat().st_size > 0, name


@pytest.mark.slow
def test_chunked_16k_forward_backward_fits_in_2gb():
  """L = 16k, 8 heads x 64, fp32, batch 1: forward + backward peak RSS (the xla path needs
  an 8 GiB logits array alone)."""
  script = textwrap.dedent("""
      import jax, jax.numpy as jnp
      from tfjax.nn.kernels import chunked_attention
      q = k = v = jnp.ones((1, 16384, 8, 64), jnp.float32) * 0.01
      loss = lambda q, k, v: chunked_attention(q, k, v, causal=True).sum()
      jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
  """)
  result = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", script], cwd=REPO,
                          capture_output=True, text=True, check=True)
  rss_kb = int(next(line.split(":")[1] for line in result.stderr.splitlines()
                    if "Maximum resident set size" in line))
  assert rss_kb < 2 * 1024 * 1024, f"peak RSS {rss_kb / 1024:.0f} MiB"


def tiny_model_losses(impl, steps=20):
  """Training losses of a tiny causal LM (ALiBi, GQA) with model.attention_impl=impl."""
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel

  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(2, 6), test_lengths=(6,),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=32, num_layers=1, num_heads=4,
                      num_kv_heads=2, d_ff=64, position="alibi", attention_impl=impl)
  config.optimizer.update(lr=3e-3, warmup_steps=2)
  config.train.update(num_steps=steps, batch_size=4)
  exp = experiment.prepare(config)
  placement = sharding.BatchPlacement.for_config(config)
  layout = experiment.state_layout(exp, placement)
  state = layout.init()
  step = experiment.jit_train_step(exp, placement, layout.shardings)
  out = []
  with placement.axis_rules():
    for i in range(steps):
      state, metrics = step(state, exp.dataset.train_batch(i, 4))
      out.append(float(metrics["train/loss"]))
  return np.asarray(out)


@pytest.mark.slow  # 17 s: each implementation's outputs and gradients are tested above
def test_small_model_trains_the_same_with_every_cpu_implementation():
  """20 training steps of a tiny causal LM with attention_impl chunked and pallas (interpret)
  follow the xla run's losses: the fused paths plug into the model, forward and backward."""
  reference = tiny_model_losses("xla")
  assert reference[-1] < reference[0]  # it trains
  for impl in ("chunked", "pallas"):
    np.testing.assert_allclose(tiny_model_losses(impl), reference, rtol=2e-4, atol=2e-4,
                               err_msg=impl)
