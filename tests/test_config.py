"""tfjax/nn/config.py: every bad model config names the key, the value and the fix."""


import pytest

from conftest import tiny_config
from tfjax.nn.config import FAMILIES, FFNS, NORMS, PLACEMENTS, POSITIONS, ModelConfig, \
    default_model_config
from tfjax.nn.models import build_model


@pytest.mark.parametrize("overrides,patterns", [
    (dict(d_model=18, num_heads=4), ["model.d_model=18", "model.num_heads=4", "head_dim"]),
    (dict(num_heads=4, num_kv_heads=3), ["model.num_heads=4", "model.num_kv_heads=3"]),
    (dict(position="xpos"), ["model.position='xpos'", *POSITIONS]),
    (dict(norm="batchnorm"), ["model.norm='batchnorm'", *NORMS]),
    (dict(ffn="swish"), ["model.ffn='swish'", *FFNS]),
    (dict(family="decoder_only"), ["model.family='decoder_only'", *FAMILIES]),
    (dict(norm_placement="middle"), ["model.norm_placement='middle'", *PLACEMENTS]),
    (dict(remat="some"), ["model.remat='some'", "none", "full", "dots"]),
    (dict(attention_impl="flash"), ["model.attention_impl='flash'", "xla", "pallas"]),
    (dict(family="encoder", window=4), ["model.window=4", "model.family='encoder'",
                                        "model.window=None"]),
    (dict(window=0), ["model.window=0", "positive"]),
    (dict(position="rope", d_model=12, num_heads=4), ["model.position='rope'", "even", "3"]),
    (dict(dropout=1.0), ["model.dropout=1.0", "[0, 1)"]),
    (dict(num_layers=0), ["model.num_layers=0", "positive"]),
    (dict(head_dim=0), ["model.head_dim=0", "positive"]),
    (dict(num_kv_heads=0), ["model.num_kv_heads=0", "positive"]),
    (dict(num_heads=-2), ["model.num_heads=-2", "positive"]),
    (dict(d_ff=0), ["model.d_ff=0", "positive"]),
    (dict(family="encoder_decoder", num_decoder_layers=0),
     ["model.num_decoder_layers=0", "positive"]),
])
def test_config_validation_names_key_value_and_choices(overrides, patterns):
  with pytest.raises(ValueError) as info:
    tiny_config(**overrides)
  for pattern in patterns:
    assert pattern in str(info.value), (pattern, str(info.value))
  # The same checks guard every other way of building a model.
  with pytest.raises(ValueError):
    build_model({**dict(vocab_size=31, d_model=16, num_heads=2, d_ff=32), **overrides})
  with pytest.raises(ValueError):
    tiny_config().replace(**overrides)


def test_unknown_config_key_is_named_with_the_valid_keys():
  with pytest.raises(ValueError, match=r"unknown model config key\(s\) \['d_modle'\]; valid keys "
                                       r"are: .*'d_model'"):
    ModelConfig.from_config({"d_modle": 16})
  cfg = default_model_config(d_model=16, num_heads=2)
  cfg.nmu_layers = 3
  with pytest.raises(ValueError, match="nmu_layers"):
    build_model(cfg)
  with pytest.raises(ValueError, match="nmu_layers"):
    default_model_config(nmu_layers=3)


def test_config_dict_round_trip_builds_the_same_config():
  cfg = default_model_config(d_model=16, num_heads=2, num_kv_heads=1, window=3)
  built = ModelConfig.from_config(cfg)
  assert built.attention.kv_heads == 1 and built.window == 3 and built.dim_per_head == 8
  assert ModelConfig.from_config(default_model_config()) == ModelConfig()
