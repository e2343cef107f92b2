"""tfjax/nn/ffn.py: every `model.ffn` kind against its published formula written in NumPy."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_owner_rejects, random_params, tiny_config, to_numpy
from np_reference import _erf, np_ffn, NP_FFNS, np_gelu, np_gelu_tanh, rand

from tfjax.nn.ffn import FFNS, FeedForward, gelu

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


# kind -> (activation, gated)


def test_gelu_tanh_is_the_published_approximation_and_differs_from_exact():
  x = np.linspace(-6, 6, 97).astype(np.float32)
  np.testing.assert_allclose(np.asarray(gelu(x, approximate=True)), np_gelu_tanh(x), atol=2e-6)
  np.testing.assert_allclose(np.asarray(gelu(x)), np_gelu(x), atol=2e-6)
  # The two differ by at most 4.7e-4 (at |x| ~ 2.7): close, but not the same function.
  assert 1e-4 < np.max(np.abs(np_gelu_tanh(x) - np_gelu(x))) < 1e-3


@pytest.mark.parametrize("kind", ["gelu_tanh", "silu", "geglu_tanh", "reglu", "glu", "bilinear"])
def test_new_ffn_kinds_match_numpy(kind):
  cfg = tiny_config(ffn=kind)
  x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype(np.float32) * 2
  module = FeedForward(cfg)
  params = random_params(module, x, seed=1, scale=0.5)
  assert set(params) == ({"wi", "wi_gate", "wo"} if NP_FFNS[kind][1] else {"wi", "wo"})
  p = to_numpy(params)
  y = np.asarray(module.apply({"params": params}, x))
  np.testing.assert_allclose(y, np_ffn(x, p, kind), rtol=1e-5, atol=1e-5)
  twin = {"gelu_tanh": "gelu", "geglu_tanh": "geglu", "silu": "relu", "reglu": "swiglu",
          "glu": "swiglu", "bilinear": "reglu"}[kind]
  assert not np.allclose(y, np_ffn(x, p, twin), rtol=1e-5, atol=1e-5)


def test_bad_ffn_names_the_choices():
  with pytest.raises(ValueError, match="model.ffn='gelu_new'.*gelu_tanh"):
    tiny_config(ffn="gelu_new")


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
    assert not np.allclose(y, np_ffn(x, p, kind + "_tanh" if kind == "geglu" else "gelu_tanh"),
                           rtol=1e-5, atol=1e-5)
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


@pytest.mark.parametrize("overrides,patterns", [
    (dict(ffn="swish"), ["model.ffn='swish'", *FFNS]),
    (dict(d_ff=0), ["model.d_ff=0", "positive"]),
])
def test_ffn_section_rejects_bad_values_naming_the_flat_key(overrides, patterns):
  assert_owner_rejects("feed_forward", overrides, patterns)
