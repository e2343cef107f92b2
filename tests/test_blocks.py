"""Every building block against NumPy written here, fed the module's own parameters."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy, unboxed
from tfjax.training import cpu_fusion
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.ffn import FeedForward
from tfjax.nn.layers import TransformerLayer
from tfjax.nn.models import Embedder
from tfjax.nn.norms import Norm
from tfjax.nn.positions import alibi_slopes, apply_rope, sinusoidal_table

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

KEY = jax.random.PRNGKey(0)


# ------------------------------------------------------------------------------------------------
# NumPy references
# ------------------------------------------------------------------------------------------------
def np_norm(x, p, kind, eps):
  x = np.asarray(x, np.float64)
  if kind == "layernorm":
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * p["scale"]
    return y + p["bias"] if "bias" in p else y
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * p["scale"]


_erf = np.vectorize(math.erf)


def np_gelu(x):  # exact, erf form
  return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def np_gelu_tanh(x):  # the approximation the library must NOT use
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_silu(x):
  return x / (1.0 + np.exp(-x))


def np_dense(x, p):
  y = np.asarray(x, np.float64) @ p["kernel"]
  return y + p["bias"] if "bias" in p else y


def np_ffn(x, p, kind, gelu=np_gelu):
  if kind == "relu":
    h = np.maximum(np_dense(x, p["wi"]), 0.0)
  elif kind == "gelu":
    h = gelu(np_dense(x, p["wi"]))
  elif kind == "swiglu":  # W2(silu(Wg x) * (W1 x))
    h = np_silu(np_dense(x, p["wi_gate"])) * np_dense(x, p["wi"])
  else:  # geglu
    h = gelu(np_dense(x, p["wi_gate"])) * np_dense(x, p["wi"])
  return np_dense(h, p["wo"])


def np_rotation(pos, dim, base, interleaved):
  """DxD rotation matrix of RoPE at position `pos`: pair i rotated by pos * base^(-2i/D)."""
  R = np.zeros((dim, dim))
  for i in range(dim // 2):
    theta = pos * base ** (-2.0 * i / dim)
    a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + dim // 2)
    R[a, a], R[a, b], R[b, a], R[b, b] = np.cos(theta), -np.sin(theta), np.sin(theta), np.cos(theta)
  return R


def np_rope(x_BxLxHxD, positions_BxL, base=10000.0, interleaved=False):
  x = np.asarray(x_BxLxHxD, np.float64)
  out = np.empty_like(x)
  for b in range(x.shape[0]):
    for l in range(x.shape[1]):
      R = np_rotation(float(positions_BxL[b, l]), x.shape[-1], base, interleaved)
      out[b, l] = x[b, l] @ R.T
  return out


def np_mha(p, x, kv=None, *, causal=False, window=None, q_seg=None, kv_seg=None, rope=None,
           slopes=None, positions=None):
  """Multi-head attention from the module's params. rope: None | 'rope' | 'rope_interleaved'.
  Returns (output [B,T,D], weights [B,H,T,S])."""
  x = np.asarray(x, np.float64)
  src = x if kv is None else np.asarray(kv, np.float64)
  proj = lambda a, name: np.einsum("btd,dhk->bthk", a, p[name]["kernel"]) + p[name].get("bias", 0)
  q, k, v = proj(x, "query"), proj(src, "key"), proj(src, "value")
  B, T, H, hd = q.shape
  S = k.shape[1]
  if rope is not None:
    pos = np.broadcast_to(np.arange(T) if positions is None else positions, (B, T))
    q = np_rope(q, pos, interleaved=rope == "rope_interleaved")
    k = np_rope(k, pos, interleaved=rope == "rope_interleaved")
  k = np.repeat(k, H // k.shape[2], axis=2)
  v = np.repeat(v, H // v.shape[2], axis=2)
  logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(hd)
  i, j = np.arange(T)[:, None], np.arange(S)[None, :]
  visible = np.ones((B, 1, T, S), bool)
  if causal:
    visible &= j <= i
  if window is not None:
    visible &= (i - j < window) & (i - j >= 0)
  if q_seg is not None and kv_seg is not None:
    visible &= ((q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] != 0))[:, None]
  elif kv_seg is not None:
    visible &= (kv_seg != 0)[:, None, None, :]
  if slopes is not None:
    logits = logits - np.asarray(slopes)[None, :, None, None] * np.abs(i - j)[None, None]
  logits = np.where(visible, logits, -np.inf)
  m = np.max(logits, -1, keepdims=True)
  m = np.where(np.isfinite(m), m, 0.0)
  e = np.exp(logits - m)
  denom = e.sum(-1, keepdims=True)
  w = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
  o = np.einsum("bhts,bshk->bthk", w, v)
  y = np.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"].get("bias", 0)
  return y, w


def rand(shape, seed=0, scale=1.0, offset=0.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale + offset).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# Norms
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
@pytest.mark.parametrize("norm_bias", [True, False])
def test_norm_matches_numpy(kind, eps, norm_bias):
  cfg = tiny_config(norm=kind, norm_eps=eps, norm_bias=norm_bias)
  x = rand((2, 3, 16), offset=2.0, scale=1.5)  # nonzero mean separates LayerNorm from RMSNorm
  module = Norm(cfg)
  params = random_params(module, x, seed=1, scale=0.5)
  has_bias = kind == "layernorm" and norm_bias
  assert set(params) == ({"scale", "bias"} if has_bias else {"scale"})
  y = module.apply({"params": params}, x)
  np.testing.assert_allclose(np.asarray(y), np_norm(x, to_numpy(params), kind, eps),
                             rtol=1e-5, atol=1e-5)


def test_norm_statistics_in_float32_for_bfloat16():
  cfg = tiny_config(norm="rmsnorm", dtype="bfloat16")
  x = rand((2, 3, 16), scale=1e-3)  # squares underflow-prone in low precision
  module = Norm(cfg)
  params = random_params(module, x)
  y = module.apply({"params": params}, jnp.asarray(x, jnp.bfloat16))
  assert y.dtype == jnp.bfloat16
  expected = np_norm(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64), to_numpy(params),
                     "rmsnorm", cfg.norm_eps)
  np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------------
# Feed-forward
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["relu", "gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("ffn_bias", [True, False])
def test_ffn_matches_numpy(kind, ffn_bias):
  cfg = tiny_config(ffn=kind, ffn_bias=ffn_bias)
  x = rand((2, 3, 16), seed=2, scale=2.0)
  module = FeedForward(cfg)
  params = random_params(module, x, seed=3, scale=0.5)
  gated = kind in ("swiglu", "geglu")
  assert set(params) == ({"wi", "wi_gate", "wo"} if gated else {"wi", "wo"})
  assert all(("bias" in p) == ffn_bias for p in params.values())
  p = to_numpy(params)
  y = np.asarray(module.apply({"params": params}, x))
  expected = np_ffn(x, p, kind)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
  if kind in ("gelu", "geglu"):  # exact erf GELU, distinguishable from the tanh approximation
    assert not np.allclose(y, np_ffn(x, p, kind, gelu=np_gelu_tanh), rtol=1e-5, atol=1e-5)
  if gated:  # the gate is the activated projection, not the linear one
    swapped = dict(p, wi=p["wi_gate"], wi_gate=p["wi"])
    assert not np.allclose(y, np_ffn(x, swapped, kind), rtol=1e-3, atol=1e-3)


def np_act_and_derivative(kind, z):
  if kind == "relu":
    return np.maximum(z, 0.0), (z > 0).astype(np.float64)
  if kind in ("gelu", "geglu"):  # d/dz z Phi(z) = Phi(z) + z phi(z)
    phi = np.exp(-z ** 2 / 2) / np.sqrt(2 * np.pi)
    return np_gelu(z), 0.5 * (1 + _erf(z / np.sqrt(2))) + z * phi
  sig = 1 / (1 + np.exp(-z))  # silu: d/dz z sig(z) = sig (1 + z (1 - sig))
  return z * sig, sig * (1 + z * (1 - sig))


def np_ffn_grads(x, p, kind, dy):
  """Backward pass of the FFN written out, for loss = sum(y * dy)."""
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  dy = np.asarray(dy, np.float64).reshape(-1, dy.shape[-1])
  pre = x @ p["wi"]["kernel"] + p["wi"]["bias"]
  grads = {}
  if kind in ("swiglu", "geglu"):
    gate = x @ p["wi_gate"]["kernel"] + p["wi_gate"]["bias"]
    act, dact = np_act_and_derivative(kind, gate)
    a = act * pre
  else:
    act, dact = np_act_and_derivative(kind, pre)
    a = act
  grads["wo"] = {"kernel": a.T @ dy, "bias": dy.sum(0)}
  da = dy @ p["wo"]["kernel"].T
  if kind in ("swiglu", "geglu"):
    dpre, dgate = da * act, da * pre * dact
    grads["wi_gate"] = {"kernel": x.T @ dgate, "bias": dgate.sum(0)}
    dx = dpre @ p["wi"]["kernel"].T + dgate @ p["wi_gate"]["kernel"].T
  else:
    dpre = da * dact
    dx = dpre @ p["wi"]["kernel"].T
  grads["wi"] = {"kernel": x.T @ dpre, "bias": dpre.sum(0)}
  return dx, grads


@pytest.mark.parametrize("kind", ["relu", "gelu", "swiglu", "geglu"])
def test_ffn_gradients_match_numpy(kind):
  """Autodiff through each activation against its derivative written out."""
  cfg = tiny_config(ffn=kind)
  x = rand((2, 3, 16), seed=22, scale=1.5)
  dy = rand((2, 3, 16), seed=23)
  module = FeedForward(cfg)
  params = random_params(module, x, seed=24, scale=0.5)
  loss = lambda p, x: jnp.sum(module.apply({"params": p}, x) * dy)
  dparams, dx = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
  expected_dx, expected = np_ffn_grads(x, to_numpy(params), kind, dy)
  np.testing.assert_allclose(np.asarray(dx).reshape(expected_dx.shape), expected_dx,
                             rtol=1e-4, atol=1e-4)
  got = to_numpy(dparams)
  assert set(got) == set(expected)
  for name in expected:
    for leaf in ("kernel", "bias"):
      np.testing.assert_allclose(got[name][leaf], expected[name][leaf], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Positions
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [16, 6])
def test_sinusoidal_table_is_the_formula(d_model):
  positions = np.array([[0, 1, 2, 3, 50], [7, 100, 999, 5, 4096]])
  table = np.asarray(sinusoidal_table(jnp.asarray(positions), d_model))
  assert table.shape == (2, 5, d_model)
  expected = np.zeros((2, 5, d_model))
  for b in range(2):
    for l in range(5):
      p = positions[b, l]
      for i in range(d_model // 2):
        expected[b, l, 2 * i] = math.sin(p / 10000 ** (2 * i / d_model))
        expected[b, l, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d_model))
  # float32 angles of up to ~4096 rad: absolute error ~ 4096 * 2^-24
  np.testing.assert_allclose(table, expected, atol=1e-3)
  small = positions <= 100
  np.testing.assert_allclose(table[small], expected[small], atol=5e-6)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_rotation_matrices(interleaved, base):
  x = rand((2, 4, 3, 8), seed=4)
  positions = np.array([[0, 1, 2, 3], [5, 9, 17, 60]])
  y = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(positions), base=base,
                            interleaved=interleaved))
  np.testing.assert_allclose(y, np_rope(x, positions, base, interleaved), rtol=1e-5, atol=1e-5)
  # The other pairing is a different function (so the check above tells them apart).
  assert not np.allclose(y, np_rope(x, positions, base, not interleaved), atol=1e-3)
  # Rotations preserve norms; position 0 is the identity.
  np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(y[0, 0], x[0, 0], rtol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_offset(interleaved):
  """q(p)·k(p') after rotation is a function of p - p': shifting every position by c keeps it."""
  q = rand((1, 6, 2, 8), seed=5)
  k = rand((1, 6, 2, 8), seed=6)
  q_pos = np.array([[0, 1, 2, 3, 4, 5]])
  k_pos = np.array([[3, 0, 5, 1, 4, 2]])

  def scores(shift):
    rq = apply_rope(jnp.asarray(q), jnp.asarray(q_pos + shift), interleaved=interleaved)
    rk = apply_rope(jnp.asarray(k), jnp.asarray(k_pos + shift), interleaved=interleaved)
    return np.einsum("bthd,bshd->bhts", np.asarray(rq, np.float64), np.asarray(rk, np.float64))

  base = scores(0)
  for shift in (1, 7, 113):
    np.testing.assert_allclose(scores(shift), base, rtol=1e-4, atol=1e-4)
  # ... and they do depend on the offset: unrotated scores are different.
  plain = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64))
  assert not np.allclose(base, plain, atol=1e-2)


def test_alibi_slopes_published_values():
  np.testing.assert_array_equal(alibi_slopes(8), [2.0 ** -h for h in range(1, 9)])
  np.testing.assert_array_equal(alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
  np.testing.assert_array_equal(alibi_slopes(4), [1 / 4, 1 / 16, 1 / 64, 1 / 256])
  np.testing.assert_array_equal(alibi_slopes(1), [2.0 ** -8])
  # 12 heads (Press et al. reference code): 8-head slopes, then every other slope of 16 heads.
  expected12 = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -(h / 2) for h in (1, 3, 5, 7)]
  np.testing.assert_allclose(alibi_slopes(12), expected12, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Embedder
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [
    dict(position="learned"),
    dict(position="sinusoidal", embed_scale=True),
    dict(position="rope"),
    dict(family="encoder", position="learned", type_vocab_size=2, embed_norm=True),
])
def test_embedder_matches_numpy(overrides):
  cfg = tiny_config(**overrides)
  toks = np.array([[1, 5, 30, 2], [0, 7, 7, 9]])
  positions = np.array([[0, 1, 2, 3], [3, 4, 5, 6]])
  types = np.array([[0, 0, 1, 1], [1, 0, 1, 0]])
  module = Embedder(cfg)
  args = (jnp.asarray(toks), jnp.asarray(positions))
  kwargs = dict(token_type_ids=jnp.asarray(types)) if cfg.type_vocab_size else {}
  params = random_params(module, *args, seed=9, scale=0.5, **kwargs)
  p = to_numpy(params)
  y = np.asarray(module.apply({"params": params}, *args, **kwargs))
  x = p["tokens"]["embedding"][toks] * (np.sqrt(16) if cfg.embed_scale else 1.0)
  if cfg.position == "learned":
    x = x + p["positions"]["embedding"][positions]
  if cfg.position == "sinusoidal":
    i = np.arange(8)
    angles = positions[..., None] / 10000.0 ** (2 * i / 16)
    x = x + np.stack([np.sin(angles), np.cos(angles)], -1).reshape(2, 4, 16)
  if cfg.type_vocab_size:
    x = x + p["token_types"]["embedding"][types]
  if cfg.embed_norm:
    x = np_norm(x, p["norm"], "layernorm", cfg.norm_eps)
  np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Multi-head attention
# ------------------------------------------------------------------------------------------------
PAD = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32)
MHA_CASES = {
    "self_bidirectional": (dict(), dict()),
    "self_causal_padding": (dict(), dict(causal=True, seg=PAD)),
    "self_causal_gqa": (dict(num_heads=4, num_kv_heads=2, d_model=16), dict(causal=True)),
    "self_mqa_padding": (dict(num_heads=4, num_kv_heads=1), dict(seg=PAD)),
    "self_window": (dict(window=2), dict(causal=True)),
    "self_rope": (dict(position="rope"), dict(causal=True)),
    "self_rope_interleaved_positions": (dict(position="rope_interleaved"), dict(
        causal=True, positions=np.array([[3, 4, 5, 6, 7], [10, 11, 12, 13, 14]]))),
    "self_alibi": (dict(position="alibi", num_heads=4), dict(causal=True)),
    "self_alibi_bidirectional": (dict(position="alibi", num_heads=4), dict()),
    "self_no_bias": (dict(attention_bias=False, head_dim=6), dict(causal=True)),
    "cross": (dict(), dict(cross=True)),
    "cross_padding_rope_ignored": (dict(position="rope", num_heads=4, num_kv_heads=2),
                                   dict(cross=True, kv_seg=np.array([[1, 1, 1, 0, 0, 0, 0],
                                                                     [1, 1, 1, 1, 1, 1, 1]]))),
    "cross_alibi_ignored_q_padding": (dict(position="alibi"), dict(
        cross=True, seg=np.array([[1, 1, 0], [1, 1, 1]]),
        kv_seg=np.array([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]]))),
}


def _alibi_reference_slopes(h):  # power of two heads: 2^(-8 i / h)
  return [2.0 ** (-8.0 * i / h) for i in range(1, h + 1)]


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_multi_head_attention_matches_numpy(name):
  overrides, case = MHA_CASES[name]
  cfg = tiny_config(**overrides)
  cross = case.get("cross", False)
  T = 3 if cross else 5
  x = rand((2, T, 16), seed=10)
  kv = rand((2, 7, 16), seed=11) if cross else None
  seg = case.get("seg")
  kv_seg = case.get("kv_seg", None if cross else seg)
  positions = case.get("positions")
  module = MultiHeadAttention(cfg, causal=case.get("causal", False), cross=cross)
  call_kwargs = dict(q_segment_ids=None if seg is None else jnp.asarray(seg),
                     kv_segment_ids=None if kv_seg is None else jnp.asarray(kv_seg),
                     positions=None if positions is None else jnp.asarray(positions))
  params = random_params(module, x, kv, seed=12, scale=0.4, **call_kwargs)
  assert all(("bias" in p) == cfg.attention_bias for p in params.values())
  y, state = module.apply({"params": params}, x, kv, mutable=["intermediates"], **call_kwargs)
  (weights,) = state["intermediates"]["attention_weights"]
  y_plain = module.apply({"params": params}, x, kv, **call_kwargs)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_plain))  # sowing changes nothing

  relative = not cross
  expected_y, expected_w = np_mha(
      to_numpy(params), x, kv, causal=case.get("causal", False),
      window=cfg.window if case.get("causal") else None,
      q_seg=seg, kv_seg=kv_seg, positions=positions,
      rope=cfg.position if relative and cfg.position.startswith("rope") else None,
      slopes=_alibi_reference_slopes(cfg.num_heads)
      if relative and cfg.position == "alibi" else None)
  weights = np.asarray(weights)
  assert weights.shape == (2, cfg.num_heads, T, 7 if cross else T)
  np.testing.assert_allclose(weights, expected_w, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(y), expected_y, rtol=2e-5, atol=2e-5)
  sums = weights.sum(-1)
  row_visible = expected_w.sum(-1) > 0
  np.testing.assert_allclose(sums[row_visible], 1.0, rtol=1e-5)
  np.testing.assert_array_equal(sums[~row_visible], 0.0)


def test_rope_attention_is_shift_invariant_in_the_module():
  cfg = tiny_config(position="rope", num_heads=2)
  x = rand((1, 5, 16), seed=13)
  module = MultiHeadAttention(cfg, causal=True)
  params = random_params(module, x, seed=14, scale=0.5)
  outs = []
  for shift in (0, 11, 250):
    pos = jnp.arange(5)[None] + shift
    outs.append(np.asarray(module.apply({"params": params}, x, positions=pos)))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(outs[2], outs[0], rtol=1e-4, atol=1e-4)
  # Non-uniform positions (gaps) do change the result.
  gapped = np.asarray(module.apply({"params": params}, x, positions=jnp.array([[0, 1, 5, 6, 9]])))
  assert not np.allclose(gapped, outs[0], atol=1e-3)


def test_gqa_with_kv_heads_equal_heads_is_mha():
  mha_cfg = tiny_config(num_heads=4)
  gqa_cfg = tiny_config(num_heads=4, num_kv_heads=4)
  x = rand((2, 5, 16), seed=15)
  mha = MultiHeadAttention(mha_cfg, causal=True)
  gqa = MultiHeadAttention(gqa_cfg, causal=True)
  params = random_params(mha, x, seed=16, scale=0.5)
  gqa_shapes = jax.eval_shape(lambda: gqa.init(KEY, x))["params"]
  assert jax.tree_util.tree_map(np.shape, unboxed(gqa_shapes)) == \
      jax.tree_util.tree_map(np.shape, params)
  np.testing.assert_array_equal(np.asarray(gqa.apply({"params": params}, x)),
                                np.asarray(mha.apply({"params": params}, x)))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_gqa_equals_mha_with_repeated_kv_weights(kv_heads):
  """GQA: query head h reads kv head h // (H / K); MHA whose K/V weights repeat per group is
  the same function."""
  H = 4
  gqa_cfg = tiny_config(num_heads=H, num_kv_heads=kv_heads)
  mha_cfg = tiny_config(num_heads=H)
  x = rand((2, 5, 16), seed=17)
  seg = jnp.asarray(PAD)
  gqa = MultiHeadAttention(gqa_cfg, causal=True)
  params = random_params(gqa, x, seed=18, scale=0.5)
  p = to_numpy(params)
  mha_params = dict(p)
  for name in ("key", "value"):
    mha_params[name] = {"kernel": np.repeat(p[name]["kernel"], H // kv_heads, axis=1),
                        "bias": np.repeat(p[name]["bias"], H // kv_heads, axis=0)}
  mha_params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), mha_params)
  y_gqa = gqa.apply({"params": params}, x, q_segment_ids=seg, kv_segment_ids=seg)
  y_mha = MultiHeadAttention(mha_cfg, causal=True).apply(
      {"params": mha_params}, x, q_segment_ids=seg, kv_segment_ids=seg)
  np.testing.assert_allclose(np.asarray(y_gqa), np.asarray(y_mha), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Transformer layer: pre- vs post-norm ordering
# ------------------------------------------------------------------------------------------------
def np_layer(p, x, *, placement, norm, eps, ffn, causal, enc=None, enc_seg=None):
  def sublayer(name, x, f):
    if placement == "pre":
      return x + f(np_norm(x, p[f"{name}_norm"], norm, eps))
    return np_norm(x + f(x), p[f"{name}_norm"], norm, eps)

  x = sublayer("self_attention", np.asarray(x, np.float64),
               lambda h: np_mha(p["self_attention"], h, causal=causal)[0])
  if enc is not None:
    x = sublayer("cross_attention", x,
                 lambda h: np_mha(p["cross_attention"], h, enc, kv_seg=enc_seg)[0])
  return sublayer("ffn", x, lambda h: np_ffn(h, p["ffn"], ffn))


@pytest.mark.parametrize("placement,norm,ffn,cross", [
    ("pre", "layernorm", "gelu", False),
    ("post", "layernorm", "relu", False),
    ("pre", "rmsnorm", "swiglu", True),
    ("post", "layernorm", "geglu", True),
])
def test_transformer_layer_norm_placement_matches_numpy(placement, norm, ffn, cross):
  cfg = tiny_config(norm_placement=placement, norm=norm, ffn=ffn, norm_eps=1e-3)
  x = rand((2, 5, 16), seed=19, offset=0.5)
  enc = rand((2, 4, 16), seed=20) if cross else None
  enc_seg = np.array([[1, 1, 1, 0], [1, 1, 1, 1]]) if cross else None
  layer = TransformerLayer(cfg, causal=True, cross_attention=cross)
  kwargs = dict(encoded_BxSxD=enc, encoder_segment_ids=None if enc_seg is None else
                jnp.asarray(enc_seg))
  params = random_params(layer, x, seed=21, scale=0.3, **kwargs)
  p = to_numpy(params)
  expected_names = {"self_attention", "self_attention_norm", "ffn", "ffn_norm"}
  if cross:
    expected_names |= {"cross_attention", "cross_attention_norm"}
  assert set(p) == expected_names
  y = np.asarray(layer.apply({"params": params}, x, **kwargs))
  common = dict(norm=norm, eps=1e-3, ffn=ffn, causal=True, enc=enc, enc_seg=enc_seg)
  expected = np_layer(p, x, placement=placement, **common)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
  other = np_layer(p, x, placement="post" if placement == "pre" else "pre", **common)
  assert not np.allclose(y, other, atol=1e-2)


@pytest.fixture
def fusion_policy():
  """Sets tfjax.training.cpu_fusion's policy for one test, then restores the default."""
  yield cpu_fusion.install
  cpu_fusion.install("auto")


@pytest.mark.parametrize("placement,ffn", [("pre", "gelu"), ("post", "swiglu")])
def test_transformer_layer_gradients_match_finite_differences(placement, ffn, fusion_policy):
  """Directional derivatives of the layer, with the residual gradients going through the CPU
  fusion boundary's custom JVP (tfjax.training.cpu_fusion), agree with central differences along random
  directions."""
  fusion_policy("on")
  cfg = tiny_config(norm_placement=placement, ffn=ffn, num_heads=4, num_kv_heads=2)
  x = jnp.asarray(rand((2, 5, 16), seed=25))
  cot = jnp.asarray(rand((2, 5, 16), seed=26))
  layer = TransformerLayer(cfg, causal=True)
  params = random_params(layer, x, seed=27, scale=0.3)
  f = lambda p, x: jnp.sum(layer.apply({"params": p}, x) * cot)
  grads = jax.grad(cpu_fusion.applied(f), argnums=(0, 1))(params, x)
  rng = np.random.default_rng(28)
  for _ in range(3):
    direction = jax.tree_util.tree_map(
        lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32), (params, x))

    def central(eps):
      plus = jax.tree_util.tree_map(lambda a, d: a + eps * d, (params, x), direction)
      minus = jax.tree_util.tree_map(lambda a, d: a - eps * d, (params, x), direction)
      return (float(f(*plus)) - float(f(*minus))) / (2 * eps)

    numeric = (4 * central(5e-3) - central(1e-2)) / 3  # Richardson: O(eps^4) truncation error
    analytic = sum(float(jnp.sum(g * d)) for g, d in zip(jax.tree_util.tree_leaves(grads),
                                                         jax.tree_util.tree_leaves(direction)))
    assert analytic == pytest.approx(numeric, rel=5e-3, abs=5e-2)


def _conds(jaxpr) -> int:
  """Number of `cond` equations in a closed jaxpr, nested ones included."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "cond"
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      count += _conds(sub)
  return count


@pytest.mark.parametrize("cross", [False, True])
def test_cpu_fusion_boundary_is_one_cond_per_sublayer_and_changes_no_value(cross, fusion_policy):
  """cpu_fusion.applied routes the residual stream entering each sublayer through an identity
  whose cotangent passes a cond: conds in the gradient for each sublayer ('on'), none ('off'), the
  same gradients either way; forward-mode autodiff still works through it."""
  cfg = tiny_config(num_heads=4, num_kv_heads=2)
  x = jnp.asarray(rand((2, 5, 16), seed=40))
  enc = jnp.asarray(rand((2, 3, 16), seed=41))
  cot = jnp.asarray(rand((2, 5, 16), seed=42))
  layer = TransformerLayer(cfg, causal=True, cross_attention=cross)
  params = random_params(layer, x, None, None, enc, seed=43)
  # A new function per policy: JAX caches traces by function, and the policy is read when tracing.
  loss = lambda: cpu_fusion.applied(lambda p, x: jnp.sum(
      layer.apply({"params": p}, x, encoded_BxSxD=enc) * cot))
  grads, conds = {}, {}
  for policy in ("on", "off"):
    fusion_policy(policy)
    conds[policy] = _conds(jax.make_jaxpr(jax.grad(loss(), argnums=(0, 1)))(params, x).jaxpr)
    grads[policy] = jax.grad(loss(), argnums=(0, 1))(params, x)
  # Partial evaluation splits each sublayer's cond into a forward and a (transposed) backward one.
  sublayers = 3 if cross else 2
  assert conds == {"on": 2 * sublayers, "off": 0}
  for a, b in zip(jax.tree_util.tree_leaves(grads["on"]), jax.tree_util.tree_leaves(grads["off"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  fusion_policy("on")
  dx = jnp.asarray(rand((2, 5, 16), seed=44))
  f = loss()
  _, tangent = jax.jvp(lambda x: f(params, x), (x,), (dx,))
  assert float(tangent) == pytest.approx(float(jnp.sum(grads["on"][1] * dx)), rel=1e-4)


def test_cpu_fusion_policy_auto_follows_the_backend_and_bad_values_are_named(fusion_policy):
  assert cpu_fusion.installed() == "auto"
  assert cpu_fusion.enabled() == (jax.default_backend() == "cpu")
  fusion_policy("off")
  assert not cpu_fusion.enabled()
  with pytest.raises(ValueError, match=r"cpu_fusion policy='fast' is invalid; choose one of "
                                       r"\('auto', 'on', 'off'\)"):
    cpu_fusion.install("fast")
  assert cpu_fusion.installed() == "off"  # a rejected value leaves the policy as it was


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_key_value_projections_carry_the_kv_heads_axis(num_kv_heads):
  """W_K / W_V are sharded by kv_heads whether or not kv_heads == heads (MHA: both 4)."""
  cfg = tiny_config(num_heads=4, num_kv_heads=num_kv_heads)
  x = jnp.zeros((1, 3, 16))
  boxed = jax.eval_shape(MultiHeadAttention(cfg).init, jax.random.PRNGKey(0), x)["params"]
  names = {k: (v["kernel"].names, v["bias"].names) for k, v in boxed.items()}
  assert names == {
      "query": (("embed", "heads", "head_dim"), ("heads", "head_dim")),
      "key": (("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim")),
      "value": (("embed", "kv_heads", "head_dim"), ("kv_heads", "head_dim")),
      "out": (("heads", "head_dim", "embed"), ("embed",)),
  }
