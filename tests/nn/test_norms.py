"""tfjax/nn/norms.py: the norm switches against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_owner_rejects, random_params, tiny_config, to_numpy
from np_reference import np_norm, rand

from tfjax.nn.norms import NORMS, PLACEMENTS, Norm, deepnorm_constants, stack_config

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


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
                     "rmsnorm", cfg.norms.eps)
  np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("overrides,patterns", [
    (dict(norm="batchnorm"), ["model.norm='batchnorm'", *NORMS]),
    (dict(norm_placement="middle"), ["model.norm_placement='middle'", *PLACEMENTS]),
    (dict(parallel_shared_norm=False), ["model.parallel_shared_norm=False",
                                        "model.parallel_block=True"]),
    (dict(parallel_block=True, norm_placement="post"), ["model.parallel_block=True",
                                                        "model.norm_placement='pre'"]),
])
def test_norm_section_rejects_bad_values_naming_the_flat_key(overrides, patterns):
  assert_owner_rejects("norms", overrides, patterns)


def test_stack_config_carries_each_stacks_deepnorm_constants():
  """The norms section computes DeepNorm's alpha and beta from the layer counts, per stack; every
  other placement leaves the config as it is."""
  cfg = tiny_config(family="encoder_decoder", norm_placement="deepnorm", num_layers=6,
                    num_decoder_layers=12)
  for decoder_stack in (False, True):
    norms = stack_config(cfg, decoder_stack).norms
    assert (norms.residual_alpha, norms.init_gain) == deepnorm_constants(cfg, decoder_stack)
  assert stack_config(cfg, True).norms.residual_alpha == pytest.approx(36 ** 0.25)
  assert cfg.norms.residual_alpha == cfg.norms.init_gain == 1.0  # the model's own config
  plain = tiny_config()
  assert stack_config(plain, True) is plain
