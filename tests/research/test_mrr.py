"""tfjax/research/mrr.py: Kazemnejad et al.'s mean reciprocal rank vs hand-computed examples."""

import pytest

from tfjax.research import mrr, sweep_tables


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


def _rows(values):
  """Finished result rows {(task, arm): exact match @12}, each arm with its own per-arm keys."""
  per_arm = {"none": {}, "sinusoidal": {"model.embed_scale": True},
             "t5_bias": {"model.relative_max_distance": 64}}
  return [{"overrides": {"data.name": task, "model.position": arm, **per_arm[arm], "seed": 0},
           "status": "done", "metrics": {"eval/exact_match@12": v}}
          for (task, arm), v in values.items()]


def test_rank_arms_ranks_arms_with_their_own_per_arm_keys_against_each_other():
  # copy: sinusoidal 0.9 > none 0.5 > t5 0.1 -> ranks 2, 1, 3 (none, sinusoidal, t5)
  # reverse: none 0.8 > t5 0.4 > sinusoidal 0.2 -> ranks 1, 3, 2
  rows = _rows({("copy", "none"): 0.5, ("copy", "sinusoidal"): 0.9, ("copy", "t5_bias"): 0.1,
                ("reverse", "none"): 0.8, ("reverse", "sinusoidal"): 0.2,
                ("reverse", "t5_bias"): 0.4})
  metrics = ["eval/exact_match@12"]
  summary = sweep_tables.summarize(rows, metrics)
  expected = {"none": (1 / 2 + 1) / 2, "sinusoidal": (1 + 1 / 3) / 2,
              "t5_bias": (1 / 3 + 1 / 2) / 2}
  for spec_keys in ({"settings": ("data.name",)},
                    {"per_arm": ("model.embed_scale", "model.relative_max_distance")}):
    ranking = sweep_tables.rank_arms(summary, metrics, {"metric": "eval/exact_match",
                                                        "arms": "model.position", **spec_keys})
    assert ranking["mrr"] == pytest.approx(expected)
    assert list(ranking["mrr"]) == ["none", "sinusoidal", "t5_bias"]
    assert len(ranking["settings"]) == 2  # copy@12, reverse@12: not one setting per arm


def test_rank_arms_refuses_a_setting_key_that_does_not_tell_variants_apart():
  rows = _rows({("copy", "none"): 0.5, ("reverse", "none"): 0.8,
                ("copy", "sinusoidal"): 0.9, ("reverse", "sinusoidal"): 0.2})
  summary = sweep_tables.summarize(rows, ["eval/exact_match@12"])
  with pytest.raises(ValueError, match="name the compared keys"):
    sweep_tables.rank_arms(summary, ["eval/exact_match@12"],
                           {"metric": "eval/exact_match", "arms": "model.position",
                            "settings": ()})


def test_the_doc_ranks_over_the_tasks_the_verdicts_rank_and_labels_the_full_ranking():
  from tfjax.research import sweep_doc  # pylint: disable=import-outside-toplevel
  # copy: sinusoidal 0.9 > none 0.5 > t5 0.1; reverse: none 0.8 > t5 0.4 > sinusoidal 0.2.
  rows = _rows({("copy", "none"): 0.5, ("copy", "sinusoidal"): 0.9, ("copy", "t5_bias"): 0.1,
                ("reverse", "none"): 0.8, ("reverse", "sinusoidal"): 0.2,
                ("reverse", "t5_bias"): 0.4})
  metrics = ["eval/exact_match@12"]
  summary = sweep_tables.summarize(rows, metrics)
  spec = {"metric": "eval/exact_match", "arms": "model.position", "settings": ("data.name",)}
  # The verdicts ranked reverse only (copy left out by their precondition).
  section = {"judged": [{"kind": "mrr", "result": {"ranked": ["reverse"]}}]}
  rankings = sweep_doc._rankings  # pylint: disable=protected-access
  everything, used = rankings(section, summary, metrics, spec)
  assert everything["mrr"] == pytest.approx({"none": (1 / 2 + 1) / 2,
                                             "sinusoidal": (1 + 1 / 3) / 2,
                                             "t5_bias": (1 / 3 + 1 / 2) / 2})
  assert "not the ranking the verdicts use" in everything["heading"]
  # Over reverse alone: ranks 1, 3, 2.
  assert used["mrr"] == pytest.approx({"none": 1.0, "t5_bias": 1 / 2, "sinusoidal": 1 / 3})
  assert list(used["mrr"]) == ["none", "t5_bias", "sinusoidal"]
  assert "over reverse, the tasks the verdicts rank" in used["heading"]
  # No rank claim judged: the one ranking, unlabelled.
  assert len(rankings({"judged": []}, summary, metrics, spec)) == 1
