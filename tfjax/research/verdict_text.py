"""A verdict's evidence as the page prints it (verdicts.format_ours)."""

from __future__ import annotations

import math
from typing import Mapping


def format_ours(result: Mapping, kind: str = "mean") -> str:
  """'Δ = -0.120 ± 0.031 (3.9 se, p = 0.008, Holm 0.02; 3 vs 3 seeds)': the evidence."""
  if result["delta"] is None:
    return (f"{result['n_a']} seeds" if result["n_b"] == math.inf else
            f"{result['n_a']} vs {result['n_b']} seeds")
  ratio = (f"{abs(result['delta']) / result['se']:.1f} se" if result["se"] else "se 0")
  unit = " (failure fraction)" if result.get("kind", kind) == "count" else ""
  # Every claim of a Holm family shows its adjusted p, also where it equals the raw p (the
  # largest p of a family), so no row of a family reads as unadjusted; a claim judged alone
  # (a second metric, a family of one) shows none.
  adjusted = (f", Holm {result['p_holm']:.2g}" if result.get("p_holm") is not None
              and result.get("holm_family", 1) > 1 else "")
  seeds = (f"{result['n_a']} seeds" if result["n_b"] == math.inf else
           f"{result['n_a']} vs {result['n_b']} seeds")
  if result.get("parity"):
    par = result["parity"]
    lo, hi = par["ci"]
    test = "inside" if par["test"] == "equal" else "beyond"
    return (f"Δ = {result['delta']:+.3g} ± {result['se']:.2g} (90% CI [{lo:+.3g}, {hi:+.3g}], "
            f"margin ±{par['margin']:g}; p({test}) = {result['p']:.2g}{adjusted}; {seeds})")
  return (f"Δ = {result['delta']:+.3g} ± {result['se']:.2g}{unit} ({ratio}, "
          f"p = {result['p']:.2g}{adjusted}; {seeds})")
