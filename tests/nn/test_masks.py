"""tfjax/nn/masks.py: attention visibility masks and the ALiBi bias, against loops written here."""

import numpy as np
import pytest

from tfjax.nn import masks


def np_visible(t, s, *, q_len, kv_len, causal=False, window=None, q_seg=None, kv_seg=None):
  """Query t (at position t + kv_len - q_len) may see key s: the rule each mask encodes."""
  i = t + kv_len - q_len
  ok = True
  if causal or window is not None:
    ok &= s <= i
    if window is not None:
      ok &= i - s < window
  if q_seg is not None and kv_seg is not None:
    ok &= q_seg[t] == kv_seg[s] and kv_seg[s] != 0
  return ok


@pytest.mark.parametrize("q_len,kv_len,causal,window", [
    (5, 5, True, None), (3, 7, True, None), (6, 6, False, 2), (4, 9, True, 3)])
def test_visibility_mask_follows_the_rule_for_every_pair(q_len, kv_len, causal, window):
  mask = np.asarray(masks.visibility_mask(q_len=q_len, kv_len=kv_len, causal=causal,
                                          window=window))
  assert mask.shape == (1, 1, q_len, kv_len)
  want = [[np_visible(t, s, q_len=q_len, kv_len=kv_len, causal=causal, window=window)
           for s in range(kv_len)] for t in range(q_len)]
  np.testing.assert_array_equal(mask[0, 0], want)


def test_segment_ids_confine_attention_and_hide_padding():
  seg = np.array([[1, 1, 2, 2, 0]])
  mask = np.asarray(masks.visibility_mask(q_len=5, kv_len=5, causal=True, q_segment_ids=seg,
                                          kv_segment_ids=seg))[0, 0]
  want = [[np_visible(t, s, q_len=5, kv_len=5, causal=True, q_seg=seg[0], kv_seg=seg[0])
           for s in range(5)] for t in range(5)]
  np.testing.assert_array_equal(mask, want)
  assert not mask[:, 4].any() and not mask[4].any()  # the pad token is neither seen nor sees


def test_no_constraint_is_no_mask():
  assert masks.visibility_mask(q_len=3, kv_len=4) is None


def test_alibi_bias_is_minus_slope_times_distance():
  slopes = np.array([0.5, 0.25], np.float32)
  bias = np.asarray(masks.alibi_bias(slopes, q_len=3, kv_len=5))
  assert bias.shape == (1, 2, 3, 5)
  for h, m in enumerate(slopes):
    for t in range(3):
      for s in range(5):
        assert bias[0, h, t, s] == pytest.approx(-m * abs(t + 2 - s))


def test_default_positions_offset_and_batch():
  np.testing.assert_array_equal(masks.default_positions(3, batch=2, offset=4), [[4, 5, 6]] * 2)


def test_mask_value_underflows_softmax_but_stays_finite_after_adding_scores():
  assert np.isfinite(np.float32(masks.MASK_VALUE) * 1.3)  # room for scores added to it
  assert np.exp(np.float64(masks.MASK_VALUE)) == 0.0
