"""The Mosaic GPU flash-attention backward (tfjax/nn/kernels/flash_attention_mgpu_bwd.py).

Here (CPU): which calls reach it (`gpu_backward` routing, traced, not run); the dK/dV and dQ
kernels run by Mosaic GPU's interpreter (warpgroups, TMA rings, barriers, causal blocks, GQA
group loop; plain dots standing in for wgmma) against jax.grad of a plain attention written
here; with the CUDA plugin (`aot_gpu`), that both kernels compile for H100 (sm_90a) within its
227 KiB of shared memory and spill under 1 KiB. Nothing here times them: no GPU was available.
"""
import glob
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

from tfjax.nn import dropout_hash
from tfjax.nn.kernels import flash_attention_mgpu as mgpu
from tfjax.nn.kernels import flash_attention_mgpu_bwd as bwd

fa = importlib.import_module("tfjax.nn.kernels.flash_attention")
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
MOSAIC_NAMES = {"tfjax_flash_dkdv_mgpu", "tfjax_flash_dq_mgpu"}
TRITON_NAMES = {"tfjax_flash_dkdv", "tfjax_flash_dq"}
H100_SHARED_BYTES = 227 * 1024  # shared_memory_per_block_optin of an H100


# ---- Scope and routing (traced only) -----------------------------------------------------------


@pytest.mark.parametrize("tiling", [bwd.BwdTiling, mgpu.MosaicTiling])
def test_tilings_refuse_tiles_off_64_and_rings_under_two_slots(tiling):
  assert tiling(block_q=128, block_kv=64, stages=2).block_q == 128
  with pytest.raises(ValueError, match="multiples of 64.*block_q=96, block_kv=64"):
    tiling(block_q=96, block_kv=64, stages=2)
  with pytest.raises(ValueError, match="stages=1: .* at least 2 slots"):
    tiling(block_q=64, block_kv=64, stages=1)


@pytest.mark.parametrize("q_shape, kv_shape, dtype, kw, expected", [
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=True), True),
    ((2, 1024, 8, 64), (2, 2048, 2, 64), jnp.bfloat16, dict(causal=False), True),  # GQA, cross
    ((2, 1024, 8, 64), (2, 2048, 2, 64), jnp.bfloat16, dict(causal=True), False),  # offset
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.float16, dict(causal=True), False),
    ((2, 1024, 8, 256), (2, 1024, 8, 256), jnp.bfloat16, dict(causal=True), False),
    ((2, 1024, 6, 128), (2, 1024, 4, 128), jnp.bfloat16, dict(causal=False), False),  # 4 !| 6
    ((2, 192, 8, 64), (2, 192, 8, 64), jnp.bfloat16, dict(causal=False), False),  # 192 % 128
    ((2, 1024, 8, 64), (2, 1024, 8, 64), jnp.bfloat16, dict(causal=True, has_alibi=True), False),
    ((2, 1024, 8, 64), (2, 1024, 8, 64), jnp.bfloat16, dict(causal=True, has_segments=True),
     False),
    ((2, 1024, 8, 64), (2, 1024, 8, 64), jnp.bfloat16, dict(causal=True, window=256), False),
])
def test_supports_is_the_documented_scope(q_shape, kv_shape, dtype, kw, expected):
  kw = dict(dict(has_segments=False, has_alibi=False, window=None), **kw)
  assert bwd.supports(q_shape, kv_shape, dtype, **kw) is expected


def _kernels(gpu_backward, q_len=512, kv_len=512, heads=4, kv_heads=4, head_dim=64,
             dtype=jnp.bfloat16, interpret=False, **kw):
  """The names of the backward kernels in the traced gradient program (nothing runs)."""
  q = jax.ShapeDtypeStruct((1, q_len, heads, head_dim), dtype)
  kv = jax.ShapeDtypeStruct((1, kv_len, kv_heads, head_dim), dtype)
  loss = lambda q, k, v: fa.flash_attention(q, k, v, interpret=interpret, gpu_forward="triton",
                                            gpu_backward=gpu_backward, **kw).astype(
                                                jnp.float32).sum()
  text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, kv, kv))
  return set(re.findall(r"tfjax_flash_\w+", text)) & (MOSAIC_NAMES | TRITON_NAMES)


def test_gpu_backward_routes_to_mosaic_only_where_it_applies():
  assert _kernels("mosaic", causal=True) == MOSAIC_NAMES
  assert _kernels("mosaic", heads=8, kv_heads=2, kv_len=1024) == MOSAIC_NAMES  # GQA, cross
  assert _kernels("mosaic", head_dim=128, causal=True) == MOSAIC_NAMES
  assert _kernels("mosaic", head_dim=96) == MOSAIC_NAMES  # zero-padded to 128, as the forward
  # Dropout: the kernels rebuild the (Triton) forward's keep mask from the same hash.
  assert _kernels("mosaic", causal=True, dropout_rate=0.1, dropout_seed=3) == MOSAIC_NAMES
  assert _kernels("triton", causal=True) == TRITON_NAMES
  # Out of scope: Triton, no error.
  for kw in (dict(alibi_slopes=jnp.ones(4)), dict(window=100), dict(kv_len=500),
             dict(dtype=jnp.float32), dict(causal=True, kv_len=1024), dict(interpret=True),
             dict(head_dim=256)):
    assert _kernels("mosaic", **kw) == TRITON_NAMES, kw


def test_auto_and_the_module_default_stay_on_triton(monkeypatch):
  """Not timed on a GPU yet: "auto" (the default) must not pick the Mosaic backward, even on
  Hopper, until a measured table says where it wins."""
  assert fa.GPU_BACKWARD == "auto"
  monkeypatch.setattr(fa, "_on_hopper", lambda: True)
  assert _kernels(None, causal=True) == TRITON_NAMES
  assert _kernels("auto", causal=True) == TRITON_NAMES
  monkeypatch.setattr(fa, "GPU_BACKWARD", "mosaic")
  assert _kernels(None, causal=True) == MOSAIC_NAMES


def test_forward_and_backward_choices_are_independent():
  q = jax.ShapeDtypeStruct((1, 512, 4, 64), jnp.bfloat16)
  loss = lambda *a: fa.flash_attention(*a, causal=True, interpret=False, gpu_forward="mosaic",
                                       gpu_backward="mosaic").astype(jnp.float32).sum()
  text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, q, q))
  names = set(re.findall(r"tfjax_flash_\w+", text))
  assert names == {"tfjax_flash_forward_mgpu"} | MOSAIC_NAMES


def test_unknown_gpu_backward_is_a_clear_error():
  with pytest.raises(ValueError, match=r"gpu_backward='cudnn' .*\('auto', 'triton', 'mosaic'\)"):
    _kernels("cudnn")


def test_direct_call_out_of_scope_is_a_clear_error():
  x = jnp.zeros((1, 128, 1, 96), jnp.bfloat16)
  with pytest.raises(ValueError, match="call flash_attention, which routes"):
    bwd.mosaic_backward(x, x, x, x, jnp.zeros((1, 1, 128)), x, causal=True, scale=1.0)
  x = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
  with pytest.raises(ValueError, match="needs dropout_keys_BxH.*head_keys"):
    bwd.mosaic_backward(x, x, x, x, jnp.zeros((1, 1, 128)), x, causal=True, scale=1.0,
                        dropout_rate=0.1)


def test_tuning_candidates_fit_the_swept_shapes():
  """experiments/tune_mosaic_bwd.py's candidates: valid tilings `supports` takes at every swept
  length (mosaic_backward raises for one `supports` refuses: that row would get no time)."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "experiments"))
  tune = importlib.import_module("tune_mosaic_bwd")
  assert sorted(tune.CANDIDATES) == sorted(bwd.MOSAIC_BWD_TILINGS)
  for head_dim, candidates in tune.CANDIDATES.items():
    assert bwd.MOSAIC_BWD_TILINGS[head_dim] in candidates  # the default is among them
    for length in (1024, 4096, 16384):
      shape, _ = tune.shapes(length, head_dim)
      for tilings in candidates:
        assert bwd.supports(shape, shape, jnp.bfloat16, causal=True, has_segments=False,
                            has_alibi=False, window=None, tilings=tilings), (shape, tilings)


# ---- Run by Mosaic GPU's interpreter on CPU ----------------------------------------------------


def reference_attention(q, k, v, causal, dropout_rate=0.0, seed=0):
  """Plain softmax attention in fp32 (GQA by repeating K/V), the weights dropped with the keep
  mask of tfjax.nn.dropout_hash (checked against NumPy in test_dropout.py): output and the
  natural-log lse of the logits."""
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  batch, q_len, heads, _ = q.shape
  groups = heads // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
  if causal:
    logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
  weights = jax.nn.softmax(logits, axis=-1)
  if dropout_rate:
    keep = dropout_hash.keep_mask(seed, batch, heads, q_len, k.shape[1], dropout_rate)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
  return out, jax.nn.logsumexp(logits, axis=-1)


def check_interpreted(seed, batch, length, heads, kv_heads, head_dim, causal,
                      detect_races=False, dropout_rate=0.0):
  # Private path (the same in jax 0.10 and 0.11): jax.experimental exports no GPU interpret params.
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # pylint: disable=import-outside-toplevel
  keys = jax.random.split(jax.random.key(seed), 4)
  draw = lambda key, h: jax.random.normal(key, (batch, length, h, head_dim), jnp.bfloat16)
  q, k, v, d_out = draw(keys[0], heads), draw(keys[1], kv_heads), draw(keys[2], kv_heads), draw(
      keys[3], heads)
  attend = lambda *a: reference_attention(*a, causal, dropout_rate, seed)
  out, lse = attend(q, k, v)
  _, vjp = jax.vjp(lambda *a: attend(*a)[0], q, k, v)
  expected = vjp(d_out.astype(jnp.float32))
  grads = bwd.mosaic_backward(q, k, v, out.astype(jnp.bfloat16), lse, d_out, causal=causal,
                              scale=head_dim ** -0.5, dropout_rate=dropout_rate,
                              dropout_keys_BxH=dropout_hash.head_keys(seed, batch, heads),
                              interpret=InterpretGPUParams(detect_races=detect_races))
  case = (seed, batch, length, heads, kv_heads, head_dim, causal, dropout_rate)
  for name, got, want, x in zip(("dq", "dk", "dv"), grads, expected, (q, k, v)):
    assert got.shape == x.shape and got.dtype == jnp.bfloat16, (name, case)
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    # bf16 operands of every product (P, dS) and the bf16 output: ~1% of the largest entry.
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1.5e-2, f"{name} {case}: max error {err:.4f} of the largest entry"


def test_interpreted_causal_gqa_matches_jax_grad():
  """The default run's case (~10 s interpreted): one dK/dV program whose two consumers cross the
  diagonal differently, over both query heads of the group; two dQ programs with masked and
  unmasked key blocks."""
  check_interpreted(0, 1, 256, 2, 1, 64, causal=True)


def test_interpreted_dropout_matches_jax_grad():
  """Dropout (rate 0.3): both kernels rebuild the forward's keep mask from the hash; GQA heads
  of a group get different masks."""
  check_interpreted(7, 1, 128, 2, 1, 64, causal=False, dropout_rate=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("case, rate", [((8, 1, 256, 4, 2, 128, True), 0.1),
                                        ((9, 2, 384, 2, 2, 64, True), 0.5)])
def test_interpreted_dropout_causal_matches_jax_grad(case, rate):
  check_interpreted(*case, dropout_rate=rate)


@pytest.mark.slow
@pytest.mark.parametrize("case", [(1, 1, 128, 1, 1, 64, False),
                                  (2, 2, 384, 2, 1, 64, True),  # 6 query blocks round 3 slots
                                  (3, 1, 256, 4, 2, 128, True),  # D 128, GQA, 2-slot rings
                                  (4, 1, 256, 2, 2, 128, False)])
def test_interpreted_matches_jax_grad(case):
  check_interpreted(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [(5, 1, 384, 2, 1, 64, True),  # 3-slot rings wrap around
                                  (6, 1, 256, 2, 2, 128, False)])  # 2-slot rings
def test_interpreted_kernels_have_no_races(case, capfd):
  """The interpreter's happens-before race detector over the TMA copies, the consumers' reads
  and the barriers (it prints RACE DETECTED per race, in either kernel)."""
  check_interpreted(*case, detect_races=True)
  assert "RACE DETECTED" not in capfd.readouterr().out


# ---- Compile for H100 from this CPU (the CUDA plugin) ------------------------------------------


def check_compiles_for_h100(dump_dir):
  """Both kernels, through flash_attention(gpu_backward='mosaic'), compile for H100; Mosaic GPU
  writes each kernel's MLIR and ptxas log to `dump_dir` (MOSAIC_GPU_DUMP_* in the env). With
  dropout the backward is Mosaic's and the forward too, but at D 128 (Triton's there)."""
  del dump_dir  # written by Mosaic GPU itself
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(targets.parse_target("h100"))),
                            ("x",)), PartitionSpec())
  for head_dim, causal, heads, kv_heads, rate in [(64, True, 8, 2, 0.0), (128, False, 4, 4, 0.0),
                                                  (128, True, 8, 2, 0.0), (64, True, 8, 2, 0.1),
                                                  (128, True, 8, 2, 0.1)]:
    shape = lambda h: jax.ShapeDtypeStruct((2, 1024, h, head_dim), jnp.bfloat16, sharding=spec)
    seed = jax.ShapeDtypeStruct((), jnp.int32, sharding=spec)
    loss = lambda q, k, v, seed: fa.flash_attention(
        q, k, v, causal=causal, interpret=False, gpu_forward="mosaic", gpu_backward="mosaic",
        dropout_rate=rate, dropout_seed=seed).astype(jnp.float32).sum()
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        shape(heads), shape(kv_heads), shape(kv_heads), seed).lower(lowering_platforms=("cuda",))
    text = lowered.compile().as_text()
    case = (head_dim, causal, rate)
    # the Mosaic forward (Triton's with dropout at D 128: the Mosaic one spills there), dK/dV, dQ
    triton_forward = bool(rate) and head_dim == 128
    assert text.count('custom_call_target="mosaic_gpu') == 3 - triton_forward, case
    assert ("tfjax_flash_forward\"" in text) == triton_forward, case
    assert "tfjax_flash_dkdv\"" not in text and "tfjax_flash_dq\"" not in text, case


def kernel_resources(dump_dir):
  """{kernel dump name: (dynamic shared memory bytes, spill bytes)} from Mosaic GPU's dumps."""
  found = {}
  for path in glob.glob(os.path.join(dump_dir, "tfjax_flash_*_mgpu_*.ptxas")):
    stem = path[:-len(".ptxas")]
    with open(path) as f:
      spills = sum(map(int, re.findall(r"(\d+) bytes spill (?:stores|loads)", f.read())))
    with open(stem + ".mlir-passes.log") as f:
      shared = int(re.search(r"dynamic_shared_memory_size %c(\d+)_i32", f.read()).group(1))
    found[os.path.basename(stem)] = (shared, spills)
  return found


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_mosaic_backward_compiles_for_h100():
  repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
  code = ("import importlib.util, sys; sys.path[:0] = ['tests', 'tests/nn/kernels']; "
          "spec = importlib.util.spec_from_file_location('t', "
          f"{os.path.abspath(__file__)!r}); m = importlib.util.module_from_spec(spec); "
          "spec.loader.exec_module(m); m.check_compiles_for_h100(sys.argv[1])")
  # Keep the caller's PYTHONPATH after the repo: the CUDA plugin may be installed with --target.
  path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
  with tempfile.TemporaryDirectory() as dump:
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu", MOSAIC_GPU_DUMP_TO=dump,
               MOSAIC_GPU_DUMP_PTXAS="1")
    result = subprocess.run([sys.executable, "-c", code, dump], cwd=repo, capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    found = kernel_resources(dump)
  names = {re.sub(r"_\d+$", "", name) for name in found}
  assert names >= MOSAIC_NAMES | {"tfjax_flash_forward_mgpu"}, found
  for name, (shared, spills) in sorted(found.items()):
    print(f"{name}: {shared} B shared memory, {spills} B spilled")
    assert 0 < shared <= H100_SHARED_BYTES and spills <= 1024, (name, shared, spills)


# ---- On a Hopper GPU (not run in this session: no GPU) -----------------------------------------

on_hopper = pytest.mark.skipif(
    jax.default_backend() != "gpu" or "H100" not in jax.devices()[0].device_kind and
    "H200" not in jax.devices()[0].device_kind, reason="needs an H100 / H200 GPU")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("case", [(0, 2, 256, 4, 4, 64, True), (1, 1, 512, 8, 2, 128, True),
                                  (2, 2, 1024, 4, 4, 128, False), (3, 1, 2048, 8, 2, 64, False),
                                  (4, 1, 2048, 4, 4, 128, True), (5, 2, 768, 8, 4, 64, True)],
                         ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("gpu_forward", ["triton", "mosaic"])
def test_gpu_mosaic_backward_matches_xla(case, gpu_forward):
  """dq, dk, dv through flash_attention with the Mosaic backward against xla attention, after
  either forward (the backward reads their out and lse)."""
  from test_kernels import assert_close, random_qkv, value_and_grads  # pylint: disable=import-outside-toplevel
  from tfjax.nn import ops  # pylint: disable=import-outside-toplevel
  seed, batch, length, heads, kv_heads, head_dim, causal = case
  q, k, v, d_out = random_qkv(seed, batch, length, length, heads, kv_heads, head_dim,
                              jnp.bfloat16)
  assert _kernels("mosaic", q_len=length, kv_len=length, heads=heads, kv_heads=kv_heads,
                  head_dim=head_dim, causal=causal) == MOSAIC_NAMES
  ours = lambda *a, **kw: fa.flash_attention(*a, gpu_forward=gpu_forward, gpu_backward="mosaic",
                                             **kw)
  out, grads = value_and_grads(ours, q, k, v, d_out, dict(causal=causal))
  ref_out, ref_grads = value_and_grads(ops.dot_product_attention, q, k, v, d_out,
                                       dict(causal=causal))
  assert_close(out, ref_out, 1.5e-2, f"out {case}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 2e-2, f"d{name} {case}")
