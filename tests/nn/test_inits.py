"""tfjax/nn/inits.py: model.init='xavier_uniform' draws every dense matrix from Glorot & Bengio's
U(-a, a), a = sqrt(6 / (fan_in + fan_out)) (the published formula, computed here from the matrix's
role, not from its array shape), and 'normal' keeps N(0, init_std^2)."""

import math

import jax
import numpy as np
import pytest

from conftest import fast_jit, tiny_config, unboxed
from tfjax.nn.norms import deepnorm_constants
from tfjax.nn.models import build_model

D, H, E, F, V = 48, 4, 12, 160, 37


def _init(**overrides):
  cfg = tiny_config(vocab_size=V, d_model=D, num_heads=H, d_ff=F, num_layers=2,
                    tie_embeddings=False, **overrides)
  tokens = np.zeros((1, 4), np.int32)
  init = fast_jit(lambda key: build_model(cfg).init(key, tokens)["params"])
  params = unboxed(init(jax.random.PRNGKey(0)))
  return cfg, params


def _kernels(params):
  """{role: [kernel, ...]} with each role's published (fan_in, fan_out)."""
  out = {}
  for layer in ("layers_0", "layers_1"):
    p = params["decoder"][layer]
    out.setdefault("qkv", []).extend(p["self_attention"][n]["kernel"]
                                     for n in ("query", "key", "value"))
    out.setdefault("out", []).append(p["self_attention"]["out"]["kernel"])
    out.setdefault("wi", []).append(p["ffn"]["wi"]["kernel"])
    out.setdefault("wo", []).append(p["ffn"]["wo"]["kernel"])
  out["lm_head"] = [params["lm_head"]["kernel"]]
  return out


FANS = {"qkv": (D, H * E), "out": (H * E, D), "wi": (D, F), "wo": (F, D), "lm_head": (D, V)}


def test_xavier_uniform_matches_glorots_bound_for_every_dense_matrix():
  _, params = _init(init="xavier_uniform")
  for role, kernels in _kernels(params).items():
    fan_in, fan_out = FANS[role]
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    w = np.concatenate([np.asarray(k).ravel() for k in kernels])
    assert np.abs(w).max() <= bound * (1 + 1e-6), role
    assert np.abs(w).max() > 0.97 * bound, role  # uniform: the extremes are reached
    # U(-a, a) has variance a^2 / 3 and E|w| = a / 2 (a normal of that variance: 0.461 a).
    np.testing.assert_allclose(w.var(), bound ** 2 / 3, rtol=0.08, err_msg=role)
    np.testing.assert_allclose(np.abs(w).mean(), bound / 2, rtol=0.04, err_msg=role)


def test_normal_init_keeps_init_std_and_xavier_ignores_it():
  _, params = _init(init_std=0.05)
  for role, kernels in _kernels(params).items():
    w = np.concatenate([np.asarray(k).ravel() for k in kernels])
    np.testing.assert_allclose(w.std(), 0.05, rtol=0.08, err_msg=role)
  _, xavier = _init(init="xavier_uniform", init_std=0.05)
  w = np.asarray(_kernels(xavier)["wi"][0])
  np.testing.assert_allclose(w.std(), math.sqrt(6.0 / (D + F) / 3), rtol=0.08)


def test_deepnorm_beta_scales_the_xavier_bound_of_value_out_and_ffn_only():
  cfg, params = _init(init="xavier_uniform", norm_placement="deepnorm")
  _, beta = deepnorm_constants(cfg, decoder_stack=True)
  assert beta < 1
  p = params["decoder"]["layers_0"]
  for kernel, (fan_in, fan_out), gain in (
      (p["self_attention"]["query"]["kernel"], FANS["qkv"], 1.0),
      (p["self_attention"]["value"]["kernel"], FANS["qkv"], beta),
      (p["self_attention"]["out"]["kernel"], FANS["out"], beta),
      (p["ffn"]["wi"]["kernel"], FANS["wi"], beta)):
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    assert bound * 0.95 < np.abs(np.asarray(kernel)).max() <= bound * (1 + 1e-6)


def test_bad_init_and_xavier_with_scaled_residual_are_errors():
  with pytest.raises(ValueError, match="model.init='glorot'.*xavier_uniform"):
    tiny_config(init="glorot")
  with pytest.raises(ValueError, match="scaled_residual_init=True.*xavier_uniform"):
    tiny_config(init="xavier_uniform", scaled_residual_init=True)
  with pytest.raises(ValueError, match="position_init_std=0"):
    tiny_config(position_init_std=0.0)
