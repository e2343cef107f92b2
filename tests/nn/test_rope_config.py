"""tfjax/nn/rope_config.py: RoPE's config section rejects bad rope_* keys by their flat names, and
its Hugging Face spelling translates both ways."""

import pytest

from conftest import assert_owner_rejects, tiny_config

from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.rope_config import RopeConfig


@pytest.mark.parametrize("overrides,patterns", [
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=0.5),
     ["model.rope_scaling_factor=0.5", ">= 1"]),
    (dict(position="rope", rope_scaling="dynamic"), ["model.rope_scaling='dynamic'",
                                                     "model.rope_original_max_len"]),
    (dict(position="rope", rope_beta_fast=8.0), ["model.rope_beta_fast=8.0", "yarn"]),
    (dict(position="rope", rope_scaling="ntk"), ["model.rope_scaling='ntk'", "llama3"]),
    (dict(rope_scaling="yarn"), ["model.rope_scaling='yarn'", "model.position='learned'"]),
    (dict(position="rope", rotary_fraction=0.1), ["model.rotary_fraction=0.1", "even"]),
    (dict(position="rope", rope_local_base=1e4), ["model.rope_local_base=10000.0", "window"]),
])
def test_rope_section_rejects_bad_values_naming_the_flat_key(overrides, patterns):
  """RoPE's section is nested in the positions section, which validates it."""
  assert_owner_rejects("positions", overrides, patterns)


@pytest.mark.parametrize("rope_keys", [
    dict(rope_base=5e5),
    dict(rope_scaling="linear", rope_scaling_factor=4.0),
    dict(rope_scaling="dynamic", rope_scaling_factor=2.0, rope_original_max_len=8),
    dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_original_max_len=8,
         rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_base=5e5),
    dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=8,
         rope_beta_fast=16.0, rope_beta_slow=2.0, rope_attention_factor=1.2),
    dict(rotary_fraction=0.5),
])
def test_hf_rope_parameters_translate_back_to_the_same_section(rope_keys):
  rope = tiny_config(position="rope", **rope_keys).positions.rope
  hf = rope.to_hf()
  assert hf["rope_parameters"]["rope_theta"] == rope.base
  back = RopeConfig.from_hf(Fields(hf, "llama"), max_len=16)
  assert RopeConfig.from_flat(back) == rope


def test_hf_rope_types_tfjax_lacks_are_named():
  with pytest.raises(UnsupportedError, match="'longrope'"):
    RopeConfig.from_hf(Fields({"rope_scaling": {"rope_type": "longrope"}}, "phi3"), 4096)
