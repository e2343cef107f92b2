"""tfjax/nn/attention.py: the attention switches (out bias, score scale, soft-capping, QK-norm,
partial/scaled RoPE) against a NumPy multi-head attention written here from the formulas."""

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from tfjax.nn.attention import MultiHeadAttention


def np_rotate(x_BxTxHxE, pos_BxT, inv_freq, *, rot_dim, mscale=1.0, interleaved=False):
  """RoPE on the first rot_dim channels of each head (rotate-half or adjacent pairs), angle of
  pair i at position p = p * inv_freq[i]; cos and sin times mscale (YaRN); the rest passes."""
  x = np.asarray(x_BxTxHxE, np.float64)
  ang = pos_BxT[:, :, None, None] * np.asarray(inv_freq, np.float64)[None, None, None, :]
  cos, sin = np.cos(ang) * mscale, np.sin(ang) * mscale
  rot, rest = x[..., :rot_dim], x[..., rot_dim:]
  if interleaved:
    a, b = rot[..., 0::2], rot[..., 1::2]
    out = np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(rot.shape)
  else:
    a, b = rot[..., :rot_dim // 2], rot[..., rot_dim // 2:]
    out = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
  return np.concatenate([out, rest], -1)


def np_head_norm(x, p, kind, eps, unit_offset=False):
  x = np.asarray(x, np.float64)
  if kind == "layernorm":
    x = x - x.mean(-1, keepdims=True)
  y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
  y = y * ((1.0 + p["scale"]) if unit_offset else p["scale"])
  return y + p["bias"] if "bias" in p else y


def np_attention(p, x, *, causal=True, window=None, scale=None, softcap=None, bias=None,
                 rope=None, qk_norm=None, eps=1e-5):
  """rope: dict(inv_freq, rot_dim, mscale, interleaved); bias: [H, T, S]. Returns [B, T, D]."""
  x = np.asarray(x, np.float64)
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name].get("bias", 0)
  q, k, v = proj("query"), proj("key"), proj("value")
  B, T, H, E = q.shape
  if qk_norm is not None:
    q = np_head_norm(q, p["query_norm"], qk_norm, eps)
    k = np_head_norm(k, p["key_norm"], qk_norm, eps)
  if rope is not None:
    pos = np.broadcast_to(np.arange(T), (B, T)).astype(np.float64)
    q, k = np_rotate(q, pos, **rope), np_rotate(k, pos, **rope)
  k, v = np.repeat(k, H // k.shape[2], 2), np.repeat(v, H // v.shape[2], 2)
  s = np.einsum("bthe,bshe->bhts", q, k) * (E ** -0.5 if scale is None else scale)
  if softcap is not None:
    s = softcap * np.tanh(s / softcap)
  if bias is not None:
    s = s + bias[None]
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  visible = np.ones((T, T), bool)
  if causal:
    visible &= j <= i
  if window is not None:
    visible &= i - j < window
  s = np.where(visible, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  o = np.einsum("bhts,bshe->bthe", w, v)
  return np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"].get("bias", 0)


def rand(shape, seed=0, scale=1.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def run_attention(cfg, x, *, causal=True, seed=1, **kwargs):
  module = MultiHeadAttention(cfg, causal=causal)
  params = random_params(module, x, seed=seed, scale=0.4, **kwargs)
  y = module.apply({"params": params}, x, **kwargs)
  return np.asarray(y), to_numpy(params)


def test_attention_out_bias_switch_drops_only_the_output_bias():
  """Qwen2: biases on W_Q, W_K, W_V but none on W_O."""
  cfg = tiny_config(attention_bias=True, attention_out_bias=False)
  x = rand((2, 5, 16))
  y, p = run_attention(cfg, x)
  assert {n for n in p if "bias" in p[n]} == {"query", "key", "value"}
  np.testing.assert_allclose(y, np_attention(p, x), rtol=2e-5, atol=2e-5)
  cfg = tiny_config(attention_bias=False, attention_out_bias=True)
  y, p = run_attention(cfg, x)
  assert {n for n in p if "bias" in p[n]} == {"out"}
  np.testing.assert_allclose(y, np_attention(p, x), rtol=2e-5, atol=2e-5)


def _np_inv_freq(dim, base):
  return np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)])


@pytest.mark.parametrize("overrides,rope", [
    (dict(position="rope", rotary_fraction=0.5),  # head_dim 8: rotate 4, pass 4 (GPT-NeoX)
     dict(inv_freq=_np_inv_freq(4, 1e4), rot_dim=4)),
    (dict(position="rope_interleaved", rotary_fraction=0.5),  # GPT-J: partial, adjacent pairs
     dict(inv_freq=_np_inv_freq(4, 1e4), rot_dim=4, interleaved=True)),
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=4.0),
     dict(inv_freq=_np_inv_freq(8, 1e4) / 4, rot_dim=8)),
    (dict(position="rope", rope_scaling="dynamic", rope_scaling_factor=3.0,
          rope_original_max_len=4),  # 6 tokens: seq_len 6 > 4
     dict(inv_freq=_np_inv_freq(8, 1e4 * (3.0 * 6 / 4 - 2.0) ** (8 / 6)), rot_dim=8)),
    (dict(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0,
          rope_original_max_len=64, rope_attention_factor=1.3),  # gain on cos and sin
     dict(inv_freq=None, rot_dim=8, mscale=1.3)),
])
def test_attention_with_scaled_or_partial_rope_matches_numpy(overrides, rope):
  cfg = tiny_config(**overrides)
  if rope["inv_freq"] is None:
    from tfjax.nn.positions import yarn_scaled_frequencies
    rope = dict(rope, inv_freq=np.asarray(yarn_scaled_frequencies(8, 1e4, 4.0, 64, 32.0, 1.0)))
  x = rand((2, 6, 16), seed=3)
  y, p = run_attention(cfg, x)
  np.testing.assert_allclose(y, np_attention(p, x, rope=rope), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("overrides,kwargs", [
    (dict(attention_scale=1.0), dict(scale=1.0)),  # T5: no 1/sqrt(d) scaling
    (dict(attention_scale=0.125, attention_softcap=2.0, window=3),  # Gemma 2 style
     dict(scale=0.125, softcap=2.0, window=3)),
    (dict(attention_softcap=0.5, position="alibi"), dict(softcap=0.5, bias="alibi")),
])
def test_attention_scale_and_softcap_match_numpy(overrides, kwargs):
  cfg = tiny_config(**overrides)
  x = rand((2, 5, 16), seed=4, scale=2.0)
  y, p = run_attention(cfg, x)
  if kwargs.get("bias") == "alibi":  # 2 heads: slopes 2^-4, 2^-8; capped scores, then ALiBi
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    kwargs = dict(kwargs, bias=-np.array([2.0 ** -4, 2.0 ** -8])[:, None, None] * np.abs(i - j))
  expected = np_attention(p, x, **kwargs)
  np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)
  uncapped = np_attention(p, x, **dict(kwargs, softcap=None, scale=kwargs.get("scale")))
  if "softcap" in kwargs:
    assert not np.allclose(y, uncapped, rtol=1e-3, atol=1e-3)


def test_global_layer_ignores_the_window():
  cfg = tiny_config(window=2)
  x = rand((1, 6, 16), seed=5)
  module = MultiHeadAttention(cfg, causal=True, sliding=False)
  params = random_params(module, x, seed=6)
  y = np.asarray(module.apply({"params": params}, x))
  np.testing.assert_allclose(y, np_attention(to_numpy(params), x), rtol=2e-5, atol=2e-5)


def test_softcap_needs_the_xla_attention():
  with pytest.raises(ValueError, match="attention_impl='xla'"):
    tiny_config(attention_softcap=50.0, attention_impl="pallas")
  for key in ("attention_scale", "attention_softcap", "logits_softcap"):
    with pytest.raises(ValueError, match=f"model.{key}=0.0 must be a positive"):
      tiny_config(**{key: 0.0})


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_qk_norm_normalizes_each_head_before_rope(kind):
  cfg = tiny_config(qk_norm=kind, position="rope", num_heads=4, num_kv_heads=2, norm_eps=1e-6)
  x = rand((2, 5, 16), seed=7, scale=3.0)
  y, p = run_attention(cfg, x)
  assert p["query_norm"]["scale"].shape == (4,) and p["key_norm"]["scale"].shape == (4,)
  rope = dict(inv_freq=_np_inv_freq(4, 1e4), rot_dim=4)
  expected = np_attention(p, x, qk_norm=kind, eps=1e-6, rope=rope)
  np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)
