"""Attention dropout inside the Pallas kernels (tfjax/nn/dropout_hash.py), on CPU in interpret mode.

The keep mask is a counter-based hash of (seed, batch, head, query, key), so the kernels'
backward regenerates the forward's mask and 'xla' given the same seed drops the same weights.
Checked here: the mask (of the hash module and as the Triton and Mosaic TPU kernels apply it)
equals the hash written again in NumPy below; its keep rate is 1 - rate within binomial error;
kernel outputs and gradients equal xla's with the same dropout key and a NumPy forward; the
gradients pass a finite-difference check.
"""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax import test_util as jtu

from tfjax.nn import dropout_hash, ops
from tfjax.nn.kernels.flash_attention import KernelTiling, Tilings, flash_attention
from tfjax.nn.kernels.flash_attention_tpu import TpuTiling, TpuTilings, flash_attention_tpu

from test_kernels import assert_close, random_qkv, value_and_grads

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

TRITON = functools.partial(flash_attention, tilings=Tilings(KernelTiling(16, 32),
                                                            KernelTiling(32, 16)), interpret=True)
TPU = functools.partial(flash_attention_tpu, tilings=TpuTilings(TpuTiling(16, 128),
                                                                TpuTiling(8, 128)), interpret=True)
KERNELS = {"triton": TRITON, "tpu": TPU}


# ------------------------------------------------------------------------------------------------
# The hash, written again in NumPy uint32 (MurmurHash3 fmix32 and the module's documented formula)
# ------------------------------------------------------------------------------------------------
def np_fmix32(x):
  x = x ^ (x >> np.uint32(16))
  x = x * np.uint32(0x85EBCA6B)
  x = x ^ (x >> np.uint32(13))
  x = x * np.uint32(0xC2B2AE35)
  return x ^ (x >> np.uint32(16))


def np_keep(seed, batch, heads, q_len, kv_len, rate):
  """bool [B, H, T, S]: keep iff top 24 bits of the hash < round((1 - rate) * 2^24)."""
  u = lambda n, axis: np.arange(n, dtype=np.uint32).reshape(
      [n if a == axis else 1 for a in range(4)])
  with np.errstate(over="ignore"):
    key = np_fmix32(np_fmix32(np.uint32(seed) ^ (u(batch, 0) * np.uint32(0x9E3779B1)))
                    ^ (u(heads, 1) * np.uint32(0x85EBCA77)))
    row = np_fmix32(key ^ (u(q_len, 2) * np.uint32(0xC2B2AE3D)))
    bits = np_fmix32(row ^ (u(kv_len, 3) * np.uint32(0x27D4EB2F)))
  return (bits >> np.uint32(8)) < np.uint32(round((1 - rate) * 2 ** 24))


def np_softmax_weights(q, k, causal):
  """float64 softmax weights [B, H, T, S] (K/V heads repeated per group, end-aligned causal)."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
  s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
  if causal:
    T, S = q.shape[1], k.shape[1]
    s = np.where(np.arange(T)[:, None] + S - T >= np.arange(S)[None, :], s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 12345, 2 ** 32 - 5])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_hash_mask_equals_numpy(seed, rate):
  want = np_keep(seed, 2, 3, 17, 33, rate)
  np.testing.assert_array_equal(np.asarray(dropout_hash.keep_mask(seed, 2, 3, 17, 33, rate)), want)
  # A uint32 seed array (what seed_from_key's bits are) gives the same mask as the Python int.
  as_uint32 = jnp.asarray(np.uint32(seed))
  np.testing.assert_array_equal(
      np.asarray(dropout_hash.keep_mask(as_uint32, 2, 3, 17, 33, rate)), want)


def test_seed_from_key_is_the_keys_32_random_bits():
  key = jax.random.key(3)
  want = np.uint32(jax.random.bits(key, (), jnp.uint32))
  got = np.asarray(dropout_hash.seed_from_key(key)).astype(np.int64) % 2 ** 32
  assert got == want


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.9])
def test_keep_rate_is_one_minus_rate_within_binomial_error(rate):
  keep = np.asarray(dropout_hash.keep_mask(7, 2, 4, 256, 256, rate))
  n, p = keep.size, 1 - rate
  sigma = np.sqrt(p * (1 - p) / n)
  assert abs(keep.mean() - p) < 5 * sigma, (keep.mean(), p, sigma)
  # Each (batch, head) and each query row draws its own mask: two heads agree at the rate of
  # independent draws, p^2 + (1-p)^2, and rows are not copies of each other.
  agree = np.mean(keep[0, 0] == keep[1, 3])
  p_agree, m = p * p + (1 - p) * (1 - p), keep[0, 0].size
  assert abs(agree - p_agree) < 5 * np.sqrt(p_agree * (1 - p_agree) / m)
  assert not np.array_equal(keep[0, 0, 0], keep[0, 0, 1])


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_applies_the_numpy_mask(name):
  # v[b, s, :, :] = e_s: each output row is its dropped, rescaled weight row, so the kernel's mask
  # is where the output is nonzero (every weight is > 0 without causal masking).
  B, T, S, H, K, rate, seed = 2, 24, 16, 4, 2, 0.4, 99
  q, k, _, _ = random_qkv(0, batch=B, q_len=T, kv_len=S, heads=H, kv_heads=K, head_dim=S)
  v = jnp.broadcast_to(jnp.eye(S, dtype=jnp.float32)[None, :, None, :], (B, S, K, S))
  out = np.asarray(KERNELS[name](q, k, v, dropout_rate=rate, dropout_seed=seed))
  out_BxHxTxS = out.transpose(0, 2, 1, 3)
  keep = np_keep(seed, B, H, T, S, rate)
  np.testing.assert_array_equal(out_BxHxTxS != 0, keep)
  want = np.where(keep, np_softmax_weights(q, k, causal=False) / (1 - rate), 0.0)
  assert_close(out_BxHxTxS, want, 2e-5, f"{name} dropped weights")


def _cases():
  # (name, shapes, kw): causal GQA with padded lengths; window + ALiBi + packed segments.
  ids = np.array([[1] * 20 + [2] * 17])
  return [
      ("triton", dict(batch=2, q_len=37, kv_len=53, heads=4, kv_heads=2, head_dim=16),
       dict(causal=True)),
      ("triton", dict(batch=1, q_len=37, kv_len=37, heads=2, kv_heads=2, head_dim=16),
       dict(window=9, alibi_slopes=np.array([0.5, 0.1]), q_segment_ids=ids, kv_segment_ids=ids)),
      ("tpu", dict(batch=1, q_len=20, kv_len=140, heads=2, kv_heads=1, head_dim=32),
       dict(causal=True)),
  ]


@pytest.mark.parametrize("name, shapes, kw", _cases())
def test_kernel_equals_xla_with_the_same_key(name, shapes, kw):
  q, k, v, d_out = random_qkv(1, **shapes)
  rng, rate = jax.random.key(5), 0.3
  xla = functools.partial(ops.dot_product_attention, implementation="xla", dropout_rate=rate,
                          dropout_rng=rng)
  kernel = functools.partial(KERNELS[name], dropout_rate=rate,
                             dropout_seed=dropout_hash.seed_from_key(rng))
  out, grads = value_and_grads(kernel, q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(xla, q, k, v, d_out, kw)
  assert_close(out, ref_out, 2e-5, f"{name} out vs xla")
  for what, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 1e-4, f"{name} d{what} vs xla", 1e-2)
  assert np.mean(out == 0) < 0.5  # dropout acted on weights, not on whole rows
  if set(kw) == {"causal"}:  # and xla (so the kernel) against NumPy with the NumPy mask
    B, T, H, _ = q.shape
    S = k.shape[1]
    w = np_softmax_weights(q, k, causal=True)
    w = np.where(np_keep(np.asarray(dropout_hash.seed_from_key(rng)).astype(np.int64) % 2 ** 32,
                         B, H, T, S, rate), w / (1 - rate), 0.0)
    v_rep = np.repeat(np.asarray(v, np.float64), H // v.shape[2], axis=2)
    assert_close(out, np.einsum("bhts,bshd->bthd", w, v_rep), 2e-5, f"{name} out vs numpy")


def test_pallas_through_ops_equals_xla_with_the_same_key():
  q, k, v, d_out = random_qkv(2, batch=1, q_len=24, kv_len=24, heads=2, kv_heads=1, head_dim=16)
  kw = dict(causal=True, dropout_rate=0.2, dropout_rng=jax.random.key(1))
  impl = lambda name: functools.partial(ops.dot_product_attention, implementation=name)
  out, grads = value_and_grads(impl("pallas"), q, k, v, d_out, kw)
  ref_out, ref_grads = value_and_grads(impl("xla"), q, k, v, d_out, kw)
  assert_close(out, ref_out, 2e-5, "pallas out vs xla")
  for what, g, ref in zip("qkv", grads, ref_grads):
    assert_close(g, ref, 1e-4, f"pallas d{what} vs xla", 1e-2)


def test_triton_gradients_pass_a_finite_difference_check():
  q, k, v, _ = random_qkv(3, batch=1, q_len=16, kv_len=20, heads=2, kv_heads=1, head_dim=16)
  fn = lambda q, k, v: TRITON(q, k, v, causal=True, dropout_rate=0.25, dropout_seed=4)
  jtu.check_grads(fn, (q, k, v), order=1, modes=("rev",), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_dropout_arguments_are_checked():
  q, k, v, _ = random_qkv(0, batch=1, q_len=8, kv_len=8, heads=1, kv_heads=1, head_dim=16)
  for kernel in KERNELS.values():
    with pytest.raises(ValueError, match="needs a dropout_seed"):
      kernel(q, k, v, dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
      kernel(q, k, v, dropout_rate=1.0, dropout_seed=0)
  with pytest.raises(ValueError, match="'xla' or 'pallas'"):
    ops.dot_product_attention(q, k, v, implementation="chunked", dropout_rate=0.1,
                              dropout_rng=jax.random.key(0))
  with pytest.raises(ValueError, match="32-bit integer scalar"):
    dropout_hash.keep_mask(jnp.zeros((2,), jnp.int32), 1, 1, 2, 2, 0.1)


@pytest.mark.parametrize("dtype,head_dim", [(jnp.bfloat16, 64), (jnp.bfloat16, 128),
                                            (jnp.float32, 128)])
def test_triton_dropout_lowers_for_cuda(dtype, head_dim):
  """Forward + backward with dropout lower to the Triton kernels for CUDA with the default GPU
  tilings (no GPU needed: catches a hash op Triton cannot lower). gpu_forward='mosaic' takes the
  Mosaic GPU forward (with dropout) for bf16 at D 64, Triton's for fp32 and at D 128 (where the
  Mosaic one spills; test_flash_attention_mgpu checks the route and runs it interpreted)."""
  def loss(q, k, v, seed):
    out = flash_attention(q, k, v, causal=True, interpret=False, gpu_forward="mosaic",
                          dropout_rate=0.1, dropout_seed=seed)
    return jnp.sum(out.astype(jnp.float32))

  spec = jax.ShapeDtypeStruct
  exported = export.export(
      jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(
          spec((2, 256, 8, head_dim), dtype), spec((2, 256, 2, head_dim), dtype),
          spec((2, 256, 2, head_dim), dtype), spec((), jnp.int32))
  text, mosaic = exported.mlir_module(), dtype == jnp.bfloat16 and head_dim == 64
  assert text.count("__gpu$xla.gpu.triton") == (2 if mosaic else 3)  # (fwd,) dk/dv, dq
  assert ("tfjax_flash_forward_mgpu" in text) == mosaic


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None or jax.default_backend() != "cpu",
                    reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")
def test_auto_with_dropout_lowered_for_tpu_carries_the_mosaic_kernels():
  """A CPU host lowering a dropout program for TPU (tfjax.aot) gets the Mosaic kernels, not xla:
  dropout no longer keeps 'auto' off them."""
  q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
  loss = lambda q, k, v, key: jnp.sum(ops.dot_product_attention(
      q, k, v, causal=True, implementation="auto", dropout_rate=0.1,
      dropout_rng=key).astype(jnp.float32))
  key = jax.eval_shape(lambda: jax.random.key(0))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, q, q, key).lower(
      lowering_platforms=("tpu",))
  assert lowered.as_text().count("tpu_custom_call") == 3  # forward, dK/dV, dQ
