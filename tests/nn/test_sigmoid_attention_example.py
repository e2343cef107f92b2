"""examples/sigmoid_attention.py, the attention kind defined outside the package
(docs/attention/README.md): the block it makes against Ramapuram et al. 2024's formula written
here in NumPy, out_t = sum_s sigmoid(q_t.k_s / sqrt(E) + b) v_s with b = -log(n), where n is each
row's actual length (AttentionKind.lengths, Visibility.sequence_lengths), not model.max_len."""

import importlib.util
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from np_reference import rand
from tfjax.nn import attention_kinds
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.masks import Visibility

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "sigmoid_attention.py")


@pytest.fixture
def sigmoid_kind():
  """The example file imported as a user's --import does (it registers the kind), and the kind
  taken out of the registry afterwards, so no other test sees it."""
  name = "sigmoid_attention_under_test"
  spec = importlib.util.spec_from_file_location(name, EXAMPLE)
  module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
  spec.loader.exec_module(module)
  yield module
  del attention_kinds.ATTENTION_KINDS[module.NAME], sys.modules[name]


def np_sigmoid_block(p, x, n_B, bias=None, causal=True, valid_BxT=None):
  """The block from the paper's formula: projections, sigmoid attention with b = -log(n_b) per row
  (or the fixed `bias`), output projection. float64 [B, T, D]."""
  proj = lambda name: np.einsum("btd,dhk->bthk", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query"), proj("key"), proj("value")
  t = x.shape[1]
  b_B = -np.log(np.asarray(n_B, np.float64)) if bias is None else np.full(len(n_B), bias)
  scores = np.einsum("bthe,bshe->bhts", q, k) / np.sqrt(q.shape[-1]) + b_B[:, None, None, None]
  weights = 1.0 / (1.0 + np.exp(-scores))
  visible = np.tril(np.ones((t, t))) if causal else np.ones((t, t))
  visible = np.broadcast_to(visible, (x.shape[0], t, t))
  if valid_BxT is not None:  # padding keys are hidden
    visible = visible * valid_BxT[:, None, :]
  weights = weights * visible[:, None]
  o = np.einsum("bhts,bshe->bthe", weights, v)
  return np.einsum("bthe,hed->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_the_kind_matches_the_papers_formula_with_b_minus_log_of_the_row_length(sigmoid_kind):
  cfg = tiny_config(attention_kind="sigmoid", position="none")
  block = MultiHeadAttention(cfg, causal=True)
  x = rand((2, 6, cfg.d_model))
  params = random_params(block, x)
  p = to_numpy(params)
  # The second row holds 4 tokens and 2 pads (segment id 0): its n is 4, the first row's 6.
  seg_BxT = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], np.int32)
  got = np.asarray(block.apply({"params": params}, x, q_segment_ids=jnp.asarray(seg_BxT),
                               kv_segment_ids=jnp.asarray(seg_BxT)), np.float64)
  want = np_sigmoid_block(p, np.asarray(x, np.float64), [6, 4], valid_BxT=seg_BxT)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got[1, :4], want[1, :4], atol=1e-5, rtol=1e-5)  # real tokens
  # b from model.max_len (16) or from the padded width (6) instead is a different block: the
  # comparison above can tell the actual length from either.
  for wrong_n in ([16, 16], [6, 6]):
    wrong = np_sigmoid_block(p, np.asarray(x, np.float64), wrong_n, valid_BxT=seg_BxT)
    assert np.abs(wrong[1, :4] - want[1, :4]).max() > 1e-3


def test_a_fixed_sigmoid_bias_replaces_minus_log_n(sigmoid_kind):
  cfg = tiny_config(attention_kind="sigmoid", position="none", sigmoid_bias=-1.5)
  block = MultiHeadAttention(cfg, causal=False)
  x = rand((1, 5, cfg.d_model), seed=3)
  params = random_params(block, x, seed=3)
  got = np.asarray(block.apply({"params": params}, x), np.float64)
  want = np_sigmoid_block(to_numpy(params), np.asarray(x, np.float64), [5], bias=-1.5,
                          causal=False)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match=r"model\.sigmoid_bias=inf must be a finite number"):
    tiny_config(attention_kind="sigmoid", position="none", sigmoid_bias=float("inf"))


def test_sequence_lengths_count_each_querys_own_segment_without_padding():
  seg_BxT = jnp.asarray([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
  lengths = Visibility(causal=True, q_segment_ids_BxT=seg_BxT,
                       kv_segment_ids_BxS=seg_BxT).sequence_lengths(6, 6)
  # packed row: 2 and 3 keys; a pad query counts 1 (so -log n stays finite); a causal mask does
  # not shorten n
  np.testing.assert_array_equal(np.asarray(lengths), [[2, 2, 3, 3, 3, 1], [6] * 6])
  np.testing.assert_array_equal(np.asarray(Visibility().sequence_lengths(3, 7)), [[7, 7, 7]])
  decode = Visibility(kv_segment_ids_BxS=jnp.asarray([[1, 1, 1, 0, 0]]))  # 3 of 5 slots cached
  np.testing.assert_array_equal(np.asarray(decode.sequence_lengths(1, 5)), [[3]])

