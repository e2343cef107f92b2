"""tfjax/nn/norms.py: the norm switches against NumPy."""

import jax
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from tfjax.nn.norms import Norm


def np_norm(x, p, kind, eps, unit_offset):
  x = np.asarray(x, np.float64)
  if kind == "layernorm":
    x = x - x.mean(-1, keepdims=True)
  y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
  y = y * ((1.0 + p["scale"]) if unit_offset else p["scale"])
  return y + p["bias"] if "bias" in p else y


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_unit_offset_norm_is_one_plus_w(kind):
  """Gemma's RMSNorm: x / rms(x) * (1 + w), with w starting at 0."""
  cfg = tiny_config(norm=kind, norm_unit_offset=True, norm_eps=1e-6)
  x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype(np.float32) * 3 + 1
  module = Norm(cfg)
  init = module.init(jax.random.PRNGKey(0), x)["params"]
  np.testing.assert_array_equal(np.asarray(to_numpy(init)["scale"]), 0.0)
  params = random_params(module, x, seed=1)
  y = np.asarray(module.apply({"params": params}, x))
  p = to_numpy(params)
  np.testing.assert_allclose(y, np_norm(x, p, kind, 1e-6, True), rtol=1e-5, atol=1e-5)
  assert not np.allclose(y, np_norm(x, p, kind, 1e-6, False), rtol=1e-3, atol=1e-3)
