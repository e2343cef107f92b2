"""Verdicts of published claims from per-seed sweep results, by one rule.

A claim (a dict in its sweep config's CLAIMS) compares two sides, each an arm (override values)
and a metric, and names the direction the paper reports:
  {'id', 'claim': text, 'paper': the published number as text,
   'a': {override: value, ..., 'metric': name}, 'b': {... 'metric': name},
   'expect': 'less' | 'greater'   a's metric is lower | higher than b's,
   'kind': 'mean' (default; per-seed values, Welch's t) | 'count' (failures per seed, Fisher)
           | 'mrr' (per-seed mean reciprocal rank, the exact permutation test; see
             `per_seed_mrr`),
   'requires': [condition, ...]  preconditions (e.g. every arm learned the task), and
   'controls': [condition, ...]  positive controls: the paper's own reference behaviour at this
                                 setting (e.g. post-LN with warmup trains); see `check_conditions`,
   'bounds': (floor, ceiling)    of the metric, where not in BOUNDS;
   'bounds_what': str            what those bounds are (printed in the untestable reason);
   'failure': {'metric': m, 'below': x}  a seed whose m is below x (or not finite) failed: the
                                 claim is bimodal when one did, as a loss claim with a failed seed;
   'confound': str               a difference from the paper's setting that decides the
                                 comparison (the config states it): the claim is untestable;
   'parity': margin              a parity claim (the paper finds the arms on par): judged by
                                 whether Δ lies within ±margin (see `parity` below), not by a
                                 direction ('expect' then only orders the arms in the text);
   'earlier_looks': [(n_a, n_b)] seeds were added after the claim was read at these counts:
                                 p is multiplied by the number of looks (Bonferroni);
   'paper_effect': |Δ|           the paper's effect in the metric: below MIN_POWER power for
                                 it, a non-significant claim under MIN_SEEDS needs more seeds;
   b may be {'value': x}: a's seeds against the number x, by Student's one-sample t}

THE RULE is stated once, in tfjax/research/verdict_rule.py's RULE_TEXT (docs/ablations.md
prints it): per section, Welch's t on seed means (paired t for one arm at two lengths), Fisher
on failure counts (a bimodal loss claim is judged by its counts), the exact permutation test on
per-seed MRR, TOST / minimum-effect tests for parity claims; Holm within the section; then the
words of WORDS, untestable here first (precondition or control failed, declared confound,
fewer than 2 seeds, a design that cannot reach p < ALPHA, every seed at a floor or ceiling).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from tfjax.research.verdict_stats import (  # noqa: F401  (welch, fisher: this module's API)
    critical_ratio, fisher, holm, holm_levels, one_sample, paired, parity, permutation,
    parity_result, smallest_p, welch, welch_power)

from tfjax.research.verdict_text import format_ours  # noqa: F401  (this module's API)
from tfjax.research.verdict_rule import (  # noqa: F401  (RULE_TEXT, WORDS: this module's API)
    ALPHA, BOUND_TOL, BOUNDS, FAILURE_METRICS, MIN_POWER, MIN_SEEDS, PARITY_MARGIN, RULE_TEXT,
    SEED_KEYS, WORDS)


def word(delta: float, se: float, p: float, expect: str) -> str:
  """The verdict word of a testable comparison (see the module docstring)."""
  if expect not in ("less", "greater"):
    raise ValueError(f"a claim expects 'less' or 'greater', got {expect!r}")
  if abs(delta) < se or delta == 0:
    return "tie"
  agrees = (delta < 0) == (expect == "less")
  if agrees:
    return "reproduced" if p < ALPHA else "direction only"
  return "contradicted" if p < ALPHA else "opposite only"


def matches(row: dict, side: Mapping, exact: bool = True) -> bool:
  """Whether a result row is of the arm `side` names: its overrides other than seeds are exactly
  the side's keys but 'metric' (exact) or include them (not exact), with equal values."""
  arm = {k: v for k, v in side.items() if k != "metric"}
  overrides = {k: v for k, v in row["overrides"].items() if k not in SEED_KEYS}
  if exact and set(overrides) != set(arm):
    return False
  return all(overrides.get(k) == v for k, v in arm.items())


def metric_value(metrics: Mapping, metric: str):
  """A row's value of `metric`; 'x / y' is the ratio of two metrics (e.g. the last layer's
  gradient norm over the first's), None where either is missing."""
  if " / " in metric:
    num, den = (metrics.get(m) for m in metric.split(" / "))
    if not all(isinstance(v, (int, float)) for v in (num, den)) or den == 0:
      return None
    return num / den
  return metrics.get(metric)


def values(rows: Sequence[dict], side: Mapping) -> list[float]:
  """The side's metric in every finished row of its arm (finite values only)."""
  out = []
  for row in rows:
    if row["status"] == "done" and matches(row, side):
      value = metric_value(row["metrics"], side["metric"])
      if isinstance(value, (int, float)) and math.isfinite(value):
        out.append(float(value))
  return out


def _paired_values(rows: Sequence[dict], side: Mapping, other: str) -> tuple[list, list]:
  """The side's metric and `other` of the same runs, for the runs where both are finite: the
  pairs of a paired test, seed by seed."""
  va, vb = [], []
  for row in rows:
    if row["status"] == "done" and matches(row, side):
      pair = [metric_value(row["metrics"], m) for m in (side["metric"], other)]
      if all(isinstance(v, (int, float)) and math.isfinite(v) for v in pair):
        va.append(float(pair[0]))
        vb.append(float(pair[1]))
  return va, vb


def _label(row: dict) -> str:
  return ",".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(row["overrides"].items())
                  if k not in SEED_KEYS)


def _arm_value(members: Sequence[dict], metric: str, min_n: Optional[int]) -> float:
  """The seed-mean of `metric`; with min_n, of the family metric@N, the best over N >= min_n."""
  if min_n is None:
    return float(np.mean([r["metrics"].get(metric, math.nan) for r in members]))
  keys = sorted({k for r in members for k in r["metrics"]
                 if k.startswith(metric + "@") and int(k.split("@")[1]) >= min_n})
  means = [float(np.mean([r["metrics"].get(k, math.nan) for r in members])) for k in keys]
  return max(means) if means else math.nan


def check_conditions(rows: Sequence[dict], conditions: Sequence[Mapping],
                     prefix: str = "") -> Optional[str]:
  """None when every condition holds, else the first failing one as text.

  A condition {'where': {override: value}, 'metric': m, 'min': x and/or 'max': y, 'what': text,
  optional 'min_n': n, 'any': bool, 'every_seed': bool} holds when every arm matching `where` (at
  least one must) has a seed-mean of m within [x, y]; with 'any', when at least one arm does;
  with 'every_seed', an arm's value is its worst seed (e.g. the reference trains in every
  seed, not on average). With 'min_n', m is
  a family (m@N) and an arm's value is its best seed-mean over N >= min_n (e.g. "some arm
  generalizes past the training length")."""
  for cond in conditions:
    arms: dict = {}
    for row in rows:
      if row["status"] == "done" and matches(row, cond.get("where", {}), exact=False):
        arms.setdefault(_label(row), []).append(row)
    if not arms:
      return f"{prefix}{cond['what']}: no finished run"
    lo, hi = cond.get("min", -math.inf), cond.get("max", math.inf)
    value = {label: _arm_value(m, cond["metric"], cond.get("min_n")) for label, m in arms.items()}
    if cond.get("every_seed"):  # the seed farthest outside [lo, hi] stands for its arm
      seed_values = {label: [v if isinstance(v, (int, float)) else math.nan for v in (
          metric_value(r["metrics"], cond["metric"]) for r in m)] for label, m in arms.items()}
      value = {label: min(vs, key=lambda v: -max(lo - v, v - hi) if math.isfinite(v)
                          else -math.inf) for label, vs in seed_values.items()}
    failing = {label: v for label, v in value.items() if not lo <= v <= hi}
    if (len(failing) == len(value)) if cond.get("any") else failing:
      bound = " and ".join(b for b in (f">= {lo:g}" if cond.get("min") is not None else "",
                                       f"<= {hi:g}" if cond.get("max") is not None else "") if b)
      worst = "; ".join(f"{label} {v:.2f}" for label, v in failing.items())
      which = "no arm has" if cond.get("any") else "needs"
      return f"{prefix}{cond['what']} fails ({which} {cond['metric']} {bound}: {worst})"
  return None


def check_preconditions(rows: Sequence[dict], requires: Sequence[Mapping]) -> Optional[str]:
  """check_conditions of a claim's 'requires' (kept for callers of the earlier name)."""
  return check_conditions(rows, requires)


def bounds_of(metric: str, claim: Mapping) -> Optional[tuple]:
  if "bounds" in claim:
    return tuple(claim["bounds"])
  return BOUNDS.get(metric, BOUNDS.get(metric.split("@")[0]))


def at_bound(va: Sequence[float], vb: Sequence[float], bounds: Optional[tuple]) -> Optional[str]:
  """'floor' | 'ceiling' when every value of both sides lies within BOUND_TOL of it, else None."""
  for name, edge in zip(("floor", "ceiling"), bounds or ()):
    if va and vb and all(abs(v - edge) <= BOUND_TOL for v in (*va, *vb)):
      return name
  return None


def _lower_is_better(metric: str) -> bool:
  """Loss-like metrics, whose failed seeds make a comparison bimodal (not ratios of them)."""
  return " / " not in metric and any(w in metric for w in ("loss", "ppl", "perplexity"))


def _failure_metric(members: Sequence[dict]) -> Optional[str]:
  return next((m for m in FAILURE_METRICS if any(m in r["metrics"] for r in members)), None)


def _failures(members: Sequence[dict], metric: Optional[str],
              rule: Optional[Mapping] = None) -> int:
  """Failed seeds: diverged, or `metric` = 1, or (with a claim's 'failure' rule) its metric below
  the rule's threshold or not finite."""
  def failed(r):
    if rule:
      value = metric_value(r["metrics"], rule["metric"])
      return not (isinstance(value, (int, float)) and value >= rule["below"])
    return metric is not None and r["metrics"].get(metric) == 1
  return sum(r["status"] == "diverged" or failed(r) for r in members)


def learned_settings(rows: Sequence[dict], spec: Mapping) -> tuple[list, dict]:
  """(settings every arm learned, {other setting: why}): a setting (e.g. a task) is learned when
  every arm (spec['all_arms'], else those in the rows) has results and a seed-mean of metric@n
  >= spec['learned_min'] at each n <= learned_max_n."""
  learned, not_learned = [], {}
  arms = spec.get("all_arms") or list(dict.fromkeys(r["overrides"][spec["arms"]] for r in rows))
  for setting in dict.fromkeys(r["overrides"][spec["setting"]] for r in rows):
    problems = []
    for arm in arms:
      members = [r for r in rows if r["status"] == "done" and
                 r["overrides"][spec["setting"]] == setting and r["overrides"][spec["arms"]] == arm]
      keys = sorted({k for r in members for k in r["metrics"] if k.startswith(spec["metric"] + "@")
                     and int(k.split("@")[1]) <= spec["learned_max_n"]})
      if not members or not keys:
        problems.append(f"{arm} has no results")
        continue
      worst = min(float(np.mean([r["metrics"].get(k, math.nan) for r in members])) for k in keys)
      if not worst >= spec["learned_min"]:
        problems.append(f"{arm} {worst:.2f} < {spec['learned_min']:g}")
    if problems:
      not_learned[setting] = ", ".join(problems)
    else:
      learned.append(setting)
  return learned, not_learned


def per_seed_mrr(rows: Sequence[dict], spec: Mapping, settings: Sequence) -> list[dict]:
  """Rows {arms key: arm, seed} with metric 'mrr': each seed's mean reciprocal rank of the arms
  over (setting, n >= min_n) of the given settings (tfjax/research/mrr.py), one seed at a time,
  for the seeds run on every one of those settings."""
  from tfjax.research import mrr as mrr_lib  # pylint: disable=import-outside-toplevel
  out = []
  seeds = sorted({r["overrides"]["seed"] for r in rows if r["status"] == "done"})
  arms = list(dict.fromkeys(r["overrides"][spec["arms"]] for r in rows))
  # A seed is ranked only where it has every setting: one with fewer (e.g. a task run at 5
  # seeds beside one at 3) would rank its arms over a different set of settings.
  has = {seed: {r["overrides"][spec["setting"]] for r in rows
                if r["status"] == "done" and r["overrides"]["seed"] == seed} for seed in seeds}
  seeds = [seed for seed in seeds if set(settings) <= has[seed]]
  for seed in seeds:
    scored: dict = {}
    for r in rows:
      o = r["overrides"]
      if r["status"] != "done" or o["seed"] != seed or o[spec["setting"]] not in settings:
        continue
      for key, value in r["metrics"].items():
        if key.startswith(spec["metric"] + "@") and int(key.split("@")[1]) >= spec["min_n"]:
          scored.setdefault((o[spec["setting"]], key), {})[o[spec["arms"]]] = value
    scored = {k: {a: v.get(a) for a in arms} for k, v in scored.items()}
    if scored:
      for arm, value in mrr_lib.mean_reciprocal_rank(scored).items():
        out.append({"overrides": {spec["arms"]: arm, "seed": seed}, "status": "done",
                    "metrics": {"mrr": value}})
  return out


def _finished(rows: Sequence[dict], side: Mapping) -> list[dict]:
  return [r for r in rows if r["status"] in ("done", "diverged") and matches(r, side)]


def _raw(rows: Sequence[dict], claim: Mapping) -> dict:
  """A claim's statistics before Holm: {'kind', 'delta', 'se', 'p', 'df', 'n_a', 'n_b', 'why',
  'untestable': reason or None}."""
  if claim.get("kind") == "mrr":
    return _raw_mrr(rows, claim)
  kind, notes = claim.get("kind", "mean"), []
  a, b = _finished(rows, claim["a"]), _finished(rows, claim["b"])
  rule = claim.get("failure")
  if kind == "mean" and (rule or _lower_is_better(claim["a"]["metric"])):
    failure = None if rule else _failure_metric(a + b)
    k = _failures(a + b, failure, rule)
    if k:
      kind = "count"
      failed = (f"below {rule['metric']} {rule['below']:.3g}" if rule
                else failure or "diverged")
      notes.append(f"bimodal ({k} of {len(a) + len(b)} seeds {failed}): judged by failure "
                   f"counts, not by the mean {'loss' if not rule else rule['metric']}")
  bounds = None
  if kind == "count":
    metric = claim["a"]["metric"] if claim.get("kind") == "count" else _failure_metric(a + b)
    n_a, n_b = len(a), len(b)
    k_a, k_b = _failures(a, metric, rule), _failures(b, metric, rule)
    stats = fisher(k_a, n_a, k_b, n_b) if n_a and n_b else None
    # No seed of either arm failed: nothing was unstable, so the counts cannot order the arms.
    # (Every seed of both failing is a result: the remedy the claim names did not help.)
    bounds = "floor" if n_a and n_b and k_a + k_b == 0 else None
    # A bimodal loss claim keeps its direction: lower loss <-> fewer failures. Of a
    # higher-is-better metric (accuracy), a lower value <-> more failures.
    expect = claim["expect"]
    if rule and not _lower_is_better(rule["metric"]):
      expect = {"less": "greater", "greater": "less"}[expect]
  else:
    va = values(rows, claim["a"])
    if "value" in claim["b"]:  # a against a fixed number (one-sample t): b is that number
      vb, n_b = [float(claim["b"]["value"])], math.inf
      stats = one_sample(va, vb[0]) if len(va) > 1 else None
    else:
      vb = values(rows, claim["b"])
      same_runs = ({k: v for k, v in claim["a"].items() if k != "metric"}
                   == {k: v for k, v in claim["b"].items() if k != "metric"})
      if same_runs and kind != "rank":  # one arm's metric at two settings (rotary at 2L vs L)
        va, vb = _paired_values(rows, claim["a"], claim["b"]["metric"])
      n_b = len(vb)
      test = permutation if kind == "rank" else paired if same_runs else welch
      stats = test(va, vb) if len(va) > 1 and n_b > 1 else None
    n_a = len(va)
    expect = claim["expect"]
    bounds = at_bound(va, vb, bounds_of(claim["a"]["metric"], claim))
  out = {"kind": kind, "expect": expect, "n_a": n_a, "n_b": n_b, "df": None,
         **{"delta": None, "se": None, "p": None, **(stats or {})}, "untestable": None}
  if claim.get("parity") and kind == "mean" and stats:
    out.update(parity_result(out, float(claim["parity"]), ALPHA))
  # Bonferroni over the earlier looks whose design could reject (the others spend no alpha). A
  # look is (n_a, n_b), read by this claim's test, or (n_a, n_b, test): read then by another
  # test ('mean', 'count', 'rank'), whose floor decides; n_b inf: a one-sample reading.
  looks = [tuple(n[:2]) for n in claim.get("earlier_looks", ())
           if smallest_p(n[2] if len(n) > 2 else kind, *n[:2]) < ALPHA]
  if looks and out["p"] is not None:
    out["p"], out["looks"] = min(1.0, (1 + len(looks)) * out["p"]), 1 + len(looks)
    read = ", ".join(f"{x}" if y == math.inf else f"{x} vs {y}" for x, y in looks)
    notes.append(f"read before at {read} seeds: p x {1 + len(looks)} (Bonferroni over the looks)")
  why = (check_conditions(rows, claim.get("requires", ()))
         or check_conditions(rows, claim.get("controls", ()), "control: ")
         or (f"confounded: {claim['confound']}" if claim.get("confound") else None))
  if not why and min(n_a, n_b) < 2:
    why = f"seeds: {n_a} and {n_b} (2 needed)"
  if not why and (floor_p := smallest_p(kind, n_a, n_b)) >= ALPHA:
    why = (f"underpowered: with {n_a} vs {n_b} seeds the smallest p "
           f"{'Fisher' if kind == 'count' else 'the test'} can give is {floor_p:.2g} "
           f">= {ALPHA}")
  if not why and bounds:
    measured = "the failure fraction" if kind == "count" else claim["a"]["metric"]
    why = f"every seed of both arms at the {bounds} of {measured}" + (
        f" ({claim['bounds_what']})" if claim.get("bounds_what") else "")
  return {**out, "untestable": why, "why": "; ".join(notes)}


def _raw_mrr(rows: Sequence[dict], claim: Mapping) -> dict:
  """Per-seed MRR over the settings every arm learned in distribution (the precondition) and
  where claim['mrr_controls'] hold (e.g. some arm generalizes past N: a setting where every arm
  sits at the floor past N ranks noise); untestable when no setting remains."""
  spec = claim["mrr"]
  learned, not_learned = learned_settings(rows, spec)
  controls = claim.get("mrr_controls", ())
  failed = {s: why for s in learned if (why := check_conditions(
      rows, [{**c, "where": {**c.get("where", {}), spec["setting"]: s}} for c in controls],
      "control: "))}
  ranked = [s for s in learned if s not in failed]
  skipped = "; ".join(f"{s}: {why}" for s, why in {**not_learned, **failed}.items())
  if not ranked:
    reason = (f"no {spec.get('label', spec['setting'])} learned in distribution by every arm"
              if not learned else "on no learned "
              f"{spec.get('label', spec['setting'])} does the positive control pass")
    return {"kind": "mean", "expect": claim["expect"], "n_a": 0, "n_b": 0, "delta": None,
            "se": None, "p": None, "df": None, "why": "", "untestable": f"{reason} ({skipped})"}
  note = f"ranked over {', '.join(map(str, ranked))}" + (f"; left out: {skipped}"
                                                         if skipped else "")
  result = _raw(per_seed_mrr(rows, spec, ranked),
                {**{k: v for k, v in claim.items() if k not in ("controls", "mrr_controls")},
                 "kind": "rank"})
  edge = _ranked_at_bound(rows, claim, ranked)
  if edge and not result["untestable"]:
    result["untestable"] = (f"both arms at the {edge} of {spec['metric']} at every ranked "
                            f"{spec.get('label', spec['setting'])} and length >= {spec['min_n']}")
  return {**result, "ranked": ranked, "why": "; ".join(w for w in (result["why"], note) if w)}


def _ranked_at_bound(rows: Sequence[dict], claim: Mapping, ranked: Sequence) -> Optional[str]:
  """'floor' | 'ceiling' when every seed of the claim's two arms sits at it in the metric the
  MRR ranks, over every ranked setting and length >= min_n (their ranks would order noise)."""
  spec = claim["mrr"]
  sides = []
  for side in (claim["a"], claim["b"]):
    sides.append([value for r in rows if r["status"] == "done"
                  and r["overrides"][spec["arms"]] == side[spec["arms"]]
                  and r["overrides"][spec["setting"]] in ranked
                  for key, value in r["metrics"].items()
                  if key.startswith(spec["metric"] + "@")
                  and int(key.split("@")[1]) >= spec["min_n"]])
  return at_bound(*sides, bounds_of(spec["metric"], claim))


def reads(claim: Mapping, overrides: Mapping) -> bool:
  """Whether a claim reads the points of these overrides: a side's arm, an arm of its controls or
  preconditions, or (a rank claim) any point of the section."""
  if claim.get("kind") == "mrr":
    return True
  row = {"overrides": overrides}
  return (any("value" not in side and matches(row, side) for side in (claim["a"], claim["b"]))
          or any(matches(row, cond.get("where", {}), exact=False)
                 for cond in (*claim.get("controls", ()), *claim.get("requires", ()))))


def raw_results(rows: Sequence[dict], claims: Sequence[Mapping]) -> list[dict]:
  """Each claim's statistics before Holm (judge_claims' `raws`)."""
  return [_raw(rows, claim) for claim in claims]


def judge_claims(rows: Sequence[dict], claims: Sequence[Mapping],
                 seed_count_words: bool = True, raws: Optional[list] = None) -> list[dict]:
  """{'word', 'delta', 'se', 'p', 'p_holm', 'n_a', 'n_b', 'kind', 'why'} of each claim of one
  section (a family for Holm's adjustment) on the result rows. seed_count_words=False leaves
  out the words that ask for more seeds (an arm under MIN_SEEDS): the word the evidence gives,
  as the leave-one-out robustness check compares it (tfjax/research/robustness.py)."""
  min_seeds = MIN_SEEDS if seed_count_words else 0
  raws = raw_results(rows, claims) if raws is None else raws
  ps = [r["p"] if not r["untestable"] and r["p"] is not None else None for r in raws]
  adjusted, levels = holm(ps), holm_levels(ps, ALPHA)
  family = sum(p is not None for p in ps)  # format_ours prints Holm for every claim of a family
  out = []
  for claim, raw, p_holm, level in zip(claims, raws, adjusted, levels):
    result = {k: v for k, v in raw.items() if k not in ("untestable", "expect")}
    if raw["untestable"]:
      why = "; ".join(w for w in (raw["untestable"], raw["why"]) if w)
      out.append({**result, "p_holm": None, "word": "untestable here", "why": why})
      continue
    if raw.get("parity"):
      verdict_word = ({"equal": "reproduced", "apart": "contradicted"}[raw["parity"]["test"]]
                      if p_holm < ALPHA else "inconclusive")
      if verdict_word == "inconclusive" and min(raw["n_a"], raw["n_b"]) < min_seeds:
        verdict_word = "needs more seeds"
      out.append({**result, "p_holm": p_holm, "holm_family": family, "word": verdict_word,
                  "why": raw["why"]})
      continue
    verdict_word = word(raw["delta"], raw["se"], p_holm, raw["expect"])
    few = min(raw["n_a"], raw["n_b"]) < min_seeds
    effect = claim.get("paper_effect") if raw["kind"] == "mean" else None  # (not in counts)
    level_p = level / raw.get("looks", 1)  # the raw p's level: p was multiplied by the looks
    power = welch_power(effect, raw["se"], raw.get("df"), level_p) if effect and raw["se"] else None
    if power is not None:
      raw["why"] = "; ".join(w for w in (raw["why"], f"power {power:.2f} for the paper's "
                                         f"|Δ| {effect:g} at level {level_p:.2g}") if w)
      if few and power < MIN_POWER and p_holm >= ALPHA:
        verdict_word = "needs more seeds"
    if verdict_word != "tie" and raw["se"] and few:
      ratio = abs(raw["delta"]) / raw["se"]
      crossing = critical_ratio(raw["kind"], level, raw.get("df"))
      if abs(ratio - crossing) < 1:
        verdict_word = "needs more seeds"
        raw["why"] = "; ".join(w for w in (
            raw["why"], f"{ratio:.1f} se, within 1 se of the {crossing:.1f} se where p crosses "
            f"its Holm level {level:.2g}; {MIN_SEEDS} seeds per arm needed") if w)
    out.append({**result, "p_holm": p_holm, "holm_family": family, "word": verdict_word,
                "why": raw["why"]})
  return out


def verdict(rows: Sequence[dict], claim: Mapping) -> dict:
  """One claim judged alone (a family of one: Holm changes nothing)."""
  return judge_claims(rows, [claim])[0]
