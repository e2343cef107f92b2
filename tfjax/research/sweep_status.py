"""Each sweep point's state, read from the files the points write (no scheduler is asked).

  done         ROOT/<name>/SWEEP_DONE.json (diverged points too: a NaN/inf loss is a result)
  running      SWEEP_RUNNING.json (an attempt in progress), unless it names a process on this host
               that no longer exists (killed before it could clean up): then as if it were absent
  failed       SWEEP_FAILED.json: the first line of the error and the log to read
  queued       SWEEP_JOB.json (a launcher submitted the point) and no attempt running since
  interrupted  progress on disk (metrics.jsonl), not running: the next run resumes it
  pending      nothing yet

`experiments/sweep.py --status --workdir=ROOT` prints `format_status(collect(ROOT))`. The point
names come from ROOT/sweep.json, which every launcher writes before running anything.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional, Sequence

from tfjax.research import sweep as sweep_lib

STATES = ("done", "running", "queued", "failed", "interrupted", "pending")


def _read(path: str) -> Optional[dict]:
  try:
    return sweep_lib.read_json(path)
  except (OSError, ValueError):
    return None  # absent, or removed between the check and the read


def _process_gone(running: dict) -> bool:
  """Whether the attempt's process is known to be dead (only checkable on its own host)."""
  if running.get("host") != socket.gethostname() or not running.get("pid"):
    return False
  try:
    os.kill(int(running["pid"]), 0)
  except ProcessLookupError:
    return True
  except (PermissionError, ValueError):
    return False
  return False


def _newer(workdir: str, a: str, b: str) -> bool:
  """Whether file a in workdir was written after file b (e.g. resubmitted after it failed)."""
  try:
    return os.path.getmtime(os.path.join(workdir, a)) > os.path.getmtime(os.path.join(workdir, b))
  except OSError:
    return False


def _num_steps(workdir: str) -> Optional[int]:
  config = _read(os.path.join(workdir, "config.json"))
  try:
    return int(config["train"]["num_steps"])
  except (TypeError, KeyError, ValueError):
    return None


def _first_line(text) -> str:
  lines = str(text or "").strip().splitlines()
  return lines[0] if lines else ""


def point_state(workdir: str) -> dict:
  """{'state', 'step', 'num_steps', 'job', 'where', 'error', 'log', 'updated'} of one point."""
  info = {"state": "pending", "step": sweep_lib.last_step(workdir),
          "num_steps": _num_steps(workdir), "job": None, "where": None, "error": None,
          "log": sweep_lib.log_path(workdir), "updated": None}
  metrics = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(metrics):
    info["updated"] = os.path.getmtime(metrics)
  job = _read(os.path.join(workdir, sweep_lib.JOB_FILE))
  if job:
    info["job"] = job.get("job_id")
  if sweep_lib.is_done(workdir):
    info["state"] = "done"
    done = _read(os.path.join(workdir, sweep_lib.DONE_FILE)) or {}
    if done.get("diverged_at_step") is not None:  # a result: training stopped at a NaN/inf loss
      info["error"] = f"diverged at step {done['diverged_at_step']}"
    return info
  running = _read(os.path.join(workdir, sweep_lib.RUNNING_FILE))
  dead = bool(running) and _process_gone(running)
  if running and not dead:
    info["job"] = running.get("job") or info["job"]
    info["where"] = f"{running.get('host')} pid {running.get('pid')}"
    stale = job and running.get("job") != job.get("job_id") and \
        _newer(workdir, sweep_lib.JOB_FILE, sweep_lib.RUNNING_FILE)
    if stale:  # that attempt's job died elsewhere; the point was submitted again since
      info["state"], info["job"] = "queued", job.get("job_id")
    else:
      info["state"] = "running"
    return info
  failed = _read(os.path.join(workdir, sweep_lib.FAILED_FILE))
  resubmitted = job and _newer(workdir, sweep_lib.JOB_FILE, sweep_lib.FAILED_FILE)
  if failed is not None and not resubmitted:
    info["state"], info["error"] = "failed", _first_line(failed.get("error"))
    info["log"] = failed.get("log") or info["log"]
    return info
  if job and job.get("stopped"):
    info["state"], info["error"] = "interrupted", _first_line(job["stopped"])
  elif job and not (dead and _newer(workdir, sweep_lib.RUNNING_FILE, sweep_lib.JOB_FILE)):
    info["state"] = "queued"
  elif dead or os.path.exists(metrics):
    info["state"] = "interrupted"
  return info


def collect(root: str) -> list[dict]:
  """Every point of the sweep in ROOT (from sweep.json), in the sweep's order, with its state."""
  sweep_file = os.path.join(root, sweep_lib.SWEEP_FILE)
  if not os.path.exists(sweep_file):
    raise ValueError(f"{root} holds no sweep ({sweep_lib.SWEEP_FILE} is missing): give the "
                     "--workdir a sweep ran in")
  spec = sweep_lib.read_json(sweep_file)
  names = spec.get("order") or list(spec["points"])
  return [{"name": name, **point_state(os.path.join(root, name))} for name in names]


def _age(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f}s"
  if seconds < 7200:
    return f"{seconds / 60:.0f}min"
  return f"{seconds / 3600:.1f}h"


def format_status(rows: Sequence[dict], now: Optional[float] = None) -> str:
  """One line per point (state, name, progress and where / why), then the counts."""
  now = time.time() if now is None else now
  width = max([len(r["name"]) for r in rows] + [4])
  lines = []
  for r in rows:
    progress = f"step {r['step']}" + (f"/{r['num_steps']}" if r["num_steps"] else "")
    details = []
    if r["state"] == "failed":
      details.append(r["error"] or "(no error recorded)")
    elif r["state"] == "done" and r["error"]:
      details.append(r["error"])
    elif r["state"] == "interrupted" and r["error"]:
      details.append(f"job stopped: {r['error']}")
    if r["state"] in ("running", "queued", "interrupted") and r["job"]:
      details.append(f"job {r['job']}")
    if r["state"] == "running":
      if r["where"]:
        details.append(f"on {r['where']}")
      if r["updated"]:
        details.append(f"last metrics {_age(now - r['updated'])} ago")
    if r["state"] in ("failed", "interrupted", "running") and r["log"]:
      details.append(f"log: {r['log']}")
    lines.append(f"{r['state']:<11}  {r['name']:<{width}}  {progress:<11}  {'; '.join(details)}"
                 .rstrip())
  counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
  lines.append(f"{len(rows)} points: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
  return "\n".join(lines)
