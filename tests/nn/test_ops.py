"""tfjax.nn.ops.dot_product_attention (xla) against a NumPy softmax(q k^T * scale + M) v written
here."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import ops

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


# ------------------------------------------------------------------------------------------------
# NumPy reference (float64, one query row at a time, K/V repeated per query group by NumPy itself)
# ------------------------------------------------------------------------------------------------
def np_visible(b, t, *, S, qp, kp, causal, window, q_seg, kv_seg):
  i, j = qp[b, t], kp[b]
  visible = np.ones(S, bool)
  if causal:
    visible &= j <= i
  if window is not None:
    visible &= (i - j >= 0) & (i - j < window)
  if q_seg is not None and kv_seg is not None:
    visible &= (kv_seg[b] == q_seg[b, t]) & (kv_seg[b] != 0)
  elif kv_seg is not None:
    visible &= kv_seg[b] != 0
  elif q_seg is not None:
    visible &= bool(q_seg[b, t] != 0)
  return visible


def np_attention(q, k, v, *, causal=False, q_segment_ids=None, kv_segment_ids=None, window=None,
                 alibi_slopes=None, bias=None, scale=None, q_positions=None, kv_positions=None):
  """Returns (out [B,T,H,D], weights [B,H,T,S]) in float64."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, T, H, D = q.shape
  S, K = k.shape[1], k.shape[2]
  k = np.repeat(k, H // K, axis=2)  # query head h reads kv head h // (H // K)
  v = np.repeat(v, H // K, axis=2)
  scale = 1.0 / np.sqrt(D) if scale is None else scale
  qp = np.broadcast_to(np.arange(T) + (S - T) if q_positions is None else q_positions, (B, T))
  kp = np.broadcast_to(np.arange(S) if kv_positions is None else kv_positions, (B, S))
  q_seg = None if q_segment_ids is None else np.asarray(q_segment_ids)
  kv_seg = None if kv_segment_ids is None else np.asarray(kv_segment_ids)
  slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
  full_bias = None if bias is None else np.broadcast_to(np.asarray(bias, np.float64), (B, H, T, S))
  out = np.zeros((B, T, H, D))
  weights = np.zeros((B, H, T, S))
  for b in range(B):
    for t in range(T):
      visible = np_visible(b, t, S=S, qp=qp, kp=kp, causal=causal, window=window, q_seg=q_seg,
                           kv_seg=kv_seg)
      if not visible.any():
        continue
      for h in range(H):
        logits = scale * (k[b, :, h] @ q[b, t, h])
        if slopes is not None:
          m = slopes[h] if slopes.ndim == 1 else slopes[b, h]
          logits = logits - m * np.abs(qp[b, t] - kp[b])
        if full_bias is not None:
          logits = logits + full_bias[b, h, t]
        z = logits[visible]
        p = np.exp(z - z.max())
        p /= p.sum()
        weights[b, h, t, visible] = p
        out[b, t, h] = p @ v[b, visible, h]
  return out, weights


def qkv(B=2, T=6, S=6, H=2, K=2, D=8, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, T, H, D)).astype(np.float32)
  k = rng.normal(size=(B, S, K, D)).astype(np.float32)
  v = rng.normal(size=(B, S, K, D)).astype(np.float32)
  return q, k, v


_RNG = np.random.default_rng(7)
PAD = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
PACKED = np.array([[1, 1, 2, 2, 2, 3], [1, 1, 1, 2, 2, 0]], np.int32)
SLOPES4 = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)

# name -> (shape overrides for qkv, attention kwargs)
CASES = {
    "plain": ({}, {}),
    "causal": ({}, dict(causal=True)),
    "padding_bidirectional": ({}, dict(q_segment_ids=PAD, kv_segment_ids=PAD)),
    "padding_causal": ({}, dict(causal=True, q_segment_ids=PAD, kv_segment_ids=PAD)),
    "packed_causal": ({}, dict(causal=True, q_segment_ids=PACKED, kv_segment_ids=PACKED)),
    "packed_bidirectional": ({}, dict(q_segment_ids=PACKED, kv_segment_ids=PACKED)),
    "kv_ids_only": ({}, dict(kv_segment_ids=PAD)),
    "q_ids_only": ({}, dict(q_segment_ids=PAD)),
    "window3_causal": ({}, dict(causal=True, window=3)),
    "window2_alone_is_causal": ({}, dict(window=2)),
    "window1_self_only": ({}, dict(causal=True, window=1)),
    "alibi_causal": (dict(H=4, K=4), dict(causal=True, alibi_slopes=SLOPES4)),
    "alibi_bidirectional": (dict(H=4, K=4), dict(alibi_slopes=SLOPES4)),
    "alibi_per_batch_slopes": (dict(H=4, K=4), dict(
        causal=True, alibi_slopes=np.stack([SLOPES4, SLOPES4[::-1] * 3]))),
    "bias_full": ({}, dict(bias=_RNG.normal(size=(2, 2, 6, 6)).astype(np.float32))),
    "bias_broadcast": ({}, dict(causal=True,
                                bias=_RNG.normal(size=(1, 2, 1, 6)).astype(np.float32))),
    "custom_scale": ({}, dict(causal=True, scale=0.37)),
    "gqa": (dict(H=4, K=2), dict(causal=True)),
    "gqa_padding": (dict(H=6, K=3), dict(q_segment_ids=PAD, kv_segment_ids=PAD)),
    "mqa": (dict(H=4, K=1), dict(causal=True, q_segment_ids=PACKED, kv_segment_ids=PACKED)),
    "q_shorter_end_aligned": (dict(T=3, S=7), dict(causal=True)),
    "q_shorter_window": (dict(T=3, S=7), dict(causal=True, window=2)),
    "q_shorter_alibi": (dict(T=2, S=5, H=4, K=2), dict(causal=True, alibi_slopes=SLOPES4)),
    "q_longer_than_kv": (dict(T=5, S=3), dict(causal=True)),
    "explicit_positions": (dict(T=3, S=5), dict(
        causal=True, window=4, q_positions=np.array([[10, 11, 12], [3, 4, 5]], np.int32),
        kv_positions=np.array([[7, 8, 9, 10, 11], [0, 2, 3, 5, 9]], np.int32))),
    "explicit_positions_alibi": (dict(T=3, S=5, H=4, K=4), dict(
        alibi_slopes=SLOPES4, q_positions=np.array([[10, 11, 12], [3, 4, 5]], np.int32),
        kv_positions=np.array([[7, 8, 9, 10, 11], [0, 2, 3, 5, 9]], np.int32))),
    "everything": (dict(H=4, K=2), dict(
        causal=True, window=3, q_segment_ids=PACKED, kv_segment_ids=PACKED,
        alibi_slopes=SLOPES4, bias=_RNG.normal(size=(2, 4, 6, 6)).astype(np.float32),
        scale=0.5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_xla_matches_numpy(name):
  shape, kwargs = CASES[name]
  q, k, v = qkv(**shape, seed=len(name))
  expected_out, expected_w = np_attention(q, k, v, **kwargs)
  out, weights = jax.jit(lambda q, k, v: (
      ops.dot_product_attention(q, k, v, implementation="xla", **kwargs),
      ops.attention_weights(q, k, **kwargs)))(q, k, v)
  assert out.shape == q.shape and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), expected_out, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(weights), expected_w, rtol=2e-5, atol=2e-6)


def test_default_positions_are_end_aligned_not_start_aligned():
  # Guards the q_len != kv_len cases above: start-aligned positions would give another answer.
  q, k, v = qkv(T=3, S=7)
  end, _ = np_attention(q, k, v, causal=True)
  start, _ = np_attention(q, k, v, causal=True, q_positions=np.arange(3)[None])
  assert not np.allclose(end, start)
  out = ops.dot_product_attention(q, k, v, causal=True)
  np.testing.assert_allclose(np.asarray(out), end, rtol=2e-5, atol=2e-5)


def test_every_option_changes_the_result():
  """Each option really reaches the computation (so the reference comparison is meaningful)."""
  q, k, v = qkv(H=4, K=4)
  base = np.asarray(ops.dot_product_attention(q, k, v))
  for kwargs in [dict(causal=True), dict(window=2), dict(alibi_slopes=SLOPES4), dict(scale=0.1),
                 dict(q_segment_ids=PACKED, kv_segment_ids=PACKED), dict(kv_segment_ids=PAD),
                 dict(bias=np.ones((1, 1, 6, 6), np.float32) * np.arange(6))]:
    assert not np.allclose(np.asarray(ops.dot_product_attention(q, k, v, **kwargs)), base), kwargs


# ------------------------------------------------------------------------------------------------
# Fully masked rows
# ------------------------------------------------------------------------------------------------
MASKED_CASES = {
    # name -> (shape, kwargs, fully masked (b, t) rows)
    "q_padding": ({}, dict(q_segment_ids=PAD), [(0, 4), (0, 5)]),
    "padding_both": ({}, dict(causal=True, q_segment_ids=PAD, kv_segment_ids=PAD),
                     [(0, 4), (0, 5)]),
    "q_before_all_keys": (dict(T=5, S=3), dict(causal=True), [(0, 0), (0, 1), (1, 0), (1, 1)]),
    "no_matching_segment": ({}, dict(q_segment_ids=np.array([[1, 1, 2, 2, 3, 3]] * 2, np.int32),
                                     kv_segment_ids=np.array([[1, 1, 2, 2, 0, 0]] * 2, np.int32)),
                            [(0, 4), (0, 5), (1, 4), (1, 5)]),
    "window_explicit_positions": (dict(T=2, S=4), dict(
        causal=True, window=2, q_positions=np.array([[0, 4]] * 2, np.int32),
        kv_positions=np.array([[1, 2, 3, 4]] * 2, np.int32)), [(0, 0), (1, 0)]),
}


@pytest.mark.parametrize("name", list(MASKED_CASES))
def test_fully_masked_rows_are_exactly_zero_with_finite_zero_grads(name):
  shape, kwargs, rows = MASKED_CASES[name]
  q, k, v = qkv(**shape, H=4, K=2, seed=3)
  bias = np.random.default_rng(0).normal(size=(1, 4, q.shape[1], k.shape[1])).astype(np.float32)
  cot = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)

  def loss(q, k, v, bias):
    out = ops.dot_product_attention(q, k, v, bias=bias, alibi_slopes=SLOPES4, **kwargs)
    return jnp.sum(out * cot), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
      q, k, v, bias)
  out = np.asarray(out)
  expected, expected_w = np_attention(q, k, v, bias=bias, alibi_slopes=SLOPES4, **kwargs)
  np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)
  weights = np.asarray(jax.jit(lambda q, k, bias: ops.attention_weights(
      q, k, bias=bias, alibi_slopes=SLOPES4, **kwargs))(q, k, bias))
  np.testing.assert_allclose(weights, expected_w, rtol=2e-5, atol=2e-6)
  for b, t in rows:
    assert np.all(out[b, t] == 0.0)
    assert np.all(weights[b, :, t] == 0.0)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  dq, dbias = np.asarray(grads[0]), np.asarray(grads[3])
  for b, t in rows:
    assert np.all(dq[b, t] == 0.0)
  # Some row is visible, so the gradients are not trivially all zero.
  assert np.abs(dq).sum() > 0 and np.abs(dbias).sum() > 0


def np_attention_grads(q, k, v, dout, **kwargs):
  """Backward pass of softmax attention written out: dV = P^T dO, dP = dO V^T,
  dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q; GQA sums over the group."""
  B, T, H, D = q.shape
  K = k.shape[2]
  G = H // K
  scale = 1.0 / np.sqrt(D)
  _, P = np_attention(q, k, v, **kwargs)  # [B,H,T,S], zero where masked
  q64, dout = np.asarray(q, np.float64), np.asarray(dout, np.float64)
  k_rep = np.repeat(np.asarray(k, np.float64), G, axis=2)
  v_rep = np.repeat(np.asarray(v, np.float64), G, axis=2)
  dv_rep = np.einsum("bhts,bthd->bshd", P, dout)
  dP = np.einsum("bthd,bshd->bhts", dout, v_rep)
  dS = P * (dP - np.sum(dP * P, axis=-1, keepdims=True))
  dq = scale * np.einsum("bhts,bshd->bthd", dS, k_rep)
  dk_rep = scale * np.einsum("bhts,bthd->bshd", dS, q64)
  S = k.shape[1]
  return dq, dk_rep.reshape(B, S, K, G, D).sum(3), dv_rep.reshape(B, S, K, G, D).sum(3)


@pytest.mark.parametrize("shape,kwargs", [
    (dict(H=4, K=2), dict(causal=True, q_segment_ids=PAD, kv_segment_ids=PAD)),
    (dict(H=4, K=1, T=3, S=6), dict(causal=True, window=3)),
])
def test_gradients_match_numpy_backward(shape, kwargs):
  q, k, v = qkv(**shape, seed=11)
  dout = np.random.default_rng(5).normal(size=q.shape).astype(np.float32)
  grads = jax.jit(jax.grad(
      lambda q, k, v: jnp.sum(ops.dot_product_attention(q, k, v, **kwargs) * dout),
      argnums=(0, 1, 2)))(q, k, v)
  for got, want in zip(grads, np_attention_grads(q, k, v, dout, **kwargs)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Dropout on the weights
# ------------------------------------------------------------------------------------------------
def test_attention_dropout_is_inverted_dropout_on_the_weights():
  # v[b, s, :, :] = e_s makes each output row equal to its (dropped) weight row.
  B, T, S, H = 2, 6, 6, 2
  q, k, _ = qkv(B=B, T=T, S=S, H=H, K=H, D=S)
  v = np.broadcast_to(np.eye(S, dtype=np.float32)[None, :, None, :], (B, S, H, S)).copy()
  rate = 0.5
  _, w = np_attention(q, k, v, causal=True)  # [B,H,T,S]
  w = w.transpose(0, 2, 1, 3)  # [B,T,H,S] like the outputs
  drop = jax.jit(lambda key: ops.dot_product_attention(q, k, v, causal=True, dropout_rate=rate,
                                                       dropout_rng=key))
  key = lambda seed: jax.random.key(seed, impl="rbg")  # compiles much faster than threefry
  out1 = np.asarray(drop(key(0)))
  out2 = np.asarray(drop(key(1)))
  again = np.asarray(drop(key(0)))
  np.testing.assert_array_equal(out1, again)
  assert not np.allclose(out1, out2)
  for out in (out1, out2):
    kept = np.isclose(out, w / (1 - rate), rtol=1e-5, atol=1e-7)
    dropped = out == 0.0
    assert np.all(kept | dropped)
    visible = w > 0
    frac_dropped = np.mean(dropped[visible])
    assert 0.3 < frac_dropped < 0.7


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_auto_with_attention_dropout_keeps_the_pallas_kernel(monkeypatch, backend):
  # The kernels apply dropout with xla's mask (tfjax/nn/dropout_hash.py), so 'auto' keeps them
  # (nanoGPT's GPU recipe, configs/shakespeare_char.py, trains with attention dropout 0.2 and
  # 'auto'). The backend's kernel is stood in for by the interpreted Triton one, which CPU runs.
  from tfjax.nn.kernels import flash_attention, pallas  # pylint: disable=import-outside-toplevel
  calls = []

  def kernel_for(name):
    def recording_kernel(q, k, v, **kw):
      calls.append((name, kw["dropout_rate"], kw["dropout_seed"]))
      return flash_attention(q, k, v, interpret=True, **kw)
    return recording_kernel

  monkeypatch.setattr(pallas, "pallas_kernel_for_backend", kernel_for)
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  q, k, v = qkv(B=1, T=16, S=16, D=16)
  key = jax.random.key(0, impl="rbg")
  got = ops.dot_product_attention(q, k, v, causal=True, implementation="auto", dropout_rate=0.1,
                                  dropout_rng=key)
  monkeypatch.undo()
  want = ops.dot_product_attention(q, k, v, causal=True, implementation="xla", dropout_rate=0.1,
                                   dropout_rng=key)
  assert [call[:2] for call in calls] == [(backend, 0.1)]
  np.testing.assert_array_equal(np.asarray(calls[0][2]), np.asarray(
      jax.lax.bitcast_convert_type(jax.random.bits(key, (), jnp.uint32), jnp.int32)))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  assert np.any(np.asarray(got) != np.asarray(ops.dot_product_attention(q, k, v, causal=True)))


def test_auto_with_attention_dropout_on_long_cpu_sequences_means_xla():
  # 'chunked', auto's choice on CPU from 2048 tokens, has no dropout: auto takes xla there.
  q, k, v = qkv(B=1, T=2048, S=2048)
  assert ops._resolve("auto", 2048, 2048) == "chunked"  # pylint: disable=protected-access
  got = ops.dot_product_attention(q, k, v, causal=True, implementation="auto", dropout_rate=0.1,
                                  dropout_rng=jax.random.key(0, impl="rbg"))
  want = ops.dot_product_attention(q, k, v, causal=True, implementation="xla", dropout_rate=0.1,
                                   dropout_rng=jax.random.key(0, impl="rbg"))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_dropout_without_rng_raises():
  q, k, v = qkv()
  with pytest.raises(ValueError, match="dropout_rng"):
    ops.dot_product_attention(q, k, v, dropout_rate=0.1)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
def test_bad_ranks_raise():
  q, k, v = qkv()
  with pytest.raises(ValueError, match=r"expects q \[batch, q_len, heads, head_dim\]"):
    ops.dot_product_attention(q[0], k, v)
  with pytest.raises(ValueError, match="expects q"):
    ops.dot_product_attention(q, k[..., 0], v[..., 0])


def test_k_v_shape_mismatch_raises():
  q, k, v = qkv()
  with pytest.raises(ValueError, match="k and v must have the same shape"):
    ops.dot_product_attention(q, k, v[:, :4])


@pytest.mark.parametrize("which", ["batch", "head_dim"])
def test_q_k_mismatch_raises(which):
  q, k, v = qkv()
  if which == "batch":
    k, v = k[:1], v[:1]
  else:
    k, v = k[..., :4], v[..., :4]
  with pytest.raises(ValueError, match="agree in batch and head_dim"):
    ops.dot_product_attention(q, k, v)


def test_heads_not_multiple_of_kv_heads_raises():
  q, k, v = qkv(H=3, K=2)
  with pytest.raises(ValueError, match=r"heads \(3\) must be a multiple of kv_heads \(2\)"):
    ops.dot_product_attention(q, k, v)


def test_unknown_implementation_raises_with_choices():
  q, k, v = qkv()
  with pytest.raises(ValueError,
                     match=r"attention implementation='flash' is invalid; choose one of .*'xla'"):
    ops.dot_product_attention(q, k, v, implementation="flash")


def test_alibi_slopes_length_and_window_checked():
  q, k, v = qkv(H=4, K=4)
  with pytest.raises(ValueError, match="alibi_slopes has 3 entries but there are 4 heads"):
    ops.dot_product_attention(q, k, v, alibi_slopes=SLOPES4[:3])
  with pytest.raises(ValueError, match="window must be a positive number of keys, got 0"):
    ops.dot_product_attention(q, k, v, causal=True, window=0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto resolution checked on CPU")
def test_auto_on_short_cpu_sequences_is_xla():
  q, k, v = qkv(H=4, K=2)
  kwargs = dict(causal=True, q_segment_ids=PACKED, kv_segment_ids=PACKED)
  np.testing.assert_array_equal(
      np.asarray(ops.dot_product_attention(q, k, v, implementation="auto", **kwargs)),
      np.asarray(ops.dot_product_attention(q, k, v, implementation="xla", **kwargs)))


def test_no_import_cycle_and_ops_does_not_import_pallas():
  """The kernels import the shared mask rules (tfjax.nn.masks), never tfjax.nn.ops; ops reads the
  kernels' table lazily, so importing ops alone imports neither the kernels nor Pallas."""
  script = (
      "import sys\n"
      "import tfjax.nn.ops\n"
      "assert not [m for m in sys.modules if 'pallas' in m or m.startswith('tfjax.nn.kernels')]\n"
      "del sys.modules['tfjax.nn.ops']\n"
      "import tfjax.nn.kernels\n"
      "assert 'tfjax.nn.ops' not in sys.modules, 'tfjax.nn.kernels imported tfjax.nn.ops'\n")
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
