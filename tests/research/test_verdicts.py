"""tfjax/research/verdicts.py: the rule gives the documented word on constructed cases, Welch's
t and Fisher's exact test match values computed independently, and preconditions gate a claim."""

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
    ((1.0, 1.4, 0.6), (1.6, 2.0, 1.2), "direction only"),   # Δ -0.6, se 0.33: 1.8 se, p ~ 0.15
    ((1.0, 1.4, 0.6), (1.1, 1.5, 0.7), "tie"),              # Δ -0.1 < 1 se
    ((2.0, 2.1, 1.9), (1.0, 1.1, 0.9), "contradicted"),
    ((1.6, 2.0, 1.2), (1.0, 1.4, 0.6), "opposite only"),
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


def test_mrr_claims_rank_only_tasks_every_arm_learned():
  def row(task, arm, seed, at4, at12):
    return {"overrides": {"data.name": task, "model.position": arm, "seed": seed},
            "status": "done", "metrics": {"eval/exact_match@4": at4, "eval/exact_match@12": at12}}
  spec = dict(metric="eval/exact_match", arms="model.position", setting="data.name", min_n=5,
              learned_max_n=4, learned_min=0.9, all_arms=("none", "rope"))
  claim = {"kind": "mrr", "mrr": spec, "a": {"model.position": "none", "metric": "mrr"},
           "b": {"model.position": "rope", "metric": "mrr"}, "expect": "greater"}
  # copy: both learned, NoPE generalizes on every seed; sort: rope never learned it.
  rows = [row("copy", "none", s, 1.0, 0.5 + 0.1 * s) for s in range(3)]
  rows += [row("copy", "rope", s, 1.0, 0.1 * s) for s in range(3)]
  rows += [row("sort", arm, s, 1.0 if arm == "none" else 0.2, 0.9 if arm == "rope" else 0.0)
           for arm in ("none", "rope") for s in range(3)]
  result = verdicts.verdict(rows, claim)
  # Per seed, copy's only setting ranks none first (MRR 1) and rope second (0.5): sort, where
  # rope wins past N, is left out because rope did not learn it in distribution.
  assert result["delta"] == pytest.approx(0.5) and result["se"] == 0
  assert result["word"] == "reproduced" and "sort: rope 0.20 < 0.9" in result["why"], result
  only_sort = [r for r in rows if r["overrides"]["data.name"] == "sort"]
  untestable = verdicts.verdict(only_sort, claim)
  assert untestable["word"] == "untestable here" and "rope 0.20" in untestable["why"]
