"""Per-seed sweep results as one small JSONL file, the evidence committed for every verdict.

One line per point, in the sweep's order:
  {"point": name, "overrides": {...}, "seed": s, "status": "done" | "diverged" | ...,
   "metrics": {metric: value}, "commit": the code's commit, "seconds": the point's runtime,
   "device": what it ran on (absent in results recorded before points named it)}
`metrics` holds the metrics the tables, plots and claims use (the REPORT's metrics, their @N
families, `diverged`). `export` writes it from a sweep's workdir (experiments/sweep.py
--results_jsonl=PATH); `load` reads it back as the rows tfjax/research/sweep_report.py tabulates,
so docs/ablations.md is rebuilt from the committed files alone (tfjax/research/sweep_doc.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Optional, Sequence

EXTRA_METRICS = ("diverged",)


def code_commit() -> Optional[str]:
  """The short commit of the checkout this code runs from, with '-dirty' when tracked files
  differ from it; None outside a git checkout (the results then need --results_commit).
  $TFJAX_CODE_COMMIT, where set, is the answer instead: a copy of a checkout sent to another
  machine (scripts/gpu_session.sh) may carry no git history, or a stale one."""
  if os.environ.get("TFJAX_CODE_COMMIT"):
    return os.environ["TFJAX_CODE_COMMIT"]
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                           check=True, capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  return commit + ("-dirty" if dirty else "")


def device_name() -> str:
  """What this process computes on, as the results name it: 'cpu (N cores)' or the accelerator's
  kind (e.g. 'gpu: NVIDIA H200'). Runtimes, and float32 matmul rounding, depend on it."""
  import jax  # pylint: disable=import-outside-toplevel  (only where a point has trained)
  device = jax.devices()[0]
  if device.platform == "cpu":
    return f"cpu ({os.cpu_count()} cores)"
  return f"{device.platform}: {device.device_kind}"


def records(rows: Sequence[dict], done_files: dict, metrics: Sequence[str],
            commit: Optional[str] = None) -> list[dict]:
  """The JSONL records of finished (done or diverged) rows. `done_files` {name: SWEEP_DONE.json
  contents} gives each point's runtime and commit; `commit` is used where a point recorded none,
  and a point with neither is a ValueError (results must name the code that made them)."""
  keep = list(dict.fromkeys([*metrics, *EXTRA_METRICS]))
  out = []
  for row in rows:
    if row["status"] not in ("done", "diverged"):
      continue
    done = done_files.get(row["name"], {})
    point_commit = done.get("commit") or commit
    if not point_commit:
      raise ValueError(f"point {row['name']} records no commit (finished before the sweep "
                       "recorded one): pass --results_commit=<the commit it ran at>")
    out.append({"point": row["name"], "overrides": row["overrides"],
                "seed": row["overrides"].get("seed"), "status": row["status"],
                "metrics": {m: row["metrics"][m] for m in keep if m in row["metrics"]},
                "commit": point_commit, "seconds": done.get("seconds"),
                **({"device": done["device"]} if done.get("device") else {})})
  return out


def write(path: str, recs: Sequence[dict]) -> None:
  """One JSON object a line, keys sorted: the same results give the same bytes."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for rec in recs:
      f.write(json.dumps(rec, sort_keys=True) + "\n")


def load(path: str) -> list[dict]:
  """The rows of a results file: {'name', 'overrides', 'status', 'metrics', 'commit',
  'seconds', 'device'}, as tfjax.research.sweep_report.collect gives them from a workdir."""
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      try:
        rec = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
      rows.append({"name": rec["point"], "overrides": rec["overrides"],
                   "status": rec["status"], "metrics": rec["metrics"], "curves": {},
                   "error": None, "commit": rec["commit"], "seconds": rec["seconds"],
                   "device": rec.get("device")})
  return rows
