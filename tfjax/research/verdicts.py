"""Verdicts of published claims from per-seed sweep results, by one rule.

A claim (a dict in its sweep config's CLAIMS) compares two sides, each an arm (override values)
and a metric, and names the direction the paper reports:
  {'id', 'claim': text, 'paper': the published number as text,
   'a': {override: value, ..., 'metric': name}, 'b': {... 'metric': name},
   'expect': 'less' | 'greater'   a's metric is lower | higher than b's,
   'kind': 'mean' (default; per-seed values, Welch's t) | 'count' (failures per seed, Fisher),
   'requires': [precondition, ...]  optional, see `check_preconditions`}

THE RULE (docs/ablations.md states it, from RULE_TEXT):
  mean   Δ = mean(a) - mean(b) over seeds, se = sqrt(s_a²/n_a + s_b²/n_b) (Welch), p = Welch's
         two-sided t-test. Threshold: p < ALPHA.
  count  a failure is a point whose `metric` is 1 (e.g. diverged). Δ = failure fraction of a -
         of b, se = the binomial se of that difference, p = Fisher's exact test (two-sided).
  words, in this order:
    untestable here  a stated precondition fails, or a side has fewer than 2 seeds
    tie              |Δ| < 1 se (Δ = 0 when se = 0)
    reproduced       Δ in the claimed direction, p < ALPHA
    direction only   Δ in the claimed direction, p >= ALPHA
    contradicted     Δ opposite to the claim, p < ALPHA
    opposite only    Δ opposite to the claim, p >= ALPHA
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05
SEED_KEYS = ("seed", "data.seed")  # as tfjax.research.sweep.SEED_KEYS
WORDS = ("reproduced", "direction only", "tie", "contradicted", "opposite only",
         "untestable here")
RULE_TEXT = (
    "**Verdict rule** (`tfjax/research/verdicts.py`, applied to the committed per-seed results). "
    "Each claim compares two arms on one metric. Losses and other per-seed numbers: Δ = mean(a) - "
    "mean(b) over seeds, se = sqrt(s_a²/n_a + s_b²/n_b), p from Welch's two-sided t-test. "
    "Failure counts: Δ = difference of the failure fractions, se its binomial standard error, "
    f"p from Fisher's exact test. Then, in this order: *untestable here* when a stated "
    f"precondition fails or an arm has fewer than 2 seeds; *tie* when |Δ| < 1 se; *reproduced* "
    f"when Δ has the claimed sign and p < {ALPHA}; *direction only* when it has the claimed sign "
    f"and p >= {ALPHA}; *contradicted* when Δ has the opposite sign and p < {ALPHA}; *opposite "
    f"only* when it has the opposite sign and p >= {ALPHA}.")


def welch(a: Sequence[float], b: Sequence[float]) -> dict:
  """{'delta', 'se', 't', 'df', 'p'} of mean(a) - mean(b) (Welch's unequal-variance t-test)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  delta, se = float(a.mean() - b.mean()), math.sqrt(va + vb)
  if se == 0:
    return {"delta": delta, "se": 0.0, "t": math.copysign(math.inf, delta) if delta else 0.0,
            "df": float(len(a) + len(b) - 2), "p": 0.0 if delta else 1.0}
  t = delta / se
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return {"delta": delta, "se": se, "t": t, "df": df,
          "p": float(2 * scipy_stats.t.sf(abs(t), df))}


def fisher(failed_a: int, n_a: int, failed_b: int, n_b: int) -> dict:
  """{'delta', 'se', 'p'}: failure fractions a - b, their binomial se, Fisher's exact p."""
  pa, pb = failed_a / n_a, failed_b / n_b
  se = math.sqrt(pa * (1 - pa) / n_a + pb * (1 - pb) / n_b)
  p = scipy_stats.fisher_exact([[failed_a, n_a - failed_a], [failed_b, n_b - failed_b]])[1]
  return {"delta": pa - pb, "se": se, "p": float(p)}


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


def values(rows: Sequence[dict], side: Mapping) -> list[float]:
  """The side's metric in every finished row of its arm (finite values only)."""
  out = []
  for row in rows:
    if row["status"] == "done" and matches(row, side):
      value = row["metrics"].get(side["metric"])
      if isinstance(value, (int, float)) and math.isfinite(value):
        out.append(float(value))
  return out


def check_preconditions(rows: Sequence[dict], requires: Sequence[Mapping]) -> Optional[str]:
  """None when every precondition holds, else the first failing one as text.

  A precondition {'where': {override: value}, 'metric': m, 'min': x, 'what': text} holds when
  every arm matching `where` has a seed-mean of m of at least x (e.g. each arm learned the task
  in distribution, exact match >= 0.9), and at least one row matches."""
  for req in requires:
    arms: dict = {}
    for row in rows:
      if row["status"] == "done" and matches(row, req.get("where", {}), exact=False):
        label = ",".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(row["overrides"].items())
                         if k != "seed")
        arms.setdefault(label, []).append(row["metrics"].get(req["metric"], math.nan))
    if not arms:
      return f"{req['what']}: no finished run"
    failing = {label: float(np.mean(v)) for label, v in arms.items()
               if not np.mean(v) >= req["min"]}
    if failing:
      worst = "; ".join(f"{label} {v:.2f}" for label, v in failing.items())
      return f"{req['what']} fails ({req['metric']} < {req['min']:g}: {worst})"
  return None


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
  over (setting, n >= min_n) of the given settings (tfjax/research/mrr.py), one seed at a time."""
  from tfjax.research import mrr as mrr_lib  # pylint: disable=import-outside-toplevel
  out = []
  seeds = sorted({r["overrides"]["seed"] for r in rows if r["status"] == "done"})
  arms = list(dict.fromkeys(r["overrides"][spec["arms"]] for r in rows))
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


def verdict(rows: Sequence[dict], claim: Mapping) -> dict:
  """{'word', 'delta', 'se', 'p', 'n_a', 'n_b', 'why'} of one claim on the result rows."""
  if claim.get("kind") == "mrr":
    learned, not_learned = learned_settings(rows, claim["mrr"])
    skipped = "; ".join(f"{s}: {why}" for s, why in not_learned.items())
    if not learned:
      return {"n_a": 0, "n_b": 0, "delta": None, "se": None, "p": None,
              "word": "untestable here",
              "why": f"no {claim['mrr'].get('label', claim['mrr']['setting'])} learned in "
                     f"distribution by every arm ({skipped})"}
    result = verdict(per_seed_mrr(rows, claim["mrr"], learned), {**claim, "kind": "mean"})
    note = f"ranked over {', '.join(map(str, learned))}" + (f"; left out: {skipped}"
                                                            if skipped else "")
    return {**result, "why": "; ".join(w for w in (result["why"], note) if w)}
  failed = check_preconditions(rows, claim.get("requires", ()))
  if claim.get("kind", "mean") == "count":
    a = [r for r in rows if r["status"] == "done" and matches(r, claim["a"])]
    b = [r for r in rows if r["status"] == "done" and matches(r, claim["b"])]
    fails = lambda side, rs: sum(r["metrics"].get(side["metric"]) == 1 for r in rs)  # noqa: E731
    n_a, n_b = len(a), len(b)
    stats = (fisher(fails(claim["a"], a), n_a, fails(claim["b"], b), n_b)
             if n_a and n_b else None)
  else:
    va, vb = values(rows, claim["a"]), values(rows, claim["b"])
    n_a, n_b = len(va), len(vb)
    stats = welch(va, vb) if n_a > 1 and n_b > 1 else None
  out = {"n_a": n_a, "n_b": n_b, **(stats or {"delta": None, "se": None, "p": None})}
  if failed:
    return {**out, "word": "untestable here", "why": failed}
  if min(n_a, n_b) < 2:
    return {**out, "word": "untestable here", "why": f"seeds: {n_a} and {n_b} (2 needed)"}
  return {**out, "word": word(stats["delta"], stats["se"], stats["p"], claim["expect"]),
          "why": ""}


def format_ours(result: Mapping, kind: str = "mean") -> str:
  """'Δ = -0.120 ± 0.031 (3.9 se, p = 0.008; 3 vs 3 seeds)': the evidence a verdict rests on."""
  if result["delta"] is None:
    return f"{result['n_a']} vs {result['n_b']} seeds"
  ratio = (f"{abs(result['delta']) / result['se']:.1f} se" if result["se"] else "se 0")
  unit = " (failure fraction)" if kind == "count" else ""
  return (f"Δ = {result['delta']:+.3g} ± {result['se']:.2g}{unit} ({ratio}, "
          f"p = {result['p']:.2g}; {result['n_a']} vs {result['n_b']} seeds)")
