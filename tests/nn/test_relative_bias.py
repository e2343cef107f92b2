"""tfjax/nn/relative_bias.py: T5's bucket function on hand-computed offsets and against a NumPy
transcription of Raffel et al.'s Mesh TensorFlow `_relative_position_bucket`; the bias in
attention, one table per stack."""

import math

import jax
import numpy as np
import pytest

from conftest import random_params, tiny_config, to_numpy
from test_attention import np_attention
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.layers import LayerStack
from tfjax.nn.relative_bias import relative_position_bucket, t5_bias


def np_bucket(rel, bidirectional, num_buckets, max_distance):
  """One offset (key - query) at a time, as in the T5 paper's reference code."""
  n, ret = num_buckets, 0
  if bidirectional:
    n //= 2
    ret += n if rel > 0 else 0
    rel = abs(rel)
  else:
    rel = max(-rel, 0)
  max_exact = n // 2
  if rel < max_exact:
    return ret + rel
  large = max_exact + int(math.log(rel / max_exact) / math.log(max_distance / max_exact)
                          * (n - max_exact))
  return ret + min(large, n - 1)


# (offset, bidirectional) -> bucket for T5's 32 buckets, max_distance 128, worked by hand:
# bidirectional: 16 per side, 8 exact; causal: 32, 16 exact; log-spaced beyond.
KNOWN = {(0, True): 0, (-1, True): 1, (1, True): 17, (-7, True): 7, (-8, True): 8,
         (-16, True): 10, (16, True): 26, (-127, True): 15, (-1000, True): 15, (1000, True): 31,
         (0, False): 0, (3, False): 0, (-1, False): 1, (-15, False): 15, (-16, False): 16,
         (-32, False): 21, (-200, False): 31}


def test_bucket_function_known_values_and_reference():
  for (rel, bidirectional), bucket in KNOWN.items():
    assert np_bucket(rel, bidirectional, 32, 128) == bucket, (rel, bidirectional)
    got = relative_position_bucket(np.array([rel]), bidirectional=bidirectional, num_buckets=32,
                                   max_distance=128)
    assert int(got[0]) == bucket, (rel, bidirectional)
  rel = np.arange(-300, 300)
  for bidirectional in (True, False):
    for buckets, distance in ((32, 128), (8, 20)):
      got = np.asarray(relative_position_bucket(rel, bidirectional=bidirectional,
                                                num_buckets=buckets, max_distance=distance))
      expected = [np_bucket(int(r), bidirectional, buckets, distance) for r in rel]
      np.testing.assert_array_equal(got, expected)


def np_t5_bias(table, T, S, bidirectional, max_distance):
  bias = np.zeros((table.shape[1], T, S))
  for i in range(T):
    for j in range(S):
      bias[:, i, j] = table[np_bucket(j - i, bidirectional, table.shape[0], max_distance)]
  return bias


@pytest.mark.parametrize("causal", [False, True])
def test_attention_adds_the_bucketed_bias(causal):
  cfg = tiny_config(position="t5_bias", relative_buckets=8, relative_max_distance=6,
                    attention_scale=1.0, attention_bias=False)
  x = np.random.default_rng(0).normal(size=(2, 7, 16)).astype(np.float32)
  table = np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32)
  module = MultiHeadAttention(cfg, causal=causal)
  params = random_params(module, x, relative_table=table, seed=2, scale=0.4)
  y = np.asarray(module.apply({"params": params}, x, relative_table=table))
  bias = np_t5_bias(table.astype(np.float64), 7, 7, not causal, 6)
  expected = np_attention(to_numpy(params), x, causal=causal, scale=1.0, bias=bias)
  np.testing.assert_allclose(y, expected, rtol=2e-5, atol=2e-5)
  got_bias = t5_bias(table, np.arange(7)[None], np.arange(7)[None], bidirectional=not causal,
                     max_distance=6)
  np.testing.assert_allclose(np.asarray(got_bias)[0], bias, rtol=1e-6)


def test_one_table_per_stack_shared_by_its_layers():
  cfg = tiny_config(position="t5_bias", num_layers=3)
  x = np.zeros((1, 4, 16), np.float32)
  params = jax.eval_shape(LayerStack(cfg, 3, causal=True).init, jax.random.PRNGKey(0), x)
  params = params["params"]
  assert params["relative_bias"]["embedding"].value.shape == (32, 2)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  assert sum("relative_bias" in jax.tree_util.keystr(p) for p, _ in flat) == 1


@pytest.mark.parametrize("overrides,match", [
    (dict(relative_buckets=16), "read by position='t5_bias' only"),
    (dict(position="t5_bias", relative_buckets=2), ">= 4"),
    (dict(position="t5_bias", relative_max_distance=16), "must exceed"),
    (dict(position="t5_bias", attention_impl="chunked"), "attention_impl='xla'"),
    (dict(scale_tied_logits=True, tie_embeddings=False), "tie_embeddings=True"),
])
def test_t5_keys_are_validated(overrides, match):
  with pytest.raises(ValueError, match=match):
    tiny_config(**overrides)
