"""Tensor-layout rules of the family mappings (tfjax/hf/) against the layouts written out by hand
in NumPy: where each Hugging Face row lands, and that export inverts import exactly."""

from __future__ import annotations

import numpy as np

from tfjax.hf import gpt_neox, llama, mapping


def test_neox_interleaved_qkv_rows_are_head_then_qkv_then_channel():
  """GPT-NeoX's query_key_value row h*3E + j*E + e is head h's q (j=0) / k / v channel e."""
  heads, e, d = 3, 4, 5
  w = np.random.default_rng(0).normal(size=(heads * 3 * e, d))
  b = np.random.default_rng(1).normal(size=(heads * 3 * e,))
  w_rule = gpt_neox.interleaved_qkv("w", [("q",), ("k",), ("v",)], heads, weight=True)
  b_rule = gpt_neox.interleaved_qkv("b", [("q",), ("k",), ("v",)], heads, weight=False)
  kernels, biases = w_rule.to_tfjax([w]), b_rule.to_tfjax([b])
  for j in range(3):
    assert kernels[j].shape == (d, heads, e) and biases[j].shape == (heads, e)
    for h in range(heads):
      for c in range(e):
        np.testing.assert_array_equal(kernels[j][:, h, c], w[h * 3 * e + j * e + c])
        assert biases[j][h, c] == b[h * 3 * e + j * e + c]
  np.testing.assert_array_equal(w_rule.to_hf(kernels)[0], w)
  np.testing.assert_array_equal(b_rule.to_hf(biases)[0], b)


def test_heads_rules_invert():
  w = np.arange(24.0).reshape(6, 4)  # Linear [heads*E, D], 3 heads of 2
  rule = mapping.heads_in("w", ("k",), 3)
  (k,) = rule.to_tfjax([w])
  np.testing.assert_array_equal(k[:, 1, 0], w[2])  # head 1, channel 0 = row 1*2 + 0
  np.testing.assert_array_equal(rule.to_hf([k])[0], w)


def test_partial_rotary_fraction_read_from_legacy_and_rope_parameters():
  """GPT-NeoX's rotary_pct / rotary_emb_base, Phi's partial_rotary_factor, and the
  transformers-5 rope_parameters spelling give the same rotary_fraction and base; the family
  default applies when the field is absent, as in transformers' configs."""
  def read(values, **kw):
    return llama.rope_from_hf(mapping.Fields(values, "x"), 2048, **kw)
  neox = dict(theta_key="rotary_emb_base", fraction_key="rotary_pct", fraction_default=0.25)
  assert read({"rotary_pct": 0.5, "rotary_emb_base": 500}, **neox) == {
      "rope_base": 500.0, "rotary_fraction": 0.5}
  assert read({"rope_parameters": {"rope_theta": 500, "partial_rotary_factor": 0.5,
                                   "rope_type": "default"}}, **neox) == {
      "rope_base": 500.0, "rotary_fraction": 0.5}
  assert read({}, **neox) == {"rope_base": 10000.0, "rotary_fraction": 0.25}
  assert read({"partial_rotary_factor": 0.4}, fraction_default=0.5)["rotary_fraction"] == 0.4
  assert read({}, fraction_default=0.5)["rotary_fraction"] == 0.5
  assert "rotary_fraction" not in read({"rope_theta": 1e4})
