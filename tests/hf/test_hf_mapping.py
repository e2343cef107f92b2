"""Tensor-layout rules of the family mappings (tfjax/hf/) against the layouts written out by hand
in NumPy: where each Hugging Face row lands, and that export inverts import exactly."""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.models import falcon, gpt_neox, phi3
from tfjax.nn.rope_config import RopeConfig


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


def test_phi3_fused_rows_are_query_key_value_and_gate_up_blocks():
  """Phi-3's qkv_proj rows: H query heads, then K key heads, then K value heads (E rows each);
  gate_up_proj rows: the gate's F, then up's F."""
  heads, kv, e, d, f = 4, 2, 3, 5, 6
  w = np.random.default_rng(2).normal(size=((heads + 2 * kv) * e, d))
  rule = phi3.stacked_heads("w", [("q",), ("k",), ("v",)], (heads, kv, kv), e)
  q, k, v = rule.to_tfjax([w])
  assert q.shape == (d, heads, e) and k.shape == v.shape == (d, kv, e)
  np.testing.assert_array_equal(q[:, 3, 1], w[3 * e + 1])
  np.testing.assert_array_equal(k[:, 1, 2], w[heads * e + 1 * e + 2])
  np.testing.assert_array_equal(v[:, 0, 0], w[(heads + kv) * e])
  np.testing.assert_array_equal(rule.to_hf([q, k, v])[0], w)
  gu = np.random.default_rng(3).normal(size=(2 * f, d))
  rule = phi3.stacked_linear("gu", [("gate",), ("up",)])
  gate, up = rule.to_tfjax([gu])
  np.testing.assert_array_equal(gate, gu[:f].T)
  np.testing.assert_array_equal(up, gu[f:].T)
  np.testing.assert_array_equal(rule.to_hf([gate, up])[0], gu)


def test_falcon_grouped_qkv_rows_per_kv_group():
  """Falcon's query_key_value: per kv group g, its G = H/K query heads, its key, its value (E rows
  each); K = 1 is multi-query, K = H the per-head [q, k, v] layout."""
  e, d = 3, 5
  for heads, kv in ((4, 2), (4, 1), (4, 4)):
    g = heads // kv
    w = np.random.default_rng(heads + kv).normal(size=(kv * (g + 2) * e, d))
    b = np.random.default_rng(7).normal(size=(kv * (g + 2) * e,))
    rule = falcon.grouped_qkv("w", [("q",), ("k",), ("v",)], heads, kv, weight=True)
    q, k, v = rule.to_tfjax([w])
    assert q.shape == (d, heads, e) and k.shape == v.shape == (d, kv, e)
    row = lambda grp, slot, c: (grp * (g + 2) + slot) * e + c
    for h in range(heads):
      np.testing.assert_array_equal(q[:, h, 1], w[row(h // g, h % g, 1)])
    for grp in range(kv):
      np.testing.assert_array_equal(k[:, grp, 2], w[row(grp, g, 2)])
      np.testing.assert_array_equal(v[:, grp, 0], w[row(grp, g + 1, 0)])
    np.testing.assert_array_equal(rule.to_hf([q, k, v])[0], w)
    brule = falcon.grouped_qkv("b", [("q",), ("k",), ("v",)], heads, kv, weight=False)
    bq, bk, bv = brule.to_tfjax([b])
    assert bq[heads - 1, 0] == b[row(kv - 1, g - 1, 0)] and bv[0, 2] == b[row(0, g + 1, 2)]
    np.testing.assert_array_equal(brule.to_hf([bq, bk, bv])[0], b)


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
    return RopeConfig.from_hf(mapping.Fields(values, "x"), 2048, **kw)
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
