"""Pre-registered confirmations: exploratory claims rerun once on fresh seeds under a plan
committed before the run (configs/ablations/confirm/*.py; issue 59).

A plan module defines PLAN = {'id', 'registered', 'sections': {section: {'claims': (claim ids
of configs/ablations/<section>.py), 'seeds': (...), 'where': {key: value} (optional: only the
section's points with these overrides), 'evaluate': bool (default True: run the section's
evaluate_point)}}} and binds a `Plan` to it, which makes the module a sweep config whose "scale"
is a section name:

    python experiments/sweep.py --config=configs/ablations/confirm/replication_1.py:norm ...

(experiments/confirm.py wraps that, checks that the plan is committed and records its commit).
The planned points are the section's medium-scale points of the arms the planned claims and
their controls read, with the plan's seeds instead of the section's. The claims are judged by
the verdict rule on the planned rows alone, without earlier looks (`judge`), and only once every
planned point has a result (the plan's stopping rule).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from typing import Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.research import sweep_results, verdicts

SCALE = "medium"  # the scale every confirmed exploratory verdict was read at
RESULTS_DIR = os.path.join("docs", "ablations", "results", "confirm")
_CLAIM_KEYS_DROPPED = ("earlier_looks",)  # planned seeds are read once: no looks to correct for


def plan_hash(plan: dict) -> str:
  """12 hex digits naming the plan's content (rows of another hash are not read)."""
  text = json.dumps(plan, sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def results_path(repo: str, plan_id: str, section: str) -> str:
  return os.path.join(repo, RESULTS_DIR, f"{plan_id}_{section}.jsonl")


class Plan:
  """A plan's sections as sweep configs: get_config / get_sweep / CLAIMS / REPORT /
  evaluate_point take the section name where a sweep config takes its scale."""

  def __init__(self, plan: dict, path: str):
    self.plan, self.path = plan, path
    self.repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(path))))
    self._section: Optional[str] = None  # the section get_config last built (evaluate_point's)

  def section(self, name: Optional[str]) -> dict:
    sections = self.plan["sections"]
    if name not in sections:
      raise ValueError(f"plan {self.plan['id']} has no section {name!r}; its sections: "
                       f"{', '.join(sections)} (pass one as --config=PLAN.py:SECTION)")
    return sections[name]

  def module(self, name: str):
    self.section(name)
    return sweep_lib.load_module(os.path.join(self.repo, "configs", "ablations", f"{name}.py"))

  def get_config(self, name=None):
    self._section = name
    return self.module(name).get_config(SCALE)

  def claims(self, name=None) -> list[dict]:
    """The section's planned claims as the section states them, without earlier looks."""
    wanted = self.section(name)["claims"]
    by_id = {c["id"]: c for c in self.module(name).CLAIMS(SCALE)}
    missing = [c for c in wanted if c not in by_id]
    if missing:
      raise ValueError(f"plan {self.plan['id']}, section {name}: no claim {missing} in "
                       f"configs/ablations/{name}.py (its claims: {', '.join(by_id)})")
    return [{k: v for k, v in by_id[c].items() if k not in _CLAIM_KEYS_DROPPED} for c in wanted]

  def get_sweep(self, name=None) -> list[dict]:
    """The section's medium points of every arm a planned claim or its controls read (within
    the section's `where`), once per arm, crossed with the plan's seeds."""
    spec, claims = self.section(name), self.claims(name)
    arms: dict = {}
    for point in self.module(name).get_sweep(SCALE):
      arm = {k: v for k, v in point.items() if k not in sweep_lib.SEED_KEYS}
      if all(arm.get(k) == v for k, v in spec.get("where", {}).items()) and any(
          verdicts.reads(claim, arm) for claim in claims):
        arms.setdefault(json.dumps(arm, sort_keys=True), arm)
    if not arms:
      raise ValueError(f"plan {self.plan['id']}, section {name}: no point of the section is "
                       "read by the planned claims")
    return [{**arm, "seed": seed} for arm in arms.values() for seed in spec["seeds"]]

  def report(self, name=None) -> dict:
    report = getattr(self.module(name), "REPORT", {})
    report = dict(report(SCALE) if callable(report) else report)
    report["plots"] = []  # the exploratory section draws the figures
    report["mrr"] = []
    return report

  def evaluate_point(self, config, workdir):
    if not self.section(self._section).get("evaluate", True):
      return {}
    evaluate = getattr(self.module(self._section), "evaluate_point", None)
    return evaluate(config, workdir) if evaluate else {}

  def commit(self) -> str:
    """The commit of the plan file; ValueError when it is not committed as it stands."""
    rel = os.path.relpath(self.path, self.repo)
    try:
      dirty = subprocess.run(["git", "-C", self.repo, "status", "--porcelain", "--", rel],
                             check=True, capture_output=True, text=True).stdout.strip()
      commit = subprocess.run(["git", "-C", self.repo, "log", "-1", "--format=%h", "--", rel],
                              check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
      raise ValueError(f"cannot read the plan's commit from git ({e}); a confirmation runs "
                       "from a git checkout") from None
    if dirty or not commit:
      raise ValueError(f"{rel} is not committed as it stands: commit the plan before running "
                       "it (its commit is recorded in every result row)")
    return commit


def stamp(rows: Sequence[dict], plan: dict, commit: str) -> list[dict]:
  """Result records with the plan they were run under: {'id', 'commit', 'hash'}."""
  tag = {"id": plan["id"], "commit": commit, "hash": plan_hash(plan)}
  return [{**row, "plan": tag} for row in rows]


def load_rows(path: str) -> list[dict]:
  """A confirmation's result rows (sweep_results.load's, with each row's `plan`)."""
  rows = sweep_results.load(path)
  with open(path, encoding="utf-8") as f:
    plans = [json.loads(line).get("plan") for line in f]
  return [{**row, "plan": plan} for row, plan in zip(rows, plans)]


def judge(module, section: str, repo: str) -> dict:
  """{'claims': [claim with 'result'], 'done': k, 'planned': n, 'status': 'read' | 'pending' |
  'mismatch', 'commit', 'why'} of one planned section. Nothing is judged until every planned
  point has a result of this plan (its hash)."""
  plan = module.PLAN
  claims = module.CLAIMS(section)
  planned = module.get_sweep(section)
  path = results_path(repo, plan["id"], section)
  rows = load_rows(path) if os.path.exists(path) else []
  out = {"claims": claims, "planned": len(planned), "done": 0, "commit": None, "why": "",
         "seeds": module.PLAN["sections"][section]["seeds"], "rows": rows}
  current = plan_hash(plan)
  foreign = [r for r in rows if not r.get("plan") or r["plan"]["hash"] != current]
  if foreign:
    return {**out, "status": "mismatch",
            "why": f"{len(foreign)} rows were run under another version of the plan (hash "
                   f"{sorted({(r.get('plan') or {}).get('hash', 'none') for r in foreign})}, "
                   f"now {current}): they are not read"}
  have = [r for r in rows if r["status"] in ("done", "diverged")
          and any(r["overrides"] == p for p in planned)]
  out.update(done=len(have), commit=sorted({r["plan"]["commit"] for r in have}) or None)
  if len(have) < len(planned):
    return {**out, "status": "pending",
            "why": f"{len(have)} of {len(planned)} planned points have results; nothing is read "
                   "before all have (the plan's stopping rule)"}
  devices = sorted({r.get("device") or "not recorded" for r in have})
  if len(devices) > 1:  # the plan: every point of a section on one device kind
    return {**out, "status": "mismatch",
            "why": f"the planned points ran on {' and '.join(devices)}; the plan runs a section "
                   "on one device kind"}
  judged = verdicts.judge_claims(have, claims)
  return {**out, "status": "read", "devices": devices,
          "claims": [{**c, "result": r} for c, r in zip(claims, judged)]}
