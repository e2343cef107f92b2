"""tfjax/nn/attention.py: the attention switches (out bias, score scale, soft-capping, QK-norm,
partial/scaled RoPE) against a NumPy multi-head attention written here from the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_owner_rejects, random_params, tiny_config, to_numpy, unboxed
from np_reference import KEY, np_mha, np_norm, rand

from tfjax.nn.attention import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


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


def np_attention(p, x, *, causal=True, window=None, scale=None, softcap=None, bias=None,
                 rope=None, qk_norm=None, eps=1e-5):
  """rope: dict(inv_freq, rot_dim, mscale, interleaved); bias: [H, T, S]. Returns [B, T, D]."""
  x = np.asarray(x, np.float64)
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name].get("bias", 0)
  q, k, v = proj("query"), proj("key"), proj("value")
  B, T, H, E = q.shape
  if qk_norm is not None:
    q = np_norm(q, p["query_norm"], qk_norm, eps)
    k = np_norm(k, p["key_norm"], qk_norm, eps)
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


def test_local_rope_base_on_sliding_layers_only():
  """model.rope_local_base (Gemma 3): a sliding layer rotates with the local base and no scaling,
  a global layer with rope_base and its linear scaling, each as NumPy computes them."""
  cfg = tiny_config(position="rope", window=3, rope_base=1e6, rope_local_base=10.0,
                    rope_scaling="linear", rope_scaling_factor=2.0)
  x = rand((2, 6, 16), seed=7)
  for sliding, rope, window in ((True, dict(inv_freq=_np_inv_freq(8, 10.0), rot_dim=8), 3),
                                (False, dict(inv_freq=_np_inv_freq(8, 1e6) / 2, rot_dim=8), None)):
    module = MultiHeadAttention(cfg, causal=True, sliding=sliding)
    params = random_params(module, x, seed=8)
    y = np.asarray(module.apply({"params": params}, x))
    np.testing.assert_allclose(y, np_attention(to_numpy(params), x, rope=rope, window=window),
                               rtol=2e-5, atol=2e-5)
  with pytest.raises(ValueError, match="rope_local_base"):
    tiny_config(position="rope", rope_local_base=10.0)  # no window: no local layers


def test_softcap_needs_an_implementation_that_caps():
  refusal = r"attention_softcap=50.0 .*'pallas'.*not model.attention_impl='cudnn'"
  with pytest.raises(ValueError, match=refusal):
    tiny_config(attention_softcap=50.0, attention_impl="cudnn")
  for impl in ("xla", "chunked", "pallas", "auto"):  # each computes the cap (tests/nn/kernels)
    assert tiny_config(attention_softcap=50.0, attention_impl=impl).attention.softcap == 50.0
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
  assert all(("bias" in p) == cfg.attention.bias for p in params.values())
  y, state = module.apply({"params": params}, x, kv, mutable=["intermediates"], **call_kwargs)
  (weights,) = state["intermediates"]["attention_weights"]
  y_plain = module.apply({"params": params}, x, kv, **call_kwargs)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_plain))  # sowing changes nothing

  relative = not cross
  expected_y, expected_w = np_mha(
      to_numpy(params), x, kv, causal=case.get("causal", False),
      window=cfg.attention.window if case.get("causal") else None,
      q_seg=seg, kv_seg=kv_seg, positions=positions,
      rope=cfg.positions.kind if relative and cfg.positions.kind.startswith("rope") else None,
      slopes=_alibi_reference_slopes(cfg.attention.num_heads)
      if relative and cfg.positions.kind == "alibi" else None)
  weights = np.asarray(weights)
  assert weights.shape == (2, cfg.attention.num_heads, T, 7 if cross else T)
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


@pytest.mark.parametrize("overrides,patterns", [
    (dict(d_model=18, num_heads=4), ["model.d_model=18", "model.num_heads=4", "head_dim"]),
    (dict(num_heads=4, num_kv_heads=3), ["model.num_heads=4", "model.num_kv_heads=3"]),
    (dict(family="encoder", window=4), ["model.window=4", "model.family='encoder'",
                                        "model.window=None"]),
    (dict(window=0), ["model.window=0", "positive"]),
    (dict(head_dim=0), ["model.head_dim=0", "positive"]),
    (dict(num_kv_heads=0), ["model.num_kv_heads=0", "positive"]),
    (dict(num_heads=-2), ["model.num_heads=-2", "positive"]),
    (dict(qk_norm="batchnorm"), ["model.qk_norm='batchnorm'", "rmsnorm", "layernorm"]),
    (dict(window_pattern=2), ["model.window_pattern=2", "model.window=None"]),
    (dict(attention_softcap=-1.0), ["model.attention_softcap=-1.0", "positive"]),
    (dict(attention_dropout=1.5), ["model.attention_dropout=1.5", "[0, 1)"]),
])
def test_attention_section_rejects_bad_values_naming_the_flat_key(overrides, patterns):
  assert_owner_rejects("attention", overrides, patterns)
