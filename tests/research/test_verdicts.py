"""tfjax/research/verdicts.py: the rule gives the documented word on constructed cases, Welch's
t and Fisher's exact test match values computed independently, preconditions and positive
controls gate a claim, and each untestable branch (power, floor, ceiling) fires with its reason."""

import math

import numpy as np
import pytest

from tfjax.research import verdicts


def _rows(arm_values: dict, metric="eval/loss") -> list:
  return [{"overrides": {"model.position": arm, "seed": seed}, "status": "done",
           "metrics": {metric: value}}
          for arm, values in arm_values.items() for seed, value in enumerate(values)]


CLAIM = {"a": {"model.position": "alibi", "metric": "eval/loss"},
         "b": {"model.position": "rope", "metric": "eval/loss"}, "expect": "less"}


@pytest.mark.parametrize("alibi,rope,expected", [
    ((1.0, 1.1, 0.9), (2.0, 2.1, 1.9), "reproduced"),       # Δ -1, se 0.08: p ~ 1e-4
    ((1.0, 1.4, 0.6), (1.4, 1.8, 1.0), "direction only"),   # Δ -0.4, se 0.33: 1.2 se, p ~ 0.3
    ((1.0, 1.4, 0.6), (1.1, 1.5, 0.7), "tie"),              # Δ -0.1 < 1 se
    ((2.0, 2.1, 1.9), (1.0, 1.1, 0.9), "contradicted"),
    ((1.4, 1.8, 1.0), (1.0, 1.4, 0.6), "opposite only"),
    # Δ -0.6, se 0.33: 1.8 se, within 1 of the 2.78 se (t at 4 df) where p crosses 0.05
    ((1.0, 1.4, 0.6), (1.6, 2.0, 1.2), "needs more seeds"),
])
def test_each_word_on_constructed_cases(alibi, rope, expected):
  result = verdicts.verdict(_rows({"alibi": alibi, "rope": rope}), CLAIM)
  assert result["word"] == expected, result


def test_untestable_when_an_arm_has_one_seed_or_a_precondition_fails():
  one_seed = verdicts.verdict(_rows({"alibi": (1.0,), "rope": (2.0, 2.1)}), CLAIM)
  assert one_seed["word"] == "untestable here" and "seeds" in one_seed["why"]
  rows = _rows({"alibi": (0.95, 0.97), "rope": (0.5, 0.7)}, "eval/exact_match@8")
  rows += _rows({"alibi": (1.0, 1.1), "rope": (2.0, 2.1)})
  rows = [{**r, "metrics": {**r["metrics"], "eval/exact_match@8": r["metrics"].get(
      "eval/exact_match@8", 1.0)}} for r in rows]
  claim = {**CLAIM, "requires": [{"metric": "eval/exact_match@8", "min": 0.9,
                                  "what": "learned in distribution"}]}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "untestable here" and "position=rope 0.80" in result["why"], result


def test_welch_matches_the_textbook_formula():
  a, b = [3.1, 2.9, 3.4, 3.0], [2.0, 2.6, 2.2]
  va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
  df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
  result = verdicts.welch(a, b)
  assert result["delta"] == pytest.approx(np.mean(a) - np.mean(b))
  assert result["se"] == pytest.approx(math.sqrt(va + vb))
  assert result["df"] == pytest.approx(df)
  # p from the t density integrated numerically (independent of scipy's t distribution).
  t = result["delta"] / result["se"]
  x = np.linspace(abs(t), abs(t) + 400, 2_000_001)
  density = (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
             * (1 + x ** 2 / df) ** (-(df + 1) / 2))
  assert result["p"] == pytest.approx(2 * np.trapezoid(density, x), rel=1e-3)


def test_fisher_exact_matches_the_lady_tasting_tea():
  # Fisher (1935): 3 of 4 cups right each way; two-sided p = 34/70 = 0.486 by hypergeometry.
  assert verdicts.fisher(3, 4, 1, 4)["p"] == pytest.approx(34 / 70)
  assert verdicts.fisher(3, 3, 0, 3)["p"] == pytest.approx(0.1)  # 2 / C(6, 3)


def test_failure_counts_use_fisher():
  rows = [{"overrides": {"model.norm_placement": arm, "seed": s}, "status": "done",
           "metrics": {"diverged": float(s < failures)}}
          for arm, failures in (("post", 6), ("pre", 0)) for s in range(6)]
  claim = {"a": {"model.norm_placement": "post", "metric": "diverged"},
           "b": {"model.norm_placement": "pre", "metric": "diverged"},
           "expect": "greater", "kind": "count"}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "reproduced" and result["p"] == pytest.approx(2 / 924)
  equal = [{**r, "metrics": {"diverged": float(r["overrides"]["seed"] < 1)}} for r in rows]
  assert verdicts.verdict(equal, claim)["word"] == "tie"


def _mrr_row(task, arm, seed, at4, at12):
  return {"overrides": {"data.name": task, "model.position": arm, "seed": seed},
          "status": "done", "metrics": {"eval/exact_match@4": at4, "eval/exact_match@12": at12}}


_MRR_SPEC = dict(metric="eval/exact_match", arms="model.position", setting="data.name", min_n=5,
                 learned_max_n=4, learned_min=0.9, all_arms=("none", "rope"))


def test_mrr_claims_rank_only_tasks_every_arm_learned():
  row, spec = _mrr_row, dict(_MRR_SPEC)
  claim = {"kind": "mrr", "mrr": spec, "a": {"model.position": "none", "metric": "mrr"},
           "b": {"model.position": "rope", "metric": "mrr"}, "expect": "greater"}
  # copy: both learned, NoPE generalizes on every seed; sort: rope never learned it. Five seeds:
  # the permutation test's smallest p is 2 / C(10, 5) (3 vs 3 could not go below 0.1).
  rows = [row("copy", "none", s, 1.0, 0.5 + 0.1 * s) for s in range(5)]
  rows += [row("copy", "rope", s, 1.0, 0.1 * s) for s in range(5)]
  rows += [row("sort", arm, s, 1.0 if arm == "none" else 0.2, 0.9 if arm == "rope" else 0.0)
           for arm in ("none", "rope") for s in range(5)]
  result = verdicts.verdict(rows, claim)
  # Per seed, copy's only setting ranks none first (MRR 1) and rope second (0.5): sort, where
  # rope wins past N, is left out because rope did not learn it in distribution.
  assert result["delta"] == pytest.approx(0.5) and result["se"] == 0
  assert result["p"] == pytest.approx(2 / 252), result
  assert result["word"] == "reproduced" and "sort: rope 0.20 < 0.9" in result["why"], result
  three = [r for r in rows if r["overrides"]["seed"] < 3]
  underpowered = verdicts.verdict(three, claim)
  assert underpowered["word"] == "untestable here", underpowered
  assert "smallest p the test can give is 0.1" in underpowered["why"], underpowered
  only_sort = [r for r in rows if r["overrides"]["data.name"] == "sort"]
  untestable = verdicts.verdict(only_sort, claim)
  assert untestable["word"] == "untestable here" and "rope 0.20" in untestable["why"]


def test_near_the_threshold_five_seeds_decide_and_fewer_need_more():
  # 1.8 se at 3 seeds needs more seeds (above). At 5 seeds a similar Δ/se is also within 1 se
  # of the crossing (t at ~8 df: 2.31), but 5 seeds per arm are enough: the rule decides.
  alibi, rope = (1.0, 1.4, 0.6, 1.2, 0.8), (1.45, 1.85, 1.05, 1.65, 1.25)
  result = verdicts.verdict(_rows({"alibi": alibi, "rope": rope}), CLAIM)
  assert 1.5 < abs(result["delta"]) / result["se"] < 2.3, result
  assert result["word"] == "direction only", result


def _count_rows(failures: dict, seeds: int, metric="failed") -> list:
  return [{"overrides": {"model.norm_placement": arm, "seed": s}, "status": "done",
           "metrics": {metric: float(s < k), "eval/loss": 9.0 if s < k else 2.0}}
          for arm, k in failures.items() for s in range(seeds)]


COUNT = {"a": {"model.norm_placement": "post", "metric": "failed"},
         "b": {"model.norm_placement": "pre", "metric": "failed"},
         "expect": "greater", "kind": "count"}


def test_smallest_p_of_fisher_by_enumeration():
  # 3 vs 3: the most extreme table (3/3 vs 0/3) gives 2 / C(6, 3) = 0.1; 4 vs 4: 2 / C(8, 4).
  assert verdicts.smallest_p("count", 3, 3) == pytest.approx(0.1)
  assert verdicts.smallest_p("count", 4, 4) == pytest.approx(2 / 70)
  assert verdicts.smallest_p("mean", 2, 2) == 0.0  # Welch's t: no floor


def test_untestable_when_fisher_cannot_reach_the_threshold_with_these_seeds():
  result = verdicts.verdict(_count_rows({"post": 3, "pre": 0}, 3), COUNT)
  assert result["word"] == "untestable here", result
  assert "underpowered" in result["why"] and "0.1" in result["why"], result
  assert verdicts.verdict(_count_rows({"post": 4, "pre": 0}, 4), COUNT)["word"] == "reproduced"


def test_bimodal_losses_are_judged_by_failure_counts():
  claim = {"a": {"model.norm_placement": "post", "metric": "eval/loss"},
           "b": {"model.norm_placement": "pre", "metric": "eval/loss"}, "expect": "greater"}
  result = verdicts.verdict(_count_rows({"post": 5, "pre": 0}, 6), claim)
  assert result["kind"] == "count" and "bimodal (5 of 12 seeds failed)" in result["why"]
  assert result["delta"] == pytest.approx(5 / 6) and result["word"] == "reproduced", result
  # With no failed seed, the same claim is Welch's on the losses.
  trained = [r for r in _count_rows({"post": 0, "pre": 0}, 3)]
  for r in trained:
    r["metrics"]["eval/loss"] = 2.0 + 0.1 * r["overrides"]["seed"] + (
        0.5 if r["overrides"]["model.norm_placement"] == "post" else 0.0)
  assert verdicts.verdict(trained, claim)["kind"] == "mean"


@pytest.mark.parametrize("value,where", [(0.01, "floor"), (0.99, "ceiling")])
def test_untestable_when_every_seed_sits_at_the_floor_or_ceiling(value, where):
  metric = "eval/exact_match@16"
  rows = _rows({"alibi": (value, value + 0.005, value - 0.005), "rope": (value,) * 3}, metric)
  claim = {"a": {"model.position": "alibi", "metric": metric},
           "b": {"model.position": "rope", "metric": metric}, "expect": "greater"}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "untestable here" and f"at the {where}" in result["why"], result
  rows[0]["metrics"][metric] = 0.5  # one seed off the bound: the rule no longer fires
  assert "at the" not in verdicts.verdict(rows, claim)["why"]


def test_a_declared_floor_above_the_metrics_own_is_named_in_the_reason():
  """`bounds` may set a higher floor than the metric's (ListOps: a one-token rule's accuracy);
  `bounds_what` says what it is, in the reason."""
  metric = "eval/accuracy"
  rows = _rows({"alibi": (0.36, 0.365, 0.37), "rope": (0.362, 0.366, 0.358)}, metric)
  claim = {"a": {"model.position": "alibi", "metric": metric},
           "b": {"model.position": "rope", "metric": metric}, "expect": "less",
           "bounds": (0.361, 1.0), "bounds_what": "a one-token rule scores 0.361"}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "untestable here", result
  assert "at the floor of eval/accuracy (a one-token rule scores 0.361)" in result["why"], result
  claim["bounds"] = (0.19, 1.0)  # the majority floor alone: the arms are far above it
  assert verdicts.verdict(rows, claim)["word"] == "tie"


def test_a_failed_positive_control_makes_the_claim_untestable():
  rows = _count_rows({"post": 1, "pre": 0}, 6)  # post-LN (with warmup here) fails 1 of 6
  control = {"where": {"model.norm_placement": "post"}, "metric": "failed", "max": 0.0,
             "what": "post-LN with warmup trains"}
  claim = {**COUNT, "controls": [control]}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "untestable here", result
  assert result["why"].startswith("control: post-LN with warmup trains fails"), result
  passing = _count_rows({"post": 0, "pre": 2}, 6)
  assert verdicts.verdict(passing, claim)["word"] != "untestable here"


def test_an_any_arm_control_needs_one_arm_past_the_training_length():
  def row(arm, seed, at12, at16):
    return {"overrides": {"model.position": arm, "seed": seed}, "status": "done",
            "metrics": {"eval/exact_match@12": at12, "eval/exact_match@16": at16}}
  control = {"metric": "eval/exact_match", "min_n": 9, "min": 0.5, "any": True,
             "what": "some arm generalizes past N = 8"}
  none_do = [row(a, s, 0.1, 0.0) for a in ("none", "rope") for s in range(3)]
  assert "no arm has" in verdicts.check_conditions(none_do, [control])
  one_does = none_do + [row("alibi", s, 0.7, 0.2) for s in range(3)]  # best N: 12
  assert verdicts.check_conditions(one_does, [control]) is None


def test_holm_adjusts_p_within_a_section():
  # Hand-computed: p = (0.01, 0.04, 0.03) -> sorted 0.01 x 3, 0.03 x 2, 0.04 x 1 -> 0.03, 0.06,
  # then max(0.06, 0.04) = 0.06.
  assert verdicts.holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
  # Two claims on the same 6-seed data (p ~ 0.04 each): alone each is reproduced; together,
  # Holm doubles the smaller p and both are direction only.
  a, b = [2.6 + x for x in range(6)], [float(x) for x in range(6)]
  rows = _rows({"alibi": a, "rope": b})
  claim = {**CLAIM, "expect": "greater"}
  alone = verdicts.verdict(rows, claim)
  assert 0.025 < alone["p"] < 0.05 and alone["word"] == "reproduced", alone
  both = verdicts.judge_claims(rows, [claim, {**claim, "id": "again"}])
  assert [r["word"] for r in both] == ["direction only", "direction only"], both
  assert both[0]["p_holm"] == pytest.approx(min(1.0, 2 * alone["p"]))
  # Every claim of a family prints its Holm p, also the largest p of the family, whose Holm
  # value equals its raw p (hand-computed: 0.01 x 2 = 0.02, max(0.02, 0.04) = 0.04).
  assert verdicts.holm([0.01, 0.04]) == pytest.approx([0.02, 0.04])
  far = _rows({"alibi": a, "rope": b, "none": [20.0 + x for x in range(6)]})
  third = verdicts.judge_claims(far, [claim, {**claim, "a": {**claim["a"], "model.position":
                                                             "none"}, "id": "far"}])
  assert third[1]["p"] < alone["p"] / 2, third
  assert third[0]["p_holm"] == pytest.approx(third[0]["p"]) == pytest.approx(alone["p"])
  for result in both + third:
    assert f"Holm {result['p_holm']:.2g};" in verdicts.format_ours(result), result
  # A claim judged alone (a second metric) is no family: it prints no Holm.
  assert "Holm" not in verdicts.format_ours(alone)


def test_mrr_leaves_out_tasks_where_no_arm_generalizes_and_is_untestable_without_any():
  row, spec = _mrr_row, dict(_MRR_SPEC)
  control = {"metric": "eval/exact_match", "min_n": 5, "min": 0.5, "any": True,
             "what": "some arm generalizes past N = 4"}
  claim = {"kind": "mrr", "mrr": spec, "mrr_controls": [control],
           "a": {"model.position": "none", "metric": "mrr"},
           "b": {"model.position": "rope", "metric": "mrr"}, "expect": "greater"}
  # reverse: learned by both, both at the floor past N (rope 0.01 "wins" by noise).
  floor = [row("reverse", arm, s, 1.0, 0.01 if arm == "rope" else 0.0)
           for arm in ("none", "rope") for s in range(3)]
  result = verdicts.verdict(floor, claim)
  assert result["word"] == "untestable here" and "positive control" in result["why"], result
  # copy: NoPE generalizes (0.8); reverse is left out, so copy alone decides.
  copy = [row("copy", "none", s, 1.0, 0.8) for s in range(3)]
  copy += [row("copy", "rope", s, 1.0, 0.1) for s in range(3)]
  result = verdicts.verdict(floor + copy, claim)
  assert result["delta"] == pytest.approx(0.5) and "ranked over copy" in result["why"], result
  assert "reverse: control: some arm generalizes past N = 4 fails" in result["why"], result


def test_a_side_against_a_fixed_number_uses_the_one_sample_t_test():
  a = [1.3, 1.1, 1.2, 1.4]
  se = np.std(a, ddof=1) / 2
  t = (np.mean(a) - 1.0) / se
  # Two-sided p at 3 df from the closed form of Student's t CDF with 3 degrees of freedom.
  x = t / math.sqrt(3)
  p = 1 - 2 / math.pi * (math.atan(x) + x / (1 + x * x))
  result = verdicts.one_sample(a, 1.0)
  assert result["se"] == pytest.approx(se) and result["p"] == pytest.approx(p)
  claim = {"a": {"model.position": "alibi", "metric": "ratio"}, "b": {"value": 1.0},
           "expect": "greater"}
  out = verdicts.verdict(_rows({"alibi": a}, "ratio"), claim)
  assert out["delta"] == pytest.approx(0.25) and out["p"] == pytest.approx(p), out
  # 3.9 se at 4 seeds is within 1 se of the 3.18 se where p crosses 0.05: more seeds needed.
  assert out["word"] == "needs more seeds" and verdicts.format_ours(out).endswith("; 4 seeds)")
  clear = verdicts.verdict(_rows({"alibi": [1.5, 1.45, 1.55, 1.5, 1.52]}, "ratio"), claim)
  assert clear["word"] == "reproduced", clear


def test_a_ratio_metric_divides_two_metrics_of_each_seed():
  assert verdicts.metric_value({"g@12": 3.0, "g@1": 2.0}, "g@12 / g@1") == 1.5
  assert verdicts.metric_value({"g@12": 3.0}, "g@12 / g@1") is None


def test_the_permutation_test_by_hand():
  # a = (3, 1, 2), b = (2.5, 4, 5): Δ = 2 - 3.833. Of the C(6, 3) = 20 splits, those whose
  # three-seed sum is <= 6 (1+2+2.5, 1+2+3) or >= 11.5 (5+4+3, 5+4+2.5) are as extreme: p = 4/20.
  result = verdicts.permutation((3.0, 1.0, 2.0), (2.5, 4.0, 5.0))
  assert result["delta"] == pytest.approx(2.0 - 11.5 / 3)
  assert result["p"] == pytest.approx(0.2)
  assert verdicts.permutation((1.0, 2.0), (1.0, 2.0))["p"] == 1.0
  assert verdicts.permutation((1, 2, 3, 4), (5, 6, 7, 8))["p"] == pytest.approx(2 / 70)
  assert verdicts.smallest_p("rank", 3, 3) == pytest.approx(0.1)
  assert verdicts.smallest_p("rank", 5, 5) == pytest.approx(2 / 252)


def test_mrr_of_two_arms_both_at_the_floor_past_n_is_untestable():
  # sort: every arm learned it; NoPE generalizes (the control passes), rope and alibi score 0
  # past N in every seed, so ranking them against each other orders ties.
  row = _mrr_row
  spec = {**_MRR_SPEC, "all_arms": ("none", "rope", "alibi")}
  control = {"metric": "eval/exact_match", "min_n": 5, "min": 0.5, "any": True,
             "what": "some arm generalizes past N = 4"}
  rows = [row("sort", arm, s, 1.0, 0.9 if arm == "none" else 0.0)
          for arm in ("none", "rope", "alibi") for s in range(5)]
  claim = {"kind": "mrr", "mrr": spec, "mrr_controls": [control],
           "a": {"model.position": "rope", "metric": "mrr"},
           "b": {"model.position": "alibi", "metric": "mrr"}, "expect": "greater"}
  result = verdicts.verdict(rows, claim)
  assert result["word"] == "untestable here", result
  assert "both arms at the floor of eval/exact_match" in result["why"], result
  testable = verdicts.verdict(rows, {**claim, "b": claim["a"], "a": {
      "model.position": "none", "metric": "mrr"}})
  assert testable["word"] == "reproduced", testable


def _accuracy_rows(accuracies: dict) -> list:
  return [{"overrides": {"model.attention_kind": arm, "seed": s}, "status": "done",
           "metrics": {"eval/accuracy": value}}
          for arm, values in accuracies.items() for s, value in enumerate(values)]


ACCURACY = {"a": {"model.attention_kind": "local", "metric": "eval/accuracy"},
            "b": {"model.attention_kind": "softmax", "metric": "eval/accuracy"},
            "expect": "less", "failure": {"metric": "eval/accuracy", "below": 0.24}}


def test_a_declared_failure_rule_judges_a_bimodal_accuracy_claim_by_counts():
  # local fails (at the 0.19 floor) in 5 of 6 seeds, softmax in none: "local is below softmax"
  # in accuracy is "local fails more often": Fisher's two-sided p = 2 * 6 / C(12, 5) = 0.0152;
  # the direction flips to 'greater' on failure fractions.
  rows = _accuracy_rows({"local": (0.19,) * 5 + (0.36,), "softmax": (0.36, 0.37, 0.35) * 2})
  result = verdicts.verdict(rows, ACCURACY)
  assert result["kind"] == "count", result
  assert "bimodal (5 of 12 seeds below eval/accuracy 0.24)" in result["why"], result
  assert result["delta"] == pytest.approx(5 / 6) and result["word"] == "reproduced", result
  assert result["p"] == pytest.approx(2 * 6 / math.comb(12, 5)), result
  # Without a failed seed the claim is Welch's t on the accuracies, in the claim's direction.
  trained = _accuracy_rows({"local": (0.30, 0.31, 0.29), "softmax": (0.36, 0.37, 0.35)})
  result = verdicts.verdict(trained, ACCURACY)
  assert result["kind"] == "mean" and result["delta"] == pytest.approx(-0.06), result
  assert result["word"] == "reproduced", result
  # A non-finite accuracy is a failure too.
  assert verdicts._failures(_accuracy_rows({"x": (math.nan, 0.3)}), None,  # pylint: disable=protected-access
                            ACCURACY["failure"]) == 1


def test_an_every_seed_control_fails_on_one_bad_seed_that_the_mean_hides():
  # softmax's mean (0.316) clears 0.24 but seed 2 (0.217) does not learn.
  rows = _accuracy_rows({"softmax": (0.367, 0.363, 0.217), "local": (0.36, 0.37, 0.36)})
  control = {"where": {"model.attention_kind": "softmax"}, "metric": "eval/accuracy",
             "min": 0.24, "what": "softmax learns in every seed"}
  assert verdicts.check_conditions(rows, [control]) is None  # on the seed mean
  why = verdicts.check_conditions(rows, [{**control, "every_seed": True}])
  assert why.startswith("softmax learns in every seed fails") and "0.22" in why, why
  ok = _accuracy_rows({"softmax": (0.367, 0.363, 0.35)})
  assert verdicts.check_conditions(ok, [{**control, "every_seed": True}]) is None
  ok[1]["metrics"] = {}  # a seed without the metric fails the control, it is not skipped
  assert "nan" in verdicts.check_conditions(ok, [{**control, "every_seed": True}])


def test_failure_counts_with_no_failure_are_untestable_and_all_failing_is_a_tie():
  """0 of 8 vs 0 of 8 failed: nothing was unstable, the counts cannot order the arms. 8 of 8 vs
  8 of 8: the remedy the claim names did not help, a result (tie), not a floor."""
  result = verdicts.verdict(_count_rows({"post": 0, "pre": 0}, 8), COUNT)
  assert result["word"] == "untestable here", result
  assert "at the floor of the failure fraction" in result["why"], result
  result = verdicts.verdict(_count_rows({"post": 8, "pre": 8}, 8), COUNT)
  assert result["word"] == "tie" and result["p"] == 1.0, result


def _tost_by_hand(a, b, margin):
  """Welch's Δ, se, df and the two one-sided p (inside) and the minimum-effect p (beyond),
  written out here with scipy's t distribution."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  a, b = np.asarray(a), np.asarray(b)
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  delta, se = a.mean() - b.mean(), math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  inside = max(stats.t.sf((delta + margin) / se, df), stats.t.cdf((delta - margin) / se, df))
  beyond = stats.t.sf((abs(delta) - margin) / se, df)
  return delta, se, df, inside, beyond


@pytest.mark.parametrize("a,b,expected,which", [
    # Within ±0.01 and tight: equivalent.
    ((2.000, 2.001, 1.999, 2.0005, 2.0002), (2.001, 2.000, 2.0015, 1.9995, 2.0008),
     "reproduced", "inside"),
    # 0.05 apart, tight: the gap exceeds the margin.
    ((2.050, 2.051, 2.049, 2.0505, 2.0502), (2.000, 2.001, 1.999, 2.0005, 2.0002),
     "contradicted", "beyond"),
    # 0.01 apart with a spread of 0.01: neither test passes.
    ((2.01, 2.02, 2.00, 2.015, 2.005), (2.00, 2.01, 1.99, 2.005, 1.995), "inconclusive", None),
    # The same at 3 seeds per arm: more seeds are needed.
    ((2.01, 2.02, 2.00), (2.00, 2.01, 1.99), "needs more seeds", None),
])
def test_a_parity_claim_is_judged_by_its_margin(a, b, expected, which):
  claim = {**CLAIM, "parity": 0.01}
  result = verdicts.verdict(_rows({"alibi": a, "rope": b}), claim)
  assert result["word"] == expected, result
  delta, se, df, inside, beyond = _tost_by_hand(a, b, 0.01)
  assert result["delta"] == pytest.approx(delta) and result["se"] == pytest.approx(se)
  assert result["p"] == pytest.approx(min(inside, beyond))
  lo, hi = result["parity"]["ci"]
  from scipy import stats  # pylint: disable=import-outside-toplevel
  q = stats.t.ppf(0.95, df)
  assert (lo, hi) == pytest.approx((delta - q * se, delta + q * se))
  if which:
    assert f"p({which})" in verdicts.format_ours(result), verdicts.format_ours(result)


def test_one_arm_at_two_lengths_is_paired():
  """The same runs measured at 2L and at L: the paired t on per-seed differences (scipy's
  ttest_rel), not Welch's t on two independent samples."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  at_l, at_2l = [2.0, 2.5, 3.0, 3.5, 4.0], [2.2, 2.6, 3.3, 3.6, 4.3]
  rows = [{"overrides": {"model.position": "rope", "seed": s}, "status": "done",
           "metrics": {"ppl@64": x, "ppl@128": y}} for s, (x, y) in enumerate(zip(at_l, at_2l))]
  claim = {"a": {"model.position": "rope", "metric": "ppl@128"},
           "b": {"model.position": "rope", "metric": "ppl@64"}, "expect": "greater"}
  result = verdicts.verdict(rows, claim)
  assert result["p"] == pytest.approx(stats.ttest_rel(at_2l, at_l).pvalue)
  assert result["p"] < stats.ttest_ind(at_2l, at_l, equal_var=False).pvalue  # the spread cancels
  assert result["word"] == "reproduced"
  # A seed with a non-finite value at one length drops out of both sides, keeping the pairs.
  rows[0]["metrics"]["ppl@128"] = math.inf
  result = verdicts.verdict(rows, claim)
  assert result["n_a"] == result["n_b"] == 4
  assert result["p"] == pytest.approx(stats.ttest_rel(at_2l[1:], at_l[1:]).pvalue)


def test_a_declared_confound_makes_the_claim_untestable_with_its_reason():
  rows = _rows({"alibi": (1.0, 1.1, 1.2), "rope": (2.0, 2.1, 2.2)})
  result = verdicts.verdict(rows, {**CLAIM, "confound": "rope's table was never trained"})
  assert result["word"] == "untestable here"
  assert result["why"] == "confounded: rope's table was never trained"


def test_per_seed_mrr_ranks_only_seeds_run_on_every_ranked_setting():
  """Sort at seeds 0-4 beside copy at 0-2: ranked over both, seeds 3-4 (sort only) would rank
  their arms over other settings than seeds 0-2, so they are left out; over sort alone they
  count. Each seed's MRR: 'a' wins every setting (rank 1), 'b' is second (1/2)."""
  rows = [{"overrides": {"model.position": arm, "data.name": task, "seed": seed},
           "status": "done", "metrics": {"eval/exact_match@12": score}}
          for task, seeds in (("sort", range(5)), ("copy", range(3)))
          for seed in seeds for arm, score in (("a", 0.9), ("b", 0.1))]
  spec = {"metric": "eval/exact_match", "arms": "model.position", "setting": "data.name",
          "min_n": 9}
  both = verdicts.per_seed_mrr(rows, spec, ["sort", "copy"])
  assert sorted({r["overrides"]["seed"] for r in both}) == [0, 1, 2]
  assert {(r["overrides"]["model.position"], r["metrics"]["mrr"]) for r in both} == {
      ("a", 1.0), ("b", 0.5)}
  sort = verdicts.per_seed_mrr(rows, spec, ["sort"])
  assert sorted({r["overrides"]["seed"] for r in sort}) == [0, 1, 2, 3, 4]


def test_seeds_added_after_a_look_multiply_p_by_the_looks_that_could_reject():
  alibi, rope = (1.0, 1.1, 0.9, 1.05, 0.95), (1.3, 1.4, 1.2, 1.35, 1.25)
  rows = _rows({"alibi": alibi, "rope": rope})
  # Welch's p written out: t on the textbook se and df, the two-sided tail of Student's t.
  from scipy import stats  # pylint: disable=import-outside-toplevel
  p_welch = stats.ttest_ind(alibi, rope, equal_var=False).pvalue
  plain = verdicts.verdict(rows, CLAIM)
  twice = verdicts.verdict(rows, {**CLAIM, "earlier_looks": [(3, 3)]})
  thrice = verdicts.verdict(rows, {**CLAIM, "earlier_looks": [(3, 3), (5, 3)]})
  assert plain["p"] == pytest.approx(p_welch)
  assert twice["p"] == pytest.approx(2 * p_welch) and "p x 2" in twice["why"]
  assert thrice["p"] == pytest.approx(3 * p_welch)
  # Failure counts read at 3 vs 3 (Fisher cannot go below 0.1 there): that look spends nothing.
  counts = _count_rows({"post": 8, "pre": 0}, 8)
  assert (verdicts.verdict(counts, {**COUNT, "earlier_looks": [(3, 3)]})["p"]
          == pytest.approx(verdicts.verdict(counts, COUNT)["p"]))


def test_welch_power_matches_a_simulation():
  rng = np.random.default_rng(0)
  sd, n, effect, level = 0.01, 3, 0.018, 0.05
  from scipy import stats  # pylint: disable=import-outside-toplevel
  a = rng.normal(effect, sd, (20000, n))
  b = rng.normal(0.0, sd, (20000, n))
  simulated = np.mean(stats.ttest_ind(a, b, axis=1).pvalue < level)  # Student's t, df 2n - 2
  assert verdicts.welch_power(effect, sd * math.sqrt(2 / n), 2 * n - 2, level) == pytest.approx(
      simulated, abs=0.02)


def test_a_claim_without_power_for_the_papers_effect_needs_more_seeds():
  rows = _rows({"alibi": (1.0, 1.012, 0.994), "rope": (1.004, 1.016, 0.998)})
  small = verdicts.verdict(rows, {**CLAIM, "paper_effect": 0.018})
  assert small["word"] == "needs more seeds" and "power 0." in small["why"], small
  large = verdicts.verdict(rows, {**CLAIM, "paper_effect": 0.5})  # a 0.5 effect is ~60 se here
  assert large["word"] == "tie" and "power 1.00" in large["why"], large
  assert verdicts.verdict(rows, CLAIM)["word"] == "tie"


def test_power_after_looks_is_taken_at_the_level_the_raw_p_meets():
  rows = _rows({"alibi": (1.0, 1.012, 0.994), "rope": (1.004, 1.016, 0.998)})
  once = verdicts.verdict(rows, {**CLAIM, "paper_effect": 0.018})
  twice = verdicts.verdict(rows, {**CLAIM, "paper_effect": 0.018, "earlier_looks": [(2, 2)]})
  assert "at level 0.05" in once["why"] and "at level 0.025" in twice["why"], twice
  power = lambda r: float(r["why"].split("power ")[1].split()[0])  # noqa: E731
  assert power(twice) < power(once)
