"""tfjax/nn/ffn.py: every `model.ffn` kind against its published formula written in NumPy."""

import math

import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from tfjax.nn.ffn import FeedForward, gelu

_erf = np.vectorize(math.erf)


def np_gelu_exact(x):
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
    "relu": (np_relu, False), "gelu": (np_gelu_exact, False), "gelu_tanh": (np_gelu_tanh, False),
    "silu": (np_silu, False), "swiglu": (np_silu, True), "geglu": (np_gelu_exact, True),
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


def test_gelu_tanh_is_the_published_approximation_and_differs_from_exact():
  x = np.linspace(-6, 6, 97).astype(np.float32)
  np.testing.assert_allclose(np.asarray(gelu(x, approximate=True)), np_gelu_tanh(x), atol=2e-6)
  np.testing.assert_allclose(np.asarray(gelu(x)), np_gelu_exact(x), atol=2e-6)
  # The two differ by at most 4.7e-4 (at |x| ~ 2.7): close, but not the same function.
  assert 1e-4 < np.max(np.abs(np_gelu_tanh(x) - np_gelu_exact(x))) < 1e-3


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
