"""The tests behind tfjax/research/verdicts.py: Welch's t, Fisher's exact test, an exact
permutation test for ranks, the smallest p a design can give, Holm's step-down adjustment and the
Δ/se at which a claim crosses its level."""

from __future__ import annotations

import itertools
import math
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats


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


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
  """{'delta', 'se', 't', 'df', 'p'} of mean(a - b) over paired seeds (the same runs measured
  twice, e.g. at two lengths): Student's t on the per-seed differences."""
  if len(a) != len(b):
    raise ValueError(f"paired samples need one value per seed on each side: {len(a)} vs {len(b)}")
  return one_sample(np.asarray(a, float) - np.asarray(b, float), 0.0)


def one_sample(a: Sequence[float], value: float) -> dict:
  """{'delta', 'se', 't', 'df', 'p'} of mean(a) - value (Student's one-sample t-test)."""
  a = np.asarray(a, float)
  delta, se = float(a.mean() - value), float(a.std(ddof=1) / math.sqrt(len(a)))
  if se == 0:
    return {"delta": delta, "se": 0.0, "t": math.copysign(math.inf, delta) if delta else 0.0,
            "df": float(len(a) - 1), "p": 0.0 if delta else 1.0}
  t = delta / se
  return {"delta": delta, "se": se, "t": t, "df": float(len(a) - 1),
          "p": float(2 * scipy_stats.t.sf(abs(t), len(a) - 1))}


def _t_or_normal(df: Optional[float]):
  """Student's t at df, or the normal where df is None or infinite (scipy distributions)."""
  return scipy_stats.norm if df is None or not math.isfinite(df) else scipy_stats.t(df)


def parity(delta: float, se: float, df: Optional[float], margin: float) -> dict:
  """The two tests of a parity claim (|Δ| within ±margin), on Δ, its se and df (Welch's or the
  one-sample t's; None: normal):
    p_equal  two one-sided tests (TOST): the larger of the p of "Δ <= -margin" and of
             "Δ >= margin"; small when the (1 - 2 alpha) CI of Δ lies inside ±margin
    p_apart  the one-sided p of "|Δ| <= margin" on Δ's side (a minimum-effect test); small
             when that CI lies wholly beyond the margin
  At most one of the two is below alpha < 0.5."""
  if margin <= 0:
    raise ValueError(f"a parity margin must be positive, got {margin}")
  if se == 0:
    inside = abs(delta) < margin
    return {"p_equal": 0.0 if inside else 1.0, "p_apart": 1.0 if inside or abs(delta) == margin
            else 0.0}
  dist = _t_or_normal(df)
  p_equal = max(float(dist.sf((delta + margin) / se)), float(dist.cdf((delta - margin) / se)))
  return {"p_equal": p_equal, "p_apart": float(dist.sf((abs(delta) - margin) / se))}


def fisher(failed_a: int, n_a: int, failed_b: int, n_b: int) -> dict:
  """{'delta', 'se', 'p'}: failure fractions a - b, their binomial se, Fisher's exact p."""
  pa, pb = failed_a / n_a, failed_b / n_b
  se = math.sqrt(pa * (1 - pa) / n_a + pb * (1 - pb) / n_b)
  p = scipy_stats.fisher_exact([[failed_a, n_a - failed_a], [failed_b, n_b - failed_b]])[1]
  return {"delta": pa - pb, "se": se, "p": float(p)}


def permutation(a: Sequence[float], b: Sequence[float]) -> dict:
  """{'delta', 'se', 'p'} of mean(a) - mean(b): Welch's se for scale, and the two-sided p of the
  exact permutation test (every split of the pooled seeds into groups of len(a) and len(b); p is
  the fraction whose |Δ| is at least the observed one). For ranks such as a per-seed MRR, whose
  few discrete values can agree across every seed (se 0, where Welch's p would be 0)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  pooled, n_a = np.concatenate([a, b]), len(a)
  delta = float(a.mean() - b.mean())
  total = pooled.sum()
  extreme = count = 0
  for chosen in itertools.combinations(range(len(pooled)), n_a):
    in_a = pooled[list(chosen)].sum()
    split = in_a / n_a - (total - in_a) / len(b)
    extreme += abs(split) >= abs(delta) - 1e-12
    count += 1
  se = math.sqrt(a.var(ddof=1) / n_a + b.var(ddof=1) / len(b)) if min(n_a, len(b)) > 1 else 0.0
  return {"delta": delta, "se": se, "p": extreme / count}


def smallest_p(kind: str, n_a: int, n_b: int) -> float:
  """The smallest p the test of `kind` can return with these seed counts, over every outcome.

  count (Fisher's exact test): the minimum over all (n_a + 1)(n_b + 1) failure tables, e.g. 0.1
  for 3 vs 3 (all of one arm failing, none of the other: 2 / C(6, 3)). mean (Welch's t): 0 for
  n >= 2 per arm, since t grows without bound as the spread shrinks; no design floor. rank (the
  exact permutation test): 2 / C(n_a + n_b, n_a), both most extreme splits, e.g. 0.1 for 3 vs 3."""
  if kind == "rank":
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))
  if kind != "count":
    return 0.0
  return min(fisher(x, n_a, y, n_b)["p"] for x, y in
             itertools.product(range(n_a + 1), range(n_b + 1)))


def holm(ps: Sequence[Optional[float]]) -> list[Optional[float]]:
  """Holm's step-down adjusted p-values (None stays None and is not counted):
  p_(i) -> max over j <= i of min(1, (m - j + 1) p_(j)), with p_(1) <= ... <= p_(m)."""
  order = sorted((p, i) for i, p in enumerate(ps) if p is not None)
  m, out, running = len(order), list(ps), 0.0
  for rank, (p, i) in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p))
    out[i] = running
  return out


def holm_levels(ps: Sequence[Optional[float]], alpha: float) -> list[Optional[float]]:
  """The level each p is compared with in Holm's procedure: alpha / (m - rank) by its rank
  (0 = smallest) among the m given p-values."""
  order = sorted((p, i) for i, p in enumerate(ps) if p is not None)
  out: list[Optional[float]] = [None] * len(ps)
  for rank, (_, i) in enumerate(order):
    out[i] = alpha / (len(order) - rank)
  return out


def critical_ratio(kind: str, level: float, df: Optional[float]) -> float:
  """|Δ| / se at which the test's two-sided p equals `level`: Student's t quantile at Welch's df
  for means, the normal quantile for counts (the binomial se's scale) and for ranks (an
  approximation: their exact permutation test has no quantile of its own)."""
  return float(_t_or_normal(None if kind == "count" else df).ppf(1 - level / 2))


def welch_power(effect: float, se: float, df: Optional[float], level: float) -> float:
  """The chance that a two-sided t-test at `level` rejects when the true |Δ| is `effect` and
  the standard error is `se` (the noncentral t at Welch's df; the normal where df is None)."""
  ncp = abs(effect) / se
  if df is None or not math.isfinite(df):
    q = scipy_stats.norm.ppf(1 - level / 2)
    return float(scipy_stats.norm.sf(q - ncp) + scipy_stats.norm.cdf(-q - ncp))
  q = _t_or_normal(df).ppf(1 - level / 2)
  upper, lower = scipy_stats.nct.sf(q, df, ncp), scipy_stats.nct.cdf(-q, df, ncp)
  # scipy's noncentral t returns nan far in its tails (ncp of tens of se): 1 and 0 there.
  upper = upper if math.isfinite(upper) else float(ncp > q)
  return float(upper + (lower if math.isfinite(lower) else 0.0))


def parity_result(stats: Mapping, margin: float, alpha: float) -> dict:
  """A parity claim's p (the smaller of its two tests), which test that is, and the 90% CI."""
  tests = parity(stats["delta"], stats["se"], stats.get("df"), margin)
  test = "equal" if tests["p_equal"] <= tests["p_apart"] else "apart"
  df = stats.get("df")
  q = _t_or_normal(df).ppf(1 - alpha)
  ci = (stats["delta"] - q * stats["se"], stats["delta"] + q * stats["se"])
  return {"p": tests[f"p_{test}"], "parity": {"margin": margin, "test": test, "ci": ci}}
