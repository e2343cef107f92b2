"""Logit soft-capping (Gemma 2: s' = c tanh(s / c) on the scaled scores, before ALiBi and masks)
inside every Pallas kernel: Triton (interpreted), Mosaic GPU forward and backward (Mosaic GPU's
interpreter), Mosaic TPU (TPU interpret mode) and the plain-JAX chunked attention.

References written here: a float64 NumPy forward, and jax.grad of a plain jnp attention for the
gradients (neither calls tfjax). Properties: a huge cap (1e6) changes nothing beyond rounding, a
small cap changes the output (so the comparisons can fail). Routing through tfjax.nn.ops and the
GPU forward/backward choice is traced. With the CUDA plugin (`aot_gpu`): the softcap kernels
compile for H100 (sm_90a) within 227 KiB of shared memory and spill at most 1 KiB.
"""
import functools
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_flash_attention_mgpu_bwd import kernel_resources, on_hopper
from test_kernels import assert_close, random_qkv
from tfjax.nn import dropout_hash, ops
from tfjax.nn.kernels import chunked_attention, flash_attention_tpu
from tfjax.nn.kernels import flash_attention_mgpu as mgpu
from tfjax.nn.kernels import flash_attention_mgpu_bwd as mgpu_bwd
from tfjax.nn.kernels.flash_attention_tpu import TpuTiling, TpuTilings
from tfjax.nn.kernels.gpu_tilings import KernelTiling, Tilings

# The modules (tfjax.nn.kernels re-exports their functions under the same names).
fa = importlib.import_module("tfjax.nn.kernels.flash_attention")
tpu_module = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
H100_SHARED_BYTES = 227 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Small tiles: sequences of ~100 span several query and key blocks.
KERNELS = {
    "triton": functools.partial(fa.flash_attention, interpret=True, tilings=Tilings(
        KernelTiling(16, 32), KernelTiling(32, 16))),
    "tpu": functools.partial(flash_attention_tpu, interpret=True,
                             tilings=TpuTilings(TpuTiling(32, 128), TpuTiling(64, 128))),
    "chunked": functools.partial(chunked_attention, block_q=32, block_k=32),
}


def np_softcap_attention(q, k, v, *, softcap, causal=False, window=None, alibi_slopes=None):
  """float64 softmax(c tanh(q k^T / sqrt(D) / c) - m |i - j| + mask) v, end-aligned positions,
  GQA by repeating K/V."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  q_len, heads, head_dim = q.shape[1:]
  kv_len, groups = k.shape[1], heads // k.shape[2]
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(head_dim)
  if softcap is not None:
    s = softcap * np.tanh(s / softcap)
  rel = (np.arange(q_len) + kv_len - q_len)[:, None] - np.arange(kv_len)[None, :]  # i - j
  if alibi_slopes is not None:
    s = s - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * np.abs(rel)
  visible = np.ones_like(rel, bool)
  if causal or window is not None:
    visible &= rel >= 0
  if window is not None:
    visible &= rel < window
  s = np.where(visible, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum("bhts,bshd->bthd", w / w.sum(-1, keepdims=True), v)


def jnp_softcap_attention(q, k, v, *, softcap, causal=False, window=None, alibi_slopes=None,
                          keep=None, rate=0.0):
  """The same attention in plain fp32 jnp, for jax.grad; `keep` [B, H, T, S]: the weights kept
  by dropout at `rate` (the others 0, the kept ones scaled by 1 / (1 - rate))."""
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  q_len, heads, head_dim = q.shape[1:]
  kv_len, groups = k.shape[1], heads // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  s = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(head_dim)
  if softcap is not None:
    s = softcap * jnp.tanh(s / softcap)
  rel = (np.arange(q_len) + kv_len - q_len)[:, None] - np.arange(kv_len)[None, :]
  if alibi_slopes is not None:
    s = s - jnp.asarray(alibi_slopes, jnp.float32)[None, :, None, None] * np.abs(rel)
  visible = np.ones_like(rel, bool)
  if causal or window is not None:
    visible &= rel >= 0
  if window is not None:
    visible &= rel < window
  s = jnp.where(visible, s, -jnp.inf)
  w = jax.nn.softmax(s, axis=-1)
  if keep is not None:
    w = jnp.where(keep, w / (1.0 - rate), 0.0)
  return jnp.einsum("bhts,bshd->bthd", w, v, precision="highest")


def out_and_grads(fn, q, k, v, d_out, **kw):
  loss = lambda q, k, v: jnp.sum(fn(q, k, v, **kw).astype(jnp.float32) * d_out)
  out = fn(q, k, v, **kw)
  return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in
                                       jax.grad(loss, argnums=(0, 1, 2))(q, k, v)]


def qkv(seed, q_len, kv_len, heads, kv_heads, head_dim, dtype=jnp.float32, spread=3.0):
  """Inputs whose scores reach |s| ~ 10: a cap of 2-5 bends most of them."""
  q, k, v, d_out = random_qkv(seed, 1, q_len, kv_len, heads, kv_heads, head_dim, dtype)
  return (q * spread).astype(dtype), (k * spread).astype(dtype), v, d_out


# (q_len, kv_len, heads, kv_heads, head_dim, kw): causal and not, ALiBi, window, GQA, T != S.
CASES = [
    (96, 96, 2, 2, 32, dict(causal=False)),
    (80, 112, 4, 2, 32, dict(causal=True, alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]))),
    (100, 100, 4, 1, 16, dict(causal=True, window=40)),
]


@pytest.mark.parametrize("impl", sorted(KERNELS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_and_gradients_match_the_references(impl, case):
  q_len, kv_len, heads, kv_heads, head_dim, kw = CASES[case]
  q, k, v, d_out = qkv(case, q_len, kv_len, heads, kv_heads, head_dim)
  softcap = 2.5
  out, grads = out_and_grads(KERNELS[impl], q, k, v, d_out, softcap=softcap, **kw)
  what = f"{impl} case {case}"
  assert_close(out, np_softcap_attention(q, k, v, softcap=softcap, **kw), 2e-5, f"out {what}")
  want = out_and_grads(jnp_softcap_attention, q, k, v, d_out, softcap=softcap, **kw)[1]
  for name, g, ref in zip("qkv", grads, want):
    assert_close(g, ref, 1e-4, f"d{name} {what}", floor=1e-2)


@pytest.mark.parametrize("impl", sorted(KERNELS))
def test_a_huge_cap_changes_nothing_and_a_small_one_does(impl):
  q, k, v, d_out = qkv(7, 64, 64, 2, 1, 32)
  kw = dict(causal=True)
  plain, plain_grads = out_and_grads(KERNELS[impl], q, k, v, d_out, **kw)
  huge, huge_grads = out_and_grads(KERNELS[impl], q, k, v, d_out, softcap=1e6, **kw)
  assert_close(huge, plain, 1e-5, f"{impl} out, cap 1e6")
  for g, ref in zip(huge_grads, plain_grads):
    assert_close(g, ref, 1e-4, f"{impl} grads, cap 1e6", floor=1e-2)
  small, _ = out_and_grads(KERNELS[impl], q, k, v, d_out, softcap=1.0, **kw)
  assert np.abs(small - plain).max() > 0.1 * np.abs(plain).max()  # the cap flattens the weights


def test_triton_softcap_with_dropout_equals_xla_with_the_same_key():
  """The cap and the dropout mask together, forward and gradients, through the 'pallas' entry
  (the Triton kernels' interpreter on CPU) against 'xla' given the same rng."""
  q, k, v, d_out = qkv(6, 64, 64, 2, 1, 16)
  kw = dict(causal=True, softcap=2.0, dropout_rate=0.3, dropout_rng=jax.random.key(5))
  out, grads = out_and_grads(functools.partial(ops.dot_product_attention,
                                               implementation="pallas"), q, k, v, d_out, **kw)
  ref_out, ref_grads = out_and_grads(ops.dot_product_attention, q, k, v, d_out, **kw)
  assert_close(out, ref_out, 2e-5, "out")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 1e-4, f"d{name}", floor=1e-2)


def test_bad_caps_are_a_clear_error():
  q = jnp.zeros((1, 16, 1, 16))
  for impl, fn in KERNELS.items():
    with pytest.raises(ValueError, match="softcap must be a positive number.* got 0.0"):
      fn(q, q, q, softcap=0.0)


# ---- Mosaic GPU forward and backward, by Mosaic GPU's interpreter -----------------------------


def interpret_params():
  # Private path (the same in jax 0.10 and 0.11): jax.experimental exports no GPU interpret params.
  # pylint: disable-next=import-outside-toplevel
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def check_mosaic_forward(seed, length, heads, kv_heads, causal, softcap, **kw):
  q, k, v, _ = qkv(seed, length, length, heads, kv_heads, 64, jnp.bfloat16)
  out, lse = mgpu.mosaic_forward(
      q, k, v, causal=causal, scale=64 ** -0.5, softcap=softcap, interpret=interpret_params(),
      tiling=mgpu.MosaicTiling(block_q=64, block_kv=64, stages=2),
      alibi_slopes=None if "alibi_slopes" not in kw else jnp.asarray(kw["alibi_slopes"])[None],
      window=kw.get("window"))
  f32 = lambda x: np.asarray(x, np.float32)
  want = np_softcap_attention(f32(q), f32(k), f32(v), softcap=softcap, causal=causal, **kw)
  assert_close(f32(out), want, 1e-2, f"mosaic forward out, softcap {softcap}")  # bf16 P, out
  return f32(out), f32(lse), want


def test_mosaic_gpu_forward_interpreted_matches_numpy():
  """Causal GQA with ALiBi and a window, two 128-row programs over 64-key blocks; the lse is the
  one of the capped logits (what the backward recomputes P from)."""
  slopes = np.array([0.25, 0.0625])
  out, lse, _ = check_mosaic_forward(0, 256, 2, 1, True, 2.0, alibi_slopes=slopes, window=96)
  f32 = lambda x: np.asarray(x, np.float32)
  q, k, _, _ = qkv(0, 256, 256, 2, 1, 64, jnp.bfloat16)
  k64 = np.repeat(f32(k).astype(np.float64), 2, axis=2)
  s = 2.0 * np.tanh(np.einsum("bthd,bshd->bhts", f32(q).astype(np.float64), k64) / 8.0 / 2.0)
  rel = np.arange(256)[:, None] - np.arange(256)[None, :]
  s = np.where((rel >= 0) & (rel < 96), s - slopes[None, :, None, None] * np.abs(rel), -np.inf)
  top = s.max(-1)
  np.testing.assert_allclose(lse, top + np.log(np.exp(s - top[..., None]).sum(-1)), atol=1e-3)


def test_mosaic_gpu_forward_cap_property():
  """Non-causal: a 1e6 cap equals no cap to bf16 rounding, a cap of 1 differs."""
  plain, _, _ = check_mosaic_forward(1, 128, 1, 1, False, None)
  huge, _, _ = check_mosaic_forward(1, 128, 1, 1, False, 1e6)
  assert_close(huge, plain, 1e-2, "cap 1e6 vs none")
  small, _, _ = check_mosaic_forward(1, 128, 1, 1, False, 1.0)
  assert np.abs(small - plain).max() > 0.1 * np.abs(plain).max()


def check_mosaic_backward(seed, length, heads, kv_heads, causal, softcap, rate=0.0):
  q, k, v, d_out = qkv(seed, length, length, heads, kv_heads, 64, jnp.bfloat16)
  d_out = d_out.astype(jnp.bfloat16)
  # The mask of tfjax.nn.dropout_hash (checked against a NumPy hash in test_dropout.py).
  keep = dropout_hash.keep_mask(seed, 1, heads, length, length, rate) if rate else None
  attend = lambda q, k, v: jnp_softcap_attention(q, k, v, softcap=softcap, causal=causal,
                                                 keep=keep, rate=rate)
  out, vjp = jax.vjp(attend, q, k, v)
  want = vjp(d_out.astype(jnp.float32))
  # The forward's lse of the capped logits, from the plain reference.
  q32, k32 = (np.asarray(x, np.float32).astype(np.float64) for x in (q, k))
  s = np.einsum("bthd,bshd->bhts", q32, np.repeat(k32, heads // kv_heads, axis=2)) / 8.0
  s = softcap * np.tanh(s / softcap)
  if causal:
    s = np.where(np.tril(np.ones((length, length), bool)), s, -np.inf)
  top = s.max(-1)
  lse = jnp.asarray(top + np.log(np.exp(s - top[..., None]).sum(-1)), jnp.float32)
  grads = mgpu_bwd.mosaic_backward(q, k, v, out.astype(jnp.bfloat16), lse, d_out, causal=causal,
                                   scale=64 ** -0.5, softcap=softcap, dropout_rate=rate,
                                   dropout_keys_BxH=dropout_hash.head_keys(seed, 1, heads),
                                   interpret=interpret_params())
  for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
    got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1.5e-2, f"{name}: max error {err:.4f} of the largest entry (softcap {softcap})"


def test_mosaic_gpu_backward_interpreted_matches_jax_grad():
  """Causal GQA (2 query heads per kv head), cap 2: dS goes through 1 - tanh^2 in both kernels
  (without it dq and dk are off by far more than the bf16 bound)."""
  check_mosaic_backward(2, 256, 2, 1, True, 2.0)


def test_mosaic_gpu_backward_interpreted_with_dropout_matches_jax_grad():
  """Softcap and dropout (rate 0.3) together: the tiles' keep mask and 1 - tanh^2 (the order of
  the dropout path, which keeps the fp32 P^T for the mask)."""
  check_mosaic_backward(5, 128, 2, 1, False, 3.0, rate=0.3)


@pytest.mark.slow
def test_mosaic_gpu_backward_interpreted_non_causal_mha():
  check_mosaic_backward(3, 128, 2, 2, False, 5.0)


# ---- Routing (traced, nothing runs) -----------------------------------------------------------


def _kernel_names(fn, *shapes):
  text = str(jax.make_jaxpr(fn)(*shapes))
  return set(re.findall(r"tfjax_flash_\w+", text))


def test_gpu_forward_and_backward_choices_take_the_softcap():
  q = jax.ShapeDtypeStruct((1, 512, 4, 64), jnp.bfloat16)

  def grad(gpu_forward, gpu_backward):
    loss = lambda *a: fa.flash_attention(
        *a, causal=True, softcap=30.0, interpret=False, gpu_forward=gpu_forward,
        gpu_backward=gpu_backward).astype(jnp.float32).sum()
    return _kernel_names(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)

  assert grad("mosaic", "mosaic") == {"tfjax_flash_forward_mgpu", "tfjax_flash_dkdv_mgpu",
                                      "tfjax_flash_dq_mgpu"}
  assert grad("triton", "triton") == {"tfjax_flash_forward", "tfjax_flash_dkdv", "tfjax_flash_dq"}
  # With dropout: Mosaic at D 64; at D 128 the dK/dV kernel would spill 1,864 B, so Triton's.
  for head_dim, names in ((64, {"tfjax_flash_dkdv_mgpu", "tfjax_flash_dq_mgpu"}),
                          (128, {"tfjax_flash_dkdv", "tfjax_flash_dq"})):
    x = jax.ShapeDtypeStruct((1, 512, 4, head_dim), jnp.bfloat16)
    loss = lambda *a: fa.flash_attention(
        *a, causal=True, softcap=30.0, interpret=False, gpu_forward="triton",
        gpu_backward="mosaic", dropout_rate=0.1, dropout_seed=0).astype(jnp.float32).sum()
    assert _kernel_names(jax.grad(loss, argnums=(0, 1, 2)), x, x, x) - {
        "tfjax_flash_forward"} == names, head_dim


def test_auto_keeps_the_untimed_mosaic_softcap_on_triton(monkeypatch):
  """Softcap on the Mosaic GPU forward was never timed: 'auto' on Hopper leaves it to Triton, as
  it does windows, ALiBi, segments and dropout ('mosaic' opts in, above)."""
  monkeypatch.setattr(fa, "_on_hopper", lambda: True)
  q = jax.ShapeDtypeStruct((1, 512, 4, 64), jnp.bfloat16)
  attend = lambda softcap: lambda *a: fa.flash_attention(*a, causal=True, softcap=softcap,
                                                         interpret=False, gpu_forward="auto")
  assert _kernel_names(attend(None), q, q, q) == {"tfjax_flash_forward_mgpu"}
  assert _kernel_names(attend(30.0), q, q, q) == {"tfjax_flash_forward"}


def test_ops_routes_softcap_to_the_kernels():
  q, k, v, _ = qkv(4, 48, 48, 2, 1, 16)
  xla = ops.dot_product_attention(q, k, v, causal=True, softcap=2.0, implementation="xla")
  for impl in ("pallas", "chunked"):  # pallas on CPU: the Triton kernels' interpreter
    got = ops.dot_product_attention(q, k, v, causal=True, softcap=2.0, implementation=impl)
    assert_close(np.asarray(got), np.asarray(xla), 2e-5, impl)
  with pytest.raises(ValueError, match=r"soft-capping .*\('xla', 'chunked', 'pallas'\), not "
                                       r"'cudnn'"):
    ops.dot_product_attention(q, k, v, softcap=2.0, implementation="cudnn")
  # 'auto' traced on CPU carries each platform's kernel (chosen when lowering), softcap included.
  shape = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
  names = _kernel_names(lambda *a: ops.dot_product_attention(
      *a, causal=True, softcap=2.0, implementation="auto"), shape, shape, shape)
  assert {"tfjax_flash_forward", "tfjax_flash_tpu_forward"} <= names


@pytest.mark.parametrize("head_dim, dtype, generation", [
    (64, jnp.bfloat16, "v5e"), (128, jnp.float32, "v4")])
def test_tpu_softcap_kernels_lower_for_tpu(head_dim, dtype, generation):
  """Forward + backward with a cap, ALiBi and a window lower to three Mosaic TPU kernels (Pallas'
  Mosaic lowering rejects what Mosaic cannot lower; no TPU needed)."""
  tilings = tpu_module.default_tilings(head_dim, dtype, generation)
  loss = lambda q, k, v, slopes: jnp.sum(flash_attention_tpu(
      q, k, v, causal=True, window=700, alibi_slopes=slopes, softcap=30.0, tilings=tilings,
      interpret=False).astype(jnp.float32))
  spec = jax.ShapeDtypeStruct
  args = (spec((2, 1500, 8, head_dim), dtype), spec((2, 1500, 2, head_dim), dtype),
          spec((2, 1500, 2, head_dim), dtype), spec((8,), jnp.float32))
  text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(
      lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 3


# ---- Compile for H100 from this CPU (the CUDA plugin) ------------------------------------------

GPU_CASES = [  # (head_dim, causal, heads, kv_heads, dropout rate)
    (64, True, 8, 2, 0.0), (128, True, 8, 2, 0.0), (128, False, 4, 4, 0.0), (64, True, 8, 2, 0.1),
    (128, True, 8, 2, 0.1)]


def check_softcap_compiles_for_h100(dump_dir):
  """Triton (forward, dK/dV, dQ) and Mosaic GPU (forward, dK/dV, dQ) kernels with softcap 30,
  forward + backward, L 1024, bf16, compiled for H100. Prints one line per kernel:
  name, shared memory bytes, spill bytes (Triton: ptxas -v on XLA's PTX; Mosaic: its dumps)."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from tfjax.aot import devices, gpu_kernels, targets  # pylint: disable=import-outside-toplevel
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(targets.parse_target("h100"))),
                            ("x",)), PartitionSpec())
  for head_dim, causal, heads, kv_heads, rate in GPU_CASES:
    shape = lambda h: jax.ShapeDtypeStruct((2, 1024, h, head_dim), jnp.bfloat16, sharding=spec)
    seed = jax.ShapeDtypeStruct((), jnp.int32, sharding=spec)
    for kernels in ("triton", "mosaic"):
      if rate and kernels == "triton":
        continue  # the Triton kernels' dropout is compiled by test_dropout / test_aot_kernels
      loss = lambda q, k, v, seed: fa.flash_attention(
          q, k, v, causal=causal, softcap=30.0, interpret=False, gpu_forward=kernels,
          gpu_backward=kernels, dropout_rate=rate, dropout_seed=seed).astype(jnp.float32).sum()
      lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
          shape(heads), shape(kv_heads), shape(kv_heads), seed).lower(
              lowering_platforms=("cuda",))
      case = f"D{head_dim} causal={causal} {heads}/{kv_heads} dropout={rate}"
      if kernels == "triton":
        compiled, resources = gpu_kernels.compile_with_resources(lowered, "tfjax_flash")
        assert sorted(r.name for r in resources) == [
            "tfjax_flash_dkdv", "tfjax_flash_dq", "tfjax_flash_forward"], resources
        for r in resources:
          print(f"RESOURCE triton {r.name} {case}: {r.shared_bytes} {r.spill_bytes} "
                f"{r.registers}")
      else:  # dropout at D 128: Triton's forward and (with softcap) backward; Mosaic's spill
        text = lowered.compile().as_text()
        mosaic = 0 if rate and head_dim == 128 else 3
        if mosaic:
          print(f"MOSAIC {case}")
        assert text.count('custom_call_target="mosaic_gpu') == mosaic, case


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_softcap_kernels_compile_for_h100_within_shared_memory_and_spills():
  code = ("import importlib.util, sys; sys.path[:0] = ['tests', 'tests/nn/kernels']; "
          "spec = importlib.util.spec_from_file_location('t', "
          f"{os.path.abspath(__file__)!r}); m = importlib.util.module_from_spec(spec); "
          "spec.loader.exec_module(m); m.check_softcap_compiles_for_h100(sys.argv[1])")
  # Keep the caller's PYTHONPATH after the repo: the CUDA plugin may be installed with --target.
  path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
  with tempfile.TemporaryDirectory() as dump:
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu", MOSAIC_GPU_DUMP_TO=dump,
               MOSAIC_GPU_DUMP_PTXAS="1")
    result = subprocess.run([sys.executable, "-c", code, dump], cwd=REPO, capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    found = kernel_resources(dump)
  triton = re.findall(r"RESOURCE triton (\w+) (.*): (\d+) (\d+) (\d+)", result.stdout)
  assert len(triton) == 3 * sum(not case[-1] for case in GPU_CASES), result.stdout
  print("Mosaic dumps numbered in this order:", re.findall(r"MOSAIC (.*)", result.stdout))
  for name, case, shared, spills, registers in triton:
    print(f"{name} {case}: {shared} B shared memory, {spills} B spilled, {registers} registers")
    assert 0 < int(shared) <= H100_SHARED_BYTES and int(spills) <= 1024, (name, case)
  names = {re.sub(r"_\d+$", "", name) for name in found}
  assert names == {"tfjax_flash_forward_mgpu", "tfjax_flash_dkdv_mgpu",
                   "tfjax_flash_dq_mgpu"}, found
  for name, (shared, spills) in sorted(found.items()):
    print(f"{name}: {shared} B shared memory, {spills} B spilled")
    assert 0 < shared <= H100_SHARED_BYTES and spills <= 1024, (name, shared, spills)


# ---- On a Hopper GPU (not run in the session that wrote this: no GPU) -------------------------

@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("kernels", ["triton", "mosaic"])
@pytest.mark.parametrize("head_dim, causal", [(64, True), (128, True), (128, False)])
def test_gpu_softcap_kernels_match_xla_with_gradients(kernels, head_dim, causal):
  """Compiled Triton or Mosaic GPU forward + backward with a cap of 5 (GQA, L 1024, bf16): out and
  dq, dk, dv against xla's softcap."""
  q, k, v, d_out = qkv(11, 1024, 1024, 8, 2, head_dim, jnp.bfloat16)
  q, k, v = (jnp.broadcast_to(x, (2, *x.shape[1:])) for x in (q, k, v))
  d_out = jnp.broadcast_to(d_out, (2, *d_out.shape[1:]))
  kw = dict(causal=causal, softcap=5.0)
  ours = functools.partial(fa.flash_attention, gpu_forward=kernels, gpu_backward=kernels)
  out, grads = out_and_grads(ours, q, k, v, d_out, **kw)
  xla = functools.partial(ops.dot_product_attention, implementation="xla")
  ref_out, ref_grads = out_and_grads(xla, q, k, v, d_out, **kw)
  assert_close(out, ref_out, 1.5e-2, f"out {kernels} D{head_dim}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 2e-2, f"d{name} {kernels} D{head_dim}")
