"""NumPy references of the building blocks, written from the papers' formulas (float64), shared by
the per-module tests (test_norms, test_ffn, test_positions, test_attention, test_layers, ...)."""

import math

import jax
import numpy as np

KEY = jax.random.PRNGKey(0)


def rand(shape, seed=0, scale=1.0, offset=0.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale + offset).astype(np.float32)


def np_norm(x, p, kind, eps, unit_offset=False):
  """LayerNorm (Ba et al.) or RMSNorm (Zhang & Sennrich); Gemma's (1 + w) gain with unit_offset."""
  x = np.asarray(x, np.float64)
  if kind == "layernorm":
    x = x - x.mean(-1, keepdims=True)
  y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
  y = y * ((1.0 + p["scale"]) if unit_offset else p["scale"])
  return y + p["bias"] if "bias" in p else y


_erf = np.vectorize(math.erf)


def np_gelu(x):
  return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def np_gelu_tanh(x):  # Hendrycks & Gimpel's approximation, GPT-2's gelu_new
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_silu(x):
  return x / (1.0 + np.exp(-x))


def np_relu(x):
  return np.maximum(x, 0.0)


def np_sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_identity(x):
  return x


# kind -> (activation, gated)
NP_FFNS = {
    "relu": (np_relu, False), "gelu": (np_gelu, False), "gelu_tanh": (np_gelu_tanh, False),
    "silu": (np_silu, False), "swiglu": (np_silu, True), "geglu": (np_gelu, True),
    "geglu_tanh": (np_gelu_tanh, True), "reglu": (np_relu, True),
    # Shazeer 2020, eq. 5: GLU(x) = sigmoid(xW) * xV, Bilinear(x) = xW * xV
    "glu": (np_sigmoid, True), "bilinear": (np_identity, True),
}


def np_dense(x, p):
  y = np.asarray(x, np.float64) @ p["kernel"]
  return y + p["bias"] if "bias" in p else y


def np_ffn(x, p, kind):
  act, gated = NP_FFNS[kind]
  h = act(np_dense(x, p["wi_gate"])) * np_dense(x, p["wi"]) if gated else act(np_dense(x, p["wi"]))
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
