"""Per-seed sweep results as one small JSONL file, the evidence committed for every verdict.

One line per point, in the sweep's order:
  {"point": name, "overrides": {...}, "seed": s, "status": "done" | "diverged" | ...,
   "metrics": {metric: value}, "commit": the code's commit, "seconds": the point's runtime (a
   packed point's: its share of the group's), "finished" and "span_seconds" (when the point, or
   its packed group, ended, and how long it ran: the section's wall time is their union),
   "device": what it ran on (absent in results recorded before points named it),
   "config": config_fingerprint of the point's resolved config}
`metrics` holds the metrics the tables, plots and claims use (the REPORT's metrics, their @N
families, `diverged`). `export` writes it from a sweep's workdir (experiments/sweep.py
--results_jsonl=PATH); `load` reads it back as the rows tfjax/research/sweep_report.py tabulates,
so docs/ablations.md is rebuilt from the committed files alone (tfjax/research/sweep_doc.py).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from typing import Optional, Sequence

EXTRA_METRICS = ("diverged",)
# Keys that change no result (bookkeeping, where the devices are split), left out of a
# config's fingerprint; and the seeds, which tell repeats of one arm apart.
_NOT_FINGERPRINTED = ("seed", "data.seed", "mesh.", "train.log_every", "train.checkpoint_every",
                      "train.keep_checkpoints")


def _flat(tree, prefix="") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
  return out


def config_fingerprint(config) -> str:
  """12 hex digits naming what a point trained: a hash of every value of its resolved config
  that differs from base_config()'s (tfjax/training/config/defaults.py), seeds and bookkeeping keys
  left out. A results row carries it ("config"); tfjax/research/sweep_doc.py uses a row only
  while the current config of its point has the same fingerprint, so a changed learning rate,
  warmup, depth or arm setting turns the committed results into "awaits a rerun". A key added
  to base_config with its default changes no fingerprint; a changed default is not seen (the
  row's commit names the code)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
  base = _flat(base_config().to_dict())
  ours = {k: v for k, v in _flat(config.to_dict()).items()
          if not any(k == x or (x.endswith(".") and k.startswith(x)) for x in _NOT_FINGERPRINTED)
          and (k not in base or base[k] != v)}
  text = json.dumps(ours, sort_keys=True, default=repr)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def provenance(config) -> dict:
  """What a finished point records besides its metrics: commit, device and config fingerprint."""
  return {"commit": code_commit(), "device": device_name(), "config": config_fingerprint(config)}


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
  """What this process computes on, as the results name it: 'cpu (N cores)' (', D devices' added
  when the CPU is split, mesh.cpu_devices) or the accelerator's kind (e.g. 'gpu: NVIDIA H200').
  Runtimes, and float32 rounding, depend on it: N is the cores this process may use (its
  affinity, not the machine's count), from which XLA:CPU sizes its thread pool and splits its
  threaded sums, and D devices sum the gradient over devices (docs/attention/funnel.md)."""
  import jax  # pylint: disable=import-outside-toplevel  (only where a point has trained)
  device = jax.devices()[0]
  if device.platform == "cpu":
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    split = len(jax.devices())
    return f"cpu ({cores} cores{f', {split} devices' if split > 1 else ''})"
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
                **({"finished": done["finished"], "span_seconds": done.get("packed", {}).get(
                    "group_seconds", done.get("seconds"))} if done.get("finished") else {}),
                **({"device": done["device"]} if done.get("device") else {}),
                **({"config": done["config"]} if done.get("config") else {})})
  return out


def wall_seconds(rows: Sequence[dict]) -> Optional[float]:
  """Seconds during which at least one of the rows' points (a packed one: its group) was
  running: the union of their [finished - span, finished] intervals. None unless every row
  records when it finished (points run before results recorded it do not)."""
  spans = []
  for row in rows:
    if not row.get("finished") or row.get("span_seconds") is None:
      return None
    end = datetime.datetime.strptime(row["finished"], "%Y-%m-%d %H:%M:%S").timestamp()
    spans.append((end - row["span_seconds"], end))
  total, reach = 0.0, float("-inf")
  for start, end in sorted(spans):
    total += max(0.0, end - max(start, reach))
    reach = max(reach, end)
  return total if spans else None


def write(path: str, recs: Sequence[dict]) -> None:
  """One JSON object a line, keys sorted: the same results give the same bytes."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for rec in recs:
      f.write(json.dumps(rec, sort_keys=True) + "\n")


def load(path: str) -> list[dict]:
  """The rows of a results file: {'name', 'overrides', 'status', 'metrics', 'commit',
  'seconds', 'device', 'config' (None: recorded before points named it)}, as
  tfjax.research.sweep_report.collect gives them from a workdir."""
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
                   "device": rec.get("device"), "config": rec.get("config"),
                   "finished": rec.get("finished"), "span_seconds": rec.get("span_seconds")})
  return rows
