"""tfjax/nn/layers.py: residual structures (sandwich, parallel, DeepNorm) and per-layer window
patterns, against NumPy layers composed from the block references of test_attention/test_norms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from np_reference import np_layer, np_norm, rand
from test_attention import np_attention

from tfjax.nn.layers import LayerStack, TransformerLayer
from tfjax.training.parallel import cpu_fusion

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


def np_ffn(x, p):  # ffn="gelu_tanh"
  h = x @ p["wi"]["kernel"] + p["wi"]["bias"]
  h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
  return h @ p["wo"]["kernel"] + p["wo"]["bias"]


def run_layer(cfg, x, seed=1):
  layer = TransformerLayer(cfg, causal=True)
  params = random_params(layer, x, seed=seed, scale=0.4)
  return np.asarray(layer.apply({"params": params}, x)), to_numpy(params)


def test_sandwich_norm_is_pre_and_post_norm_around_each_sublayer():
  """Gemma 2: x + post_norm(f(pre_norm(x))), with (1 + w) RMSNorms."""
  cfg = tiny_config(norm_placement="sandwich", norm="rmsnorm", norm_unit_offset=True,
                    ffn="gelu_tanh")
  x = rand((2, 4, 16), seed=2)
  y, p = run_layer(cfg, x)
  n = lambda h, name: np_norm(h, p[name], "rmsnorm", cfg.norms.eps, True)
  h = x + n(np_attention(p["self_attention"], n(x, "self_attention_norm")),
            "self_attention_post_norm")
  expected = h + n(np_ffn(n(h, "ffn_norm"), p["ffn"]), "ffn_post_norm")
  np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)


def test_window_pattern_makes_every_nth_layer_global():
  """window_pattern=2 (Gemma 2): layers 0 and 2 slide over 2 keys, layer 1 sees all."""
  cfg = tiny_config(num_layers=3, window=2, window_pattern=2)
  assert [cfg.attention.is_sliding_layer(i) for i in range(4)] == [True, False, True, False]
  assert [tiny_config(window=2).attention.is_sliding_layer(i) for i in range(2)] == [True, True]
  x = rand((1, 5, 16), seed=3)
  stack = LayerStack(cfg, cfg.num_layers, causal=True)
  params = random_params(stack, x, seed=4)
  _, state = stack.apply({"params": params}, x, mutable=["intermediates"])
  weights = {name: np.asarray(v["self_attention"]["attention_weights"][0])
             for name, v in state["intermediates"].items()}
  i, j = np.arange(5)[:, None], np.arange(5)[None, :]
  for name, sliding in (("layers_0", True), ("layers_1", False), ("layers_2", True)):
    visible = (j <= i) & ((i - j < 2) if sliding else True)
    assert np.all((weights[name][0] > 0) == visible[None]), name


@pytest.mark.parametrize("overrides,match", [
    (dict(window_pattern=2), "set a window"),
    (dict(window=4, window_pattern=2, scan_layers=True), "scan_layers=False"),
    (dict(norm_placement="sandwiches"), "model.norm_placement='sandwiches' is invalid"),
])
def test_layer_keys_are_validated(overrides, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**overrides)


@pytest.mark.parametrize("shared", [True, False])
def test_parallel_block_matches_numpy(shared):
  """GPT-J / Falcon-7B (one norm) and GPT-NeoX (two): x + attn(norm(x)) + ffn(norm'(x))."""
  cfg = tiny_config(parallel_block=True, parallel_shared_norm=shared, ffn="gelu_tanh")
  x = rand((2, 4, 16), seed=5)
  y, p = run_layer(cfg, x)
  n = lambda h, name: np_norm(h, p[name], "layernorm", cfg.norms.eps, False)
  assert ("ffn_norm" in p) == (not shared)
  ffn_in = n(x, "self_attention_norm" if shared else "ffn_norm")
  expected = x + np_attention(p["self_attention"], n(x, "self_attention_norm")) + np_ffn(
      ffn_in, p["ffn"])
  np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)


def test_deepnorm_constants_are_the_published_formulas():
  from tfjax.nn.norms import deepnorm_constants
  cfg = tiny_config(norm_placement="deepnorm", num_layers=18)
  assert deepnorm_constants(cfg, False) == pytest.approx((36 ** 0.25, 144 ** -0.25))
  cfg = tiny_config(family="encoder_decoder", norm_placement="deepnorm", num_layers=6,
                    num_decoder_layers=12)
  assert deepnorm_constants(cfg, False) == pytest.approx(
      (0.81 * (6 ** 4 * 12) ** (1 / 16), 0.87 * (6 ** 4 * 12) ** (-1 / 16)))
  assert deepnorm_constants(cfg, True) == pytest.approx((36 ** 0.25, 144 ** -0.25))
  assert deepnorm_constants(tiny_config(), True) == (1.0, 1.0)
  # 1000 decoder-only layers: alpha = 2000^(1/4) = 6.687, beta = 8000^(-1/4) = 0.1057.
  assert deepnorm_constants(tiny_config(norm_placement="deepnorm", num_layers=1000),
                            False) == pytest.approx((6.687, 0.1057), abs=1e-3)


def test_deepnorm_layer_is_post_norm_of_alpha_x_plus_f_and_beta_scales_the_init():
  cfg = tiny_config(norm_placement="deepnorm", num_layers=2, ffn="gelu_tanh")
  alpha, beta = 4 ** 0.25, 16 ** -0.25
  x = rand((2, 4, 16), seed=6)
  stack = LayerStack(cfg, 2, causal=True)
  params = random_params(stack, x, seed=7, scale=0.3)
  y = np.asarray(stack.apply({"params": params}, x))
  p = to_numpy(params)
  h = np.asarray(x, np.float64)
  for i in range(2):
    q = p[f"layers_{i}"]
    n = lambda v, name: np_norm(v, q[name], "layernorm", cfg.norms.eps, False)
    h = n(alpha * h + np_attention(q["self_attention"], h), "self_attention_norm")
    h = n(alpha * h + np_ffn(h, q["ffn"]), "ffn_norm")
  np.testing.assert_allclose(y, h, rtol=2e-5, atol=2e-5)
  assert "final_norm" not in p
  # Init: the same draws as a post-norm stack, times beta on W_V, W_O and the FFN only.
  key = jax.random.PRNGKey(3)
  deep = to_numpy(stack.init(key, x)["params"])["layers_0"]
  post = to_numpy(LayerStack(cfg.replace(norm_placement="post"), 2, causal=True).init(key, x)[
      "params"])["layers_0"]
  for path in (("self_attention", "value"), ("self_attention", "out"), ("ffn", "wi"),
               ("ffn", "wo")):
    np.testing.assert_allclose(deep[path[0]][path[1]]["kernel"],
                               beta * post[path[0]][path[1]]["kernel"], rtol=1e-6)
  for name in ("query", "key"):
    np.testing.assert_array_equal(deep["self_attention"][name]["kernel"],
                                  post["self_attention"][name]["kernel"])


@pytest.mark.parametrize("overrides,match", [
    (dict(parallel_block=True, norm_placement="post"), "norm_placement='pre'"),
    (dict(parallel_block=True, family="encoder_decoder"), "no cross-attention"),
    (dict(parallel_shared_norm=False), "parallel_block=True"),
    (dict(norm_placement="deepnorm", scaled_residual_init=True), "scaled_residual_init=False"),
])
def test_residual_keys_are_validated(overrides, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**overrides)


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


@pytest.mark.parametrize("placement,ffn", [("pre", "gelu"), ("post", "swiglu")])
def test_transformer_layer_gradients_match_finite_differences(placement, ffn, fusion_policy):
  """Directional derivatives of the layer, with the residual gradients going through the CPU
  fusion boundary's custom JVP (tfjax.training.parallel.cpu_fusion), agree with central differences along random
  directions."""
  fusion_policy("on")
  cfg = tiny_config(norm_placement=placement, ffn=ffn, num_heads=4, num_kv_heads=2)
  x = jnp.asarray(rand((2, 5, 16), seed=25))
  cot = jnp.asarray(rand((2, 5, 16), seed=26))
  layer = TransformerLayer(cfg, causal=True)
  params = random_params(layer, x, seed=27, scale=0.3)
  f = lambda p, x: jnp.sum(layer.apply({"params": p}, x) * cot)
  # Jitted: 12 evaluations of f, op by op eagerly, took most of this test's ~20 s.
  grads = jax.jit(jax.grad(cpu_fusion.applied(f), argnums=(0, 1)))(params, x)
  f = jax.jit(f)
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
