"""tfjax/research/mrr.py: Kazemnejad et al.'s mean reciprocal rank vs hand-computed examples."""

import pytest

from tfjax.research import mrr


def test_mean_reciprocal_rank_of_a_hand_ranked_example():
  # Three settings (task x length), three arms; accuracy, higher is better.
  settings = {
      ("copy", 12): {"none": 0.9, "rope": 0.1, "alibi": 0.5},   # ranks 1, 3, 2
      ("copy", 16): {"none": 0.2, "rope": 0.6, "alibi": 0.4},   # ranks 3, 1, 2
      ("reverse", 12): {"none": 0.7, "rope": 0.3, "alibi": 0.3},  # ranks 1, 2, 2 (tie)
  }
  got = mrr.mean_reciprocal_rank(settings)
  assert got["none"] == pytest.approx((1 + 1 / 3 + 1) / 3)      # 0.778
  assert got["rope"] == pytest.approx((1 / 3 + 1 + 1 / 2) / 3)  # 0.611
  assert got["alibi"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 2) / 3)  # 0.5


def test_lower_is_better_ties_share_the_best_rank_and_missing_scores_rank_last():
  assert mrr.ranks({"a": 7.0, "b": 3.0, "c": 3.0, "d": None}, higher_is_better=False) == {
      "a": 3, "b": 1, "c": 1, "d": 4}
  assert mrr.ranks({"a": float("nan"), "b": None, "c": 0.0}) == {"a": 2, "b": 2, "c": 1}
  # Every arm tied: each ranks first.
  assert mrr.mean_reciprocal_rank({1: {"a": 0.0, "b": 0.0}}) == {"a": 1.0, "b": 1.0}


def test_every_setting_must_rank_the_same_arms():
  with pytest.raises(ValueError, match="every setting every arm"):
    mrr.mean_reciprocal_rank({1: {"a": 1.0, "b": 0.0}, 2: {"a": 1.0}})
  with pytest.raises(ValueError, match="at least one setting"):
    mrr.mean_reciprocal_rank({})
