"""The Mosaic GPU flash-attention forward (tfjax/nn/kernels/flash_attention_mgpu.py).

Here (CPU): which calls reach it (`gpu_forward` routing, traced, not run); the kernel run by
Mosaic GPU's interpreter (its warpgroups, TMA ring, barriers, causal and window blocks, segment
ids, ALiBi, dropout and lse, with plain dots standing in for wgmma) against NumPy and xla; with
the CUDA plugin, that it lowers and compiles for H100 forward and backward, plain and masked
(`aot_gpu`). On a Hopper GPU (`gpu`): output, log-sum-exp and gradients through the shared
custom VJP against xla / an fp32 reference in bf16, over seeds, shapes, masks, ALiBi, dropout.
"""
import importlib
import importlib.util
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_kernels import assert_close, numpy_attention, random_qkv, value_and_grads
from tfjax.nn import dropout_hash, ops
from tfjax.nn.kernels import flash_attention_mgpu as mgpu

# The module (tfjax.nn.kernels re-exports its function under the same name).
fa = importlib.import_module("tfjax.nn.kernels.flash_attention")
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_cuda12_plugin") is not None
MOSAIC_NAME, TRITON_FORWARD_NAME = "tfjax_flash_forward_mgpu", "tfjax_flash_forward"


@pytest.mark.parametrize("q_shape, kv_shape, dtype, kw, expected", [
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=True), True),
    ((2, 1024, 8, 64), (2, 2048, 2, 64), jnp.bfloat16, dict(causal=False), True),  # GQA, cross
    ((2, 1024, 8, 64), (2, 2048, 2, 64), jnp.bfloat16, dict(causal=True), False),  # offset
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.float32, dict(causal=True), False),
    ((2, 1024, 8, 256), (2, 1024, 8, 256), jnp.bfloat16, dict(causal=True), False),
    ((2, 1024, 6, 128), (2, 1024, 4, 128), jnp.bfloat16, dict(causal=False), False),  # 4 !| 6
    ((2, 192, 8, 128), (2, 192, 8, 128), jnp.bfloat16, dict(causal=False), False),  # 192 % 128
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=True, has_alibi=True),
     True),
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=True, has_segments=True),
     True),
    ((2, 1024, 8, 64), (2, 1024, 2, 64), jnp.bfloat16, dict(causal=True, window=256), True),
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=False, window=256), False),
    # Dropout: in scope at D 64; at D 128 ptxas spills 1,312 B (sm_90a), so Triton's.
    ((2, 1024, 8, 64), (2, 1024, 8, 64), jnp.bfloat16, dict(causal=True, dropout=True), True),
    ((2, 1024, 8, 128), (2, 1024, 8, 128), jnp.bfloat16, dict(causal=True, dropout=True), False),
])
def test_supports_is_the_documented_scope(q_shape, kv_shape, dtype, kw, expected):
  kw = dict(dict(has_segments=False, has_alibi=False, window=None), **kw)
  assert mgpu.supports(q_shape, kv_shape, dtype, **kw) is expected


def _forward_kernels(gpu_forward, q_len=512, kv_len=512, heads=4, kv_heads=4, head_dim=64,
                     dtype=jnp.bfloat16, interpret=False, grad=False, **kw):
  """The names of the forward kernels in the traced program (tracing only: nothing runs)."""
  q = jax.ShapeDtypeStruct((1, q_len, heads, head_dim), dtype)
  kv = jax.ShapeDtypeStruct((1, kv_len, kv_heads, head_dim), dtype)
  attend = lambda q, k, v: fa.flash_attention(q, k, v, interpret=interpret,
                                              gpu_forward=gpu_forward, **kw)
  fn = attend
  if grad:
    fn = jax.grad(lambda *a: attend(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
  names = set(re.findall(r"tfjax_flash_\w+", str(jax.make_jaxpr(fn)(q, kv, kv))))
  return names & {MOSAIC_NAME, TRITON_FORWARD_NAME, "tfjax_flash_dkdv"}


def test_gpu_forward_routes_to_mosaic_only_where_it_applies():
  assert _forward_kernels("mosaic", causal=True) == {MOSAIC_NAME}
  assert _forward_kernels("mosaic", kv_heads=2, kv_len=1024) == {MOSAIC_NAME}  # GQA, cross
  assert _forward_kernels("triton", causal=True) == {TRITON_FORWARD_NAME}
  assert _forward_kernels(None, causal=True) == {TRITON_FORWARD_NAME}  # GPU_FORWARD default
  # Masks, ALiBi, padding (kv_len 500 -> 512 with the padded keys' ids 0), dropout: Mosaic.
  ids = jnp.ones((1, 512), jnp.int32)
  for kw in (dict(alibi_slopes=jnp.ones(4)), dict(window=100), dict(kv_len=500),
             dict(causal=True, q_segment_ids=ids, kv_segment_ids=ids, kv_heads=2),
             dict(causal=True, dropout_rate=0.1, dropout_seed=0)):
    assert _forward_kernels("mosaic", **kw) == {MOSAIC_NAME}, kw
  # Out of scope: Triton, no error.
  for kw in (dict(dtype=jnp.float32), dict(causal=True, kv_len=1024), dict(interpret=True),
             dict(q_len=64, kv_len=64), dict(head_dim=256),
             dict(head_dim=128, dropout_rate=0.1, dropout_seed=0)):
    assert _forward_kernels("mosaic", **kw) == {TRITON_FORWARD_NAME}, kw
  # The Mosaic forward's (out, lse) feed the Triton backward of the same custom VJP.
  assert _forward_kernels("mosaic", causal=True, grad=True) == {MOSAIC_NAME, "tfjax_flash_dkdv"}


def test_module_setting_selects_the_forward(monkeypatch):
  monkeypatch.setattr(fa, "GPU_FORWARD", "mosaic")
  assert _forward_kernels(None) == {MOSAIC_NAME}


def test_auto_takes_mosaic_on_hopper_only(monkeypatch):
  assert fa.GPU_FORWARD == "auto"
  monkeypatch.setattr(fa, "_on_hopper", lambda: False)
  assert _forward_kernels("auto", causal=True) == {TRITON_FORWARD_NAME}
  monkeypatch.setattr(fa, "_on_hopper", lambda: True)
  assert _forward_kernels("auto", causal=True) == {MOSAIC_NAME}
  # Masks, ALiBi and dropout in the Mosaic forward were never timed on a GPU: 'auto' keeps them
  # on Triton ('mosaic' opts in, above).
  ids = jnp.ones((1, 512), jnp.int32)
  for kw in (dict(alibi_slopes=jnp.ones(4)), dict(dropout_rate=0.1, dropout_seed=3),
             dict(window=100), dict(q_segment_ids=ids, kv_segment_ids=ids)):
    assert _forward_kernels("auto", **kw) == {TRITON_FORWARD_NAME}, kw
  assert _forward_kernels("auto", dtype=jnp.float16) == {TRITON_FORWARD_NAME}


def test_unknown_gpu_forward_is_a_clear_error():
  with pytest.raises(ValueError, match=r"gpu_forward='cutlass' .*\('auto', 'triton', 'mosaic'\)"):
    _forward_kernels("cutlass")


# ---- Run by Mosaic GPU's interpreter on CPU ----------------------------------------------------


def numpy_lse(q, k, *, causal, window=None, q_segment_ids=None, kv_segment_ids=None,
              alibi_slopes=None):
  """Natural-log log-sum-exp of the scaled, ALiBi-biased visible logits, [B, H, T], in float64
  (end-aligned positions, as numpy_attention); +inf for a row that sees no key, as the kernels
  store it."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  q_len, kv_len = q.shape[1], k.shape[1]
  k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
  rel = np.arange(q_len)[:, None] + kv_len - q_len - np.arange(kv_len)[None, :]  # i - j
  if alibi_slopes is not None:
    slopes = np.broadcast_to(np.asarray(alibi_slopes, np.float64), logits.shape[:2])
    logits = logits - slopes[:, :, None, None] * np.abs(rel)
  visible = np.ones(logits.shape, bool)
  if causal or window is not None:
    visible &= rel >= 0
  if window is not None:
    visible &= rel < window
  if q_segment_ids is not None:
    q_ids = np.asarray(q_segment_ids)[:, None, :, None]
    kv_ids = np.asarray(kv_segment_ids)[:, None, None, :]
    visible &= (q_ids == kv_ids) & (kv_ids != 0)
  logits = np.where(visible, logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  seen = np.isfinite(top[..., 0])
  top = np.where(np.isfinite(top), top, 0.0)
  with np.errstate(divide="ignore"):
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
  return np.where(seen, lse, np.inf)


# Small tiles (64 x 64 blocks, 2 slots), so that short sequences span several key blocks and
# programs: each interpreted program step costs about a second on a shared CPU.
SMALL = mgpu.MosaicTiling(block_q=64, block_kv=64, stages=2)


def run_interpreted(q, k, v, **kw):
  # Private path (the same in jax 0.10 and 0.11): jax.experimental exports no GPU interpret params.
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # pylint: disable=import-outside-toplevel
  return mgpu.mosaic_forward(q, k, v, scale=q.shape[-1] ** -0.5, interpret=InterpretGPUParams(),
                             **kw)


def check_interpreted(seed, length, heads, kv_heads, head_dim, causal, kv_length=None,
                      tiling=None, **masks):
  """The interpreted kernel's output and lse against NumPy; `masks`: window, q/kv_segment_ids
  [1, L] and alibi_slopes [H] as numpy_attention takes them."""
  kv_length = kv_length or length
  q, k, v, d_out = random_qkv(seed, 1, length, kv_length, heads, kv_heads, head_dim,
                              jnp.bfloat16)
  kernel_masks = dict(masks)
  if "alibi_slopes" in masks:  # the kernel takes [B, H]
    kernel_masks["alibi_slopes"] = np.asarray(masks["alibi_slopes"], np.float32)[None]
  out, lse = run_interpreted(q, k, v, causal=causal, tiling=tiling, **kernel_masks)
  f32 = lambda x: np.asarray(x, np.float32)
  np_out, _ = numpy_attention(f32(q), f32(k), f32(v), d_out, causal=causal, **masks)
  case = (seed, length, kv_length, heads, kv_heads, head_dim, causal, sorted(masks))
  assert out.dtype == jnp.bfloat16 and lse.shape == (1, heads, length), case
  assert_close(f32(out), np_out, 1e-2, f"out {case}")  # bf16 P and output rounding
  np.testing.assert_allclose(f32(lse), numpy_lse(f32(q), f32(k), causal=causal, **masks),
                             atol=1e-4, rtol=0, err_msg=f"lse {case}")
  return out, lse


def test_interpreted_causal_diagonal_block_matches_numpy():
  """One program (the default run's budget): its one key block straddles the diagonal."""
  check_interpreted(0, 128, 1, 1, 64, causal=True)


def test_interpreted_window_skips_blocks_and_matches_numpy():
  # L 256 in 64-key blocks, window 40: the second program's rows 128..255 see keys from 89, so
  # it starts at block 1 (skipping block 0) and masks every block it runs.
  cfg = lambda window: mgpu._blocks.BlockConfig(scale=1.0, causal=True, window=window, offset=0,
                                                groups=1, has_segments=False, has_alibi=False)
  assert [int(x) for x in mgpu._kv_range(cfg(40), 1, SMALL, 256)] == [1, 4, 4, 4]
  assert [int(x) for x in mgpu._kv_range(cfg(None), 1, SMALL, 256)] == [0, 4, 0, 2]
  check_interpreted(0, 256, 1, 1, 64, causal=True, window=40, tiling=SMALL)


def test_interpreted_segments_and_padding_match_numpy():
  """Packed segments with padded (id 0) tail rows and keys: those rows are 0 with lse +inf."""
  ids = np.array([[1] * 50 + [2] * 60 + [3] * 10 + [0] * 8])
  out, lse = check_interpreted(1, 128, 1, 1, 64, causal=False, tiling=SMALL, q_segment_ids=ids,
                               kv_segment_ids=ids)
  assert np.all(np.asarray(out, np.float32)[0, 120:] == 0) and np.all(np.isinf(lse[0, :, 120:]))


def test_interpreted_alibi_cross_attention_matches_numpy():
  """Non-causal ALiBi with kv_len > q_len: the bias uses the end-aligned query positions."""
  check_interpreted(2, 128, 2, 1, 64, causal=False, kv_length=256, tiling=SMALL,
                    alibi_slopes=np.array([0.5, 0.0625]))


def test_interpreted_gqa_with_every_mask_matches_numpy():
  """GQA (2 query heads per kv head), causal ALiBi, a window and packed segments at once."""
  ids = np.array([[1] * 70 + [2] * 58])
  check_interpreted(3, 128, 2, 1, 64, causal=True, tiling=SMALL, window=48,
                    alibi_slopes=np.array([0.25, 0.03125]), q_segment_ids=ids,
                    kv_segment_ids=ids)


def test_interpreted_dropout_applies_the_numpy_mask():
  """v[s] = e_s makes each output row the dropped, rescaled weight row: the kernel's keep mask
  is where the output is nonzero, and it equals test_dropout's NumPy hash (GQA: per query
  head)."""
  from test_dropout import np_keep, np_softmax_weights  # pylint: disable=import-outside-toplevel
  heads, seq, rate, seed = 2, 64, 0.3, 1234
  q, k, _, _ = random_qkv(4, 1, 128, seq, heads, 1, seq, jnp.bfloat16)
  v = jnp.broadcast_to(jnp.eye(seq, dtype=jnp.bfloat16)[None, :, None, :], (1, seq, 1, seq))
  keys = dropout_hash.head_keys(seed, 1, heads)
  out, lse = run_interpreted(q, k, v, causal=False, tiling=SMALL, dropout_rate=rate,
                             dropout_keys=keys)
  out_BxHxTxS = np.asarray(out, np.float32).transpose(0, 2, 1, 3)
  keep = np_keep(seed, 1, heads, 128, seq, rate)
  np.testing.assert_array_equal(out_BxHxTxS != 0, keep)
  f32 = lambda x: np.asarray(x, np.float32)
  want = np.where(keep, np_softmax_weights(f32(q), f32(k), causal=False) / (1 - rate), 0.0)
  assert_close(out_BxHxTxS, want, 1e-2, "dropped weights")
  # lse is the undropped one (what the Triton backward regenerates p from)
  np.testing.assert_allclose(f32(lse), numpy_lse(f32(q), f32(k), causal=False), atol=1e-4)


def test_interpreted_dropout_equals_xla_with_the_same_key():
  """Causal, D 64, GQA, two key blocks: the output equals implementation='xla' given the same
  rate and rng."""
  q, k, v, _ = random_qkv(5, 1, 128, 128, 2, 1, 64, jnp.bfloat16)
  rng, rate = jax.random.key(7), 0.25
  keys = dropout_hash.head_keys(dropout_hash.seed_from_key(rng), 1, 2)
  out, _ = run_interpreted(q, k, v, causal=True, tiling=SMALL, dropout_rate=rate,
                           dropout_keys=keys)
  f32 = lambda x: x.astype(jnp.float32)
  ref = ops.dot_product_attention(f32(q), f32(k), f32(v), causal=True, implementation="xla",
                                  dropout_rate=rate, dropout_rng=rng)
  assert_close(np.asarray(out, np.float32), np.asarray(ref), 1e-2, "out vs xla")


def test_mosaic_forward_checks_its_arguments():
  q = jnp.zeros((1, 128, 1, 64), jnp.bfloat16)
  ids = jnp.ones((1, 128), jnp.int32)
  with pytest.raises(ValueError, match="q_segment_ids and kv_segment_ids together"):
    mgpu.mosaic_forward(q, q, q, causal=False, scale=1.0, q_segment_ids=ids)
  with pytest.raises(ValueError, match="needs dropout_keys"):
    mgpu.mosaic_forward(q, q, q, causal=False, scale=1.0, dropout_rate=0.1)
  with pytest.raises(ValueError, match="routes such inputs to the Triton forward"):
    mgpu.mosaic_forward(q, q, q, causal=False, scale=1.0, window=16)


@pytest.mark.slow
@pytest.mark.parametrize("case", [(4, 256, 1, 1, 64, True),  # an unmasked, then a masked block
                                  (1, 512, 1, 1, 64, True),  # 4 steps round a 3-slot ring
                                  (2, 512, 2, 1, 128, False),  # GQA, 4 steps in 2 slots
                                  (3, 256, 4, 2, 128, True)])  # GQA, causal
def test_interpreted_matches_numpy(case):
  seed, length, heads, kv_heads, head_dim, causal = case
  check_interpreted(seed, length, heads, kv_heads, head_dim, causal)


@pytest.mark.slow
def test_interpreted_masks_at_head_dim_128_default_tiles_match_numpy():
  """D 128 with its default tiles (128-key blocks, 2 slots): window, segments, ALiBi, GQA."""
  ids = np.array([[1] * 300 + [2] * 200 + [0] * 12])
  check_interpreted(6, 512, 2, 1, 128, causal=True, window=200, q_segment_ids=ids,
                    kv_segment_ids=ids, alibi_slopes=np.array([0.125, 0.5]))


# ---- Compile for H100 from this CPU (the CUDA plugin) ------------------------------------------


def check_lowers_for_h100():
  """Forward and forward + backward through flash_attention(gpu_forward='mosaic') compile for
  H100: the program holds the Mosaic GPU kernel and the Triton backward; plain, and with a
  window, ALiBi, segment ids (padding: kv_len 1000 -> 1024) and dropout."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(targets.parse_target("h100"))),
                            ("x",)), PartitionSpec())
  ids = jnp.asarray(np.repeat([[1, 2]], 512, axis=1).repeat(2, axis=0))
  masked = dict(window=256, alibi_slopes=jnp.linspace(0.05, 0.5, 8), dropout_rate=0.1,
                dropout_seed=3, q_segment_ids=ids, kv_segment_ids=ids)
  for head_dim, causal, heads, kv_heads, kw in [
      (64, True, 8, 2, {}), (128, False, 4, 4, {}), (128, True, 8, 8, {}),
      # Dropout at D 128 is Triton's (it spills in the Mosaic forward; supports says so).
      (64, True, 8, 2, masked),
      (128, True, 8, 4, {k: v for k, v in masked.items() if not k.startswith("dropout")}),
      (64, False, 8, 8, dict(alibi_slopes=jnp.ones(8), kv_len=1000, dropout_rate=0.2,
                             dropout_seed=1))]:
    kw = dict(kw)
    kv_len = kw.pop("kv_len", 1024)
    shape = lambda h, n=1024: jax.ShapeDtypeStruct((2, n, h, head_dim), jnp.bfloat16,
                                                   sharding=spec)
    attend = lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, interpret=False,
                                                gpu_forward="mosaic", **kw)
    loss = lambda *a: attend(*a).astype(jnp.float32).sum()
    for fn, backward in ((attend, False), (jax.grad(loss, argnums=(0, 1, 2)), True)):
      lowered = jax.jit(fn).trace(shape(heads), shape(kv_heads, kv_len),
                                  shape(kv_heads, kv_len)).lower(lowering_platforms=("cuda",))
      text = lowered.compile().as_text()
      case = (head_dim, causal, heads, kv_heads, sorted(kw), backward)
      assert text.count('custom_call_target="mosaic_gpu') == 1, case
      assert ("tfjax_flash_dkdv" in text) == backward and TRITON_FORWARD_NAME + '"' not in text, case


@pytest.mark.aot_gpu
@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs pip install '.[cuda-aot]'")
def test_mosaic_forward_compiles_for_h100():
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  code = ("import importlib.util, sys; sys.path[:0] = ['tests', 'tests/nn/kernels']; "
          "spec = importlib.util.spec_from_file_location('t', "
          f"{os.path.abspath(__file__)!r}); m = importlib.util.module_from_spec(spec); "
          "spec.loader.exec_module(m); m.check_lowers_for_h100()")
  result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [repo, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]),
                          JAX_PLATFORMS="cpu"), timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]


# ---- On a Hopper GPU ---------------------------------------------------------------------------

on_hopper = pytest.mark.skipif(
    jax.default_backend() != "gpu" or "H100" not in jax.devices()[0].device_kind and
    "H200" not in jax.devices()[0].device_kind, reason="needs an H100 / H200 GPU")

# (seed, batch, length, heads, kv_heads, head_dim, causal): L 256..2048, D 64/128, GQA.
GPU_CASES = [(0, 2, 256, 4, 4, 64, True), (1, 1, 512, 8, 2, 128, True),
             (2, 2, 1024, 4, 4, 128, False), (3, 1, 2048, 8, 2, 64, False),
             (4, 1, 2048, 4, 4, 128, True), (5, 2, 768, 8, 4, 64, True)]


def fp32_lse(q, k, *, causal):
  """Natural-log log-sum-exp of the scaled logits, [B, H, L], in fp32 from the bf16 inputs."""
  groups = q.shape[2] // k.shape[2]
  k = jnp.repeat(k.astype(jnp.float32), groups, axis=2)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k) * q.shape[-1] ** -0.5
  if causal:
    logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], bool)), logits, -jnp.inf)
  return jax.nn.logsumexp(logits, axis=-1)


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_mosaic_forward_out_and_lse(case):
  seed, batch, length, heads, kv_heads, head_dim, causal = case
  q, k, v, _ = random_qkv(seed, batch, length, length, heads, kv_heads, head_dim, jnp.bfloat16)
  out, lse = jax.jit(lambda q, k, v: mgpu.mosaic_forward(
      q, k, v, causal=causal, scale=head_dim ** -0.5))(q, k, v)
  ref = ops.dot_product_attention(q, k, v, causal=causal, implementation="xla")
  assert lse.shape == (batch, heads, length) and lse.dtype == jnp.float32
  assert_close(np.asarray(out, np.float32), np.asarray(ref, np.float32), 1.5e-2, f"out {case}")
  # The lse the Triton backward reads: rounding of bf16 matmul inputs only, so tight.
  np.testing.assert_allclose(np.asarray(lse), np.asarray(fp32_lse(q, k, causal=causal)),
                             atol=2e-2, rtol=0, err_msg=f"lse {case}")


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_mosaic_entry_matches_xla_with_gradients(case, monkeypatch):
  """Through tfjax.ops' 'pallas' entry with the Mosaic forward selected: out and dq, dk, dv."""
  seed, batch, length, heads, kv_heads, head_dim, causal = case
  monkeypatch.setattr(fa, "GPU_FORWARD", "mosaic")
  q, k, v, d_out = random_qkv(seed, batch, length, length, heads, kv_heads, head_dim,
                              jnp.bfloat16)
  pallas = lambda *a, **kw: ops.dot_product_attention(*a, implementation="pallas", **kw)
  assert _forward_kernels(None, q_len=length, kv_len=length, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, causal=causal) == {MOSAIC_NAME}
  out, grads = value_and_grads(pallas, q, k, v, d_out, dict(causal=causal))
  ref_out, ref_grads = value_and_grads(ops.dot_product_attention, q, k, v, d_out,
                                       dict(causal=causal))
  assert_close(out, ref_out, 1.5e-2, f"out {case}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 2e-2, f"d{name} {case}")


def _masked_gpu_cases():
  ids = np.repeat([[1, 2, 0]], [700, 300, 24], axis=1).repeat(2, axis=0)  # packed + padding
  return [(64, dict(causal=True, window=256)), (128, dict(causal=True, window=300)),
          (128, dict(causal=True, q_segment_ids=ids, kv_segment_ids=ids)),
          (64, dict(alibi_slopes=np.linspace(0.01, 0.3, 8))),
          (128, dict(causal=True, alibi_slopes=np.linspace(0.01, 0.3, 8), window=500)),
          (64, dict(causal=True, dropout_rate=0.1)), (128, dict(dropout_rate=0.2))]


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("head_dim, kw", _masked_gpu_cases())
def test_gpu_mosaic_masks_alibi_dropout_match_xla_with_gradients(head_dim, kw, monkeypatch):
  """The Mosaic forward with masks, ALiBi or dropout (GQA, L 1024) through the 'pallas' entry:
  out and dq, dk, dv against xla (with dropout: the same rng, so the same mask)."""
  monkeypatch.setattr(fa, "GPU_FORWARD", "mosaic")
  q, k, v, d_out = random_qkv(7, 2, 1024, 1024, 8, 2, head_dim, jnp.bfloat16)
  kw = dict(kw, dropout_rng=jax.random.key(3)) if "dropout_rate" in kw else kw
  pallas = lambda *a, **kw: ops.dot_product_attention(*a, implementation="pallas", **kw)
  out, grads = value_and_grads(pallas, q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(ops.dot_product_attention, q, k, v, d_out, kw)
  case = (head_dim, sorted(kw))
  assert_close(out, ref_out, 1.5e-2, f"out {case}")
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 2e-2, f"d{name} {case}")
