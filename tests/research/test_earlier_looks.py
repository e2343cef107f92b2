"""Earlier readings count as looks across test beds (issue 59 item 2): a look read then by a test
that could reject spends alpha even where the claim's test now could not, a one-sample look
counts, and the post-LN gradient-growth claim, which moved from the norm sweep to norm_init,
has its p multiplied by its looks there, recomputed here from the committed results."""

import math
import os

import numpy as np
from scipy import stats

from tfjax.research import sweep, sweep_results, verdicts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(arm_values: dict, metric: str) -> list:
  return [{"overrides": {"model.position": arm, "seed": seed}, "status": "done",
           "metrics": {metric: value}}
          for arm, values in arm_values.items() for seed, value in enumerate(values)]


def test_a_look_read_by_a_test_that_could_reject_counts_though_the_claims_test_could_not():
  # Per-seed MRR by the exact permutation test: 5 vs 5 seeds, every seed ranks a above b.
  rows = _rows({"alibi": [1.0] * 5, "rope": [0.5] * 5}, "mrr")
  claim = {"a": {"model.position": "alibi", "metric": "mrr"},
           "b": {"model.position": "rope", "metric": "mrr"}, "expect": "greater",
           "kind": "rank"}
  alone = verdicts.verdict(rows, claim)["p"]
  assert math.isclose(alone, 2 / math.comb(10, 5))  # the permutation test's smallest p
  # A 3 vs 3 look by the permutation test could not go below 0.1: it spends nothing.
  assert verdicts.verdict(rows, {**claim, "earlier_looks": [(3, 3)]})["p"] == alone
  # The same counts read then by Welch's t (no floor) could reject: p x 2.
  welch = verdicts.verdict(rows, {**claim, "earlier_looks": [(3, 3, "mean")]})
  assert math.isclose(welch["p"], 2 * alone)
  assert "read before at 3 vs 3 seeds: p x 2" in welch["why"]
  # And Fisher's at 3 vs 3 (floor 0.1) spends nothing either.
  assert verdicts.verdict(rows, {**claim, "earlier_looks": [(3, 3, "count")]})["p"] == alone


def test_postln_gradient_growth_counts_its_readings_on_the_norm_sweep():
  config = sweep.load_module(os.path.join(ROOT, "configs", "ablations", "norm_init.py"))
  claims = config.CLAIMS("medium")
  grows = next(c for c in claims if c["id"] == "xiong_postln_grows")
  looks = grows["earlier_looks"]
  # Its readings on the norm sweep's char LM (smoke, the earlier medium grid twice, the
  # 12-layer grid at 3 and at 8 Xavier seeds), each a one-sample t with no floor.
  assert len(looks) == 5 and all(n_b == math.inf for _, n_b, *_ in looks)
  rows = sweep_results.load(os.path.join(ROOT, "docs", "ablations", "results",
                                         "norm_init_medium.jsonl"))
  # The claim's own statistic, recomputed: each post-LN seed's layer-6 over layer-1 gradient
  # norm of W_2, against 1 by Student's one-sample t.
  ratios = [r["metrics"]["init/grad_norm_ffn_wo@6"] / r["metrics"]["init/grad_norm_ffn_wo@1"]
            for r in rows if r["overrides"]["model.norm_placement"] == "post"
            and r["status"] == "done"]
  assert len(ratios) == 8
  raw = stats.ttest_1samp(ratios, 1.0).pvalue
  assert np.mean(ratios) > 1 and raw < verdicts.ALPHA  # alone it would read reproduced
  results = {c["id"]: r for c, r in zip(claims, verdicts.judge_claims(rows, claims))}
  judged = results["xiong_postln_grows"]
  assert math.isclose(judged["p"], min(1.0, (1 + len(looks)) * raw), rel_tol=1e-9)
  assert judged["p"] >= verdicts.ALPHA and judged["word"] == "direction only"
  # Holm over the section: the other two claims' p are far smaller, so it keeps the largest p.
  assert math.isclose(judged["p_holm"], judged["p"], rel_tol=1e-9)
  assert "read before at 2, 3, 3, 3, 8 seeds: p x 6" in judged["why"]
