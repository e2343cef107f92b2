"""Mean reciprocal rank of arms across settings (Kazemnejad et al. 2023, figures 1 and 2).

Kazemnejad, Padhi, Natesan Ramamurthy, Das & Reddy ("The Impact of Positional Encoding on Length
Generalization in Transformers", section 4, following HELM's aggregate ranking) compare position
encodings "against each other for all tasks and scenarios": in every setting (a task at one
evaluation length), the arms are ranked by their accuracy (rank 1 = best), and an arm's score is
the mean over the settings of 1 / its rank. With A arms it lies in [1/A, 1]; published (10 tasks,
lengths past the training ones): NoPE 0.69, T5's bias 0.55, ALiBi 0.50, Rotary 0.33, APE 0.22.

Conventions the paper leaves open, fixed here:
  ties     tied arms share the best of their ranks (competition ranking, 1, 1, 3): two arms that
           both solve a setting both get 1. A setting where every arm ties gives each 1.
  missing  an arm without a finite score in a setting (n/a, diverged) ranks after every arm that
           has one (tied with the other missing arms).
  seeds    the caller ranks one score per arm and setting: the sweep report uses the mean over
           seeds, as the paper's figure ranks the seed-averaged accuracies.
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, Optional


def _finite(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ranks(scores: Mapping[Hashable, Optional[float]], higher_is_better: bool = True) -> dict:
  """{arm: rank} in one setting: 1 + the number of arms strictly better (missing scores last)."""
  sign = 1.0 if higher_is_better else -1.0
  keyed = {arm: (sign * v if _finite(v) else -math.inf) for arm, v in scores.items()}
  return {arm: 1 + sum(other > key for other in keyed.values()) for arm, key in keyed.items()}


def mean_reciprocal_rank(settings: Mapping[Hashable, Mapping[Hashable, Optional[float]]],
                         higher_is_better: bool = True) -> dict:
  """{arm: mean over settings of 1 / rank}; `settings` maps each setting to {arm: score}.

  Every setting must score the same arms (a missing score is None, not a missing key): an arm
  absent from some settings would be averaged over fewer of them.
  """
  if not settings:
    raise ValueError("mean reciprocal rank needs at least one setting")
  arms = None
  totals: dict = {}
  for setting, scores in settings.items():
    if arms is None:
      arms = list(scores)
    elif set(scores) != set(arms):
      raise ValueError(f"setting {setting!r} ranks arms {sorted(map(str, scores))}, others rank "
                       f"{sorted(map(str, arms))}; give every setting every arm (None = no score)")
    for arm, rank in ranks(scores, higher_is_better).items():
      totals[arm] = totals.get(arm, 0.0) + 1.0 / rank
  return {arm: totals[arm] / len(settings) for arm in arms}
