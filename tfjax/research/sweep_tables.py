"""Sweep results as tables: reading point directories, per-variant statistics, results.csv,
results_summary.csv, results.md and the mean-reciprocal-rank ranking. What each cell means:
tfjax/research/sweep_report.py."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import statistics
from typing import Any, Optional, Sequence

from tfjax.research import mrr as mrr_lib
from tfjax.research import sweep as sweep_lib
from tfjax.research import sweep_results

FAMILY = re.compile(r"^(.*)@(\d+)$")
DEFAULT_METRICS = ("eval/loss", "eval/perplexity", "eval/exact_match", "diverged")


# ---------------------------------------------------------------------------------------------
# Reading points
# ---------------------------------------------------------------------------------------------
def read_point(workdir: str) -> dict:
  """{'status', 'metrics', 'curves', 'error'} of one point directory."""
  metrics, curves, rates, initial_loss = {}, {}, [], None
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        try:
          record = json.loads(line)
        except ValueError:
          continue  # a line cut short by a crash
        step = record.pop("step", None)
        for key, value in record.items():
          if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[key] = value
            curves.setdefault(key, {})[step] = value
        if "train/tokens_per_sec" in record:
          rates.append(record["train/tokens_per_sec"])
        if step == 0 and "eval/loss" in record:
          initial_loss = record["eval/loss"]
        elif initial_loss is None and "train/loss" in record:
          initial_loss = record["train/loss"]
  if len(rates) > 1:
    metrics["train/tokens_per_sec"] = statistics.median(rates[1:])
  if "eval/loss" in metrics or "train/loss" in metrics or "train/diverged" in metrics:
    metrics["diverged"] = float(_diverged(metrics, initial_loss))
  extra = os.path.join(workdir, sweep_lib.POINT_METRICS_FILE)
  if os.path.exists(extra):
    metrics.update(sweep_lib.read_json(extra))
  status, error = "pending", None
  if sweep_lib.is_done(workdir):
    done = sweep_lib.read_json(os.path.join(workdir, sweep_lib.DONE_FILE))
    status = "diverged" if "diverged_at_step" in done else "done"
    error = done.get("error")
  elif os.path.exists(os.path.join(workdir, sweep_lib.FAILED_FILE)):
    status = "failed"
    error = sweep_lib.read_json(os.path.join(workdir, sweep_lib.FAILED_FILE)).get("error")
  elif metrics:
    status = "incomplete"
  return {"status": status, "metrics": metrics, "curves": curves, "error": error}


def _diverged(metrics: dict, initial_loss: Optional[float]) -> bool:
  if metrics.get("train/diverged"):  # the loop stopped it at a NaN/inf (training/divergence.py)
    return True
  losses = [metrics[k] for k in ("train/loss", "eval/loss") if k in metrics]
  if any(not math.isfinite(v) for v in losses):
    return True
  return (initial_loss is not None and "train/loss" in metrics
          and metrics["train/loss"] > initial_loss)


def collect(root: str, points: Sequence[sweep_lib.Point]) -> list[dict]:
  return [{"name": p.name, "overrides": p.overrides, **read_point(os.path.join(root, p.name))}
          for p in points]


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def stats(values: Sequence[Any]) -> dict:
  """mean and sample std (ddof=1) of the finite values; n = how many were finite, of total."""
  good = [float(v) for v in values if sweep_lib.finite(v)]
  return {"mean": statistics.fmean(good) if good else None,
          "std": statistics.stdev(good) if len(good) > 1 else None,
          "n": len(good), "total": len(values)}


def variant_keys(rows: Sequence[dict]) -> list[str]:
  """Override keys other than seeds, in order of first appearance."""
  keys = []
  for row in rows:
    keys += [k for k in row["overrides"] if k not in sweep_lib.SEED_KEYS and k not in keys]
  return keys


def group(rows: Sequence[dict], keys: Sequence[str]) -> list[tuple[tuple, list[dict]]]:
  """[(values of `keys`, rows)] in order of first appearance."""
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    values = tuple(hashable(row["overrides"].get(k)) for k in keys)
    groups.setdefault(values, []).append(row)
  return list(groups.items())


def hashable(value):
  return tuple(hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def summarize(rows: Sequence[dict], metrics: Sequence[str]) -> list[dict]:
  """One entry per variant (finished points only): its override values and stats per metric."""
  keys = variant_keys(rows)
  done = [r for r in rows if r["status"] == "done"]
  return [{"variant": dict(zip(keys, values)), "seeds": len(members),
           "stats": {m: stats([r["metrics"].get(m) for r in members]) for m in metrics}}
          for values, members in group(done, keys)]


def expand_metrics(requested: Sequence[str], available: Sequence[str]) -> list[str]:
  """Requested names, each a metric or a family prefix ('eval/exact_match' -> its @N members,
  sorted by N); names with no data are dropped."""
  out = []
  for name in requested:
    if name in available:
      out.append(name)
    members = sorted((int(m.group(2)), key) for key in available
                     if (m := FAMILY.match(key)) and m.group(1) == name)
    out += [key for _, key in members]
  return list(dict.fromkeys(out))


def families(metrics: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
  """{prefix: [(N, 'prefix@N'), ...] sorted by N}, each member once however often it is named
  (a plot passes every finished point's keys: a repeated member would count each seed's value
  once per point, shrinking the error bars towards the population std)."""
  out: dict[str, set[tuple[int, str]]] = {}
  for key in metrics:
    if m := FAMILY.match(key):
      out.setdefault(m.group(1), set()).add((int(m.group(2)), key))
  return {k: sorted(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def format_stat(s: dict) -> str:
  if s["mean"] is None:
    return "n/a"
  text = f"{s['mean']:.4g}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")
  return text + (f" [{s['n']} of {s['total']}]" if s["n"] < s["total"] else "")


def _cell(value) -> str:
  if value is None:
    return ""
  return repr(value) if isinstance(value, float) else sweep_lib.format_value(value)


def write_csv(path: str, rows: Sequence[dict]) -> None:
  keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
  metrics = sorted({k for r in rows for k in r["metrics"]})
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(["name", "status", *keys, *metrics])
    for r in rows:
      writer.writerow([r["name"], r["status"], *(_cell(r["overrides"].get(k)) for k in keys),
                       *(_cell(r["metrics"].get(m)) for m in metrics)])


def write_summary_csv(path: str, summary: Sequence[dict], metrics: Sequence[str]) -> None:
  keys = list(summary[0]["variant"]) if summary else []
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow([*keys, "seeds", *(f"{m}:{s}" for m in metrics for s in ("mean", "std", "n"))])
    for entry in summary:
      writer.writerow([*(_cell(entry["variant"][k]) for k in keys), entry["seeds"],
                       *(_cell(entry["stats"][m][s]) for m in metrics for s in ("mean", "std",
                                                                                  "n"))])


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(row) + " |" for row in body]


def markdown(title: str, rows: Sequence[dict], summary: Sequence[dict],
             metrics: Sequence[str], rankings: Sequence[dict] = ()) -> str:
  counts = {s: sum(r["status"] == s for r in rows) for s in ("done", "failed", "diverged")}
  diverged = f"{counts['diverged']} diverged, " if counts["diverged"] else ""
  lines = [f"# {title}", "",
           f"{len(rows)} points: {counts['done']} finished, {diverged}{counts['failed']} failed, "
           f"{len(rows) - sum(counts.values())} not finished. Cells: mean ± sample "
           "std (ddof=1) over seeds; [k of n]: only k of n seeds gave a finite value; n/a: none "
           "did.", ""]
  keys = list(summary[0]["variant"]) if summary else []
  label = lambda e: [sweep_lib.format_value(e["variant"][k]) for k in keys]  # noqa: E731
  scalars = [m for m in metrics if not FAMILY.match(m)]
  if summary and scalars:
    lines += ["## Final metrics", ""]
    lines += _md_table([k.split(".")[-1] for k in keys] + ["seeds"] + scalars,
                       [label(e) + [str(e["seeds"])] + [format_stat(e["stats"][m])
                                                        for m in scalars] for e in summary])
    lines.append("")
  for prefix, members in families(metrics).items():
    # Variants without a value at any N (a family only some arms have) get no row.
    shown = [e for e in summary if any(e["stats"][key]["total"] and e["stats"][key]["n"]
                                       for _, key in members)]
    lines += [f"## {prefix}@N", ""]
    lines += _md_table([k.split(".")[-1] for k in keys] + [f"@{n}" for n, _ in members],
                       [label(e) + [format_stat(e["stats"][key]) for _, key in members]
                        for e in shown])
    lines.append("")
  for ranking in rankings:
    lines += [f"## {ranking['heading']}", ""]
    lines += _md_table([ranking["arms"].split(".")[-1], "MRR"],
                       [[sweep_lib.format_value(arm), f"{value:.3f}"]
                        for arm, value in ranking["mrr"].items()])
    lines.append("")
  for status, title in (("diverged", "Diverged points"), ("failed", "Failed points")):
    listed = [r for r in rows if r["status"] == status]
    if listed:
      lines += [f"## {title}", ""] + [f"- `{r['name']}`: {r['error']}" for r in listed] + [""]
  return "\n".join(lines)


def rank_arms(summary: Sequence[dict], metrics: Sequence[str], spec: dict) -> Optional[dict]:
  """Kazemnejad et al.'s mean reciprocal rank of spec['arms'] over the settings of a family (see
  the module docstring); None when no setting has data. Returns {'mrr': {arm: value} (best
  first), 'settings': [...], 'heading', 'arms', 'spec'}.

  A setting is the values of spec['settings'] (the keys the arms are compared over, e.g.
  ('data.name',)) and N; without it, every override but the arms key and spec['per_arm'] (keys
  that travel with an arm, e.g. its embedding defaults). A per-arm key must never split the
  settings: an arm with its own value of it would be ranked against no other arm."""
  arms_key, members = spec["arms"], families(metrics).get(spec["metric"], [])
  members = [(n, key) for n, key in members if n >= spec.get("min_n", 0)]
  per_arm = set(spec.get("per_arm", ()))
  settings: dict = {}
  for entry in summary:
    if arms_key not in entry["variant"]:
      raise ValueError(f"mrr: arms key {arms_key!r} is not an override of this sweep "
                       f"(overrides: {list(entry['variant'])})")
    keys = (spec["settings"] if "settings" in spec else
            [k for k in entry["variant"] if k != arms_key and k not in per_arm])
    others = tuple((k, hashable(entry["variant"].get(k))) for k in keys)
    arm = hashable(entry["variant"][arms_key])
    for n, key in members:
      setting = settings.setdefault(others + (("@", n),), {})
      if arm in setting:
        raise ValueError(f"mrr: two variants give arm {arm!r} in setting {others + (('@', n),)}"
                         "; name the compared keys in the spec's 'settings'")
      setting[arm] = entry["stats"][key]["mean"]
  settings = {k: v for k, v in settings.items() if any(sweep_lib.finite(x) for x in v.values())}
  if not settings:
    return None
  arms = list(dict.fromkeys(a for v in settings.values() for a in v))
  settings = {k: {a: v.get(a) for a in arms} for k, v in settings.items()}
  values = mrr_lib.mean_reciprocal_rank(settings, spec.get("higher_is_better", True))
  lowest = f", N >= {spec['min_n']}" if spec.get("min_n") else ""
  better = "higher" if spec.get("higher_is_better", True) else "lower"
  heading = (f"Mean reciprocal rank of {arms_key} by {spec['metric']}@N ({len(settings)} "
             f"settings{lowest}; {better} {spec['metric']} ranks first)")
  return {"mrr": dict(sorted(values.items(), key=lambda kv: -kv[1])), "settings": list(settings),
          "heading": heading, "arms": arms_key, "spec": spec}


def line_keys(spec: dict, rows: Sequence[dict]) -> tuple:
  """The override keys that tell a plot's lines (bars) apart: spec['lines'], else every variant
  key but x and the panels. A drawn point pools the rows equal in these, x and the panel key."""
  excluded = {spec.get("x"), spec.get("panels")}
  return tuple(spec.get("lines") or [k for k in variant_keys(rows) if k not in excluded])


def select(rows: Sequence[dict], spec: dict) -> list[dict]:
  """The rows (finished or not) whose overrides match every condition of spec['where']; a
  condition that matches no point of the sweep is a mistake in the spec, not an empty plot."""
  for key, allowed in (spec.get("where") or {}).items():
    allowed = [hashable(v) for v in
               ([allowed] if isinstance(allowed, (str, int, float, bool)) else allowed)]
    kept = [r for r in rows if hashable(r["overrides"].get(key)) in allowed]
    if rows and not kept:
      values = sorted({repr(r["overrides"].get(key)) for r in rows})
      raise ValueError(f"plot {spec.get('file') or spec.get('metric')!r}: where {key}={allowed} "
                       f"matches no point of the sweep (its values of {key}: "
                       f"{', '.join(values)})")
    rows = kept
  return list(rows)


def arm_label(items) -> str:
  """'norm_placement=post, lr=0.003': an arm's (config key, value) pairs by the keys' last part."""
  return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in items)


def arms_by_device(rows: list) -> str:
  """Where a section's points ran on more than one device, which arms ran where: only arms of
  one device compare without the devices' numerics in the difference."""
  where: dict = {}
  for r in rows:
    arm = arm_label((k, v) for k, v in r["overrides"].items()
                     if k not in sweep_lib.SEED_KEYS) or "baseline"
    where.setdefault(r.get("device") or "device not recorded", {}).setdefault(arm, set()).add(
        r["overrides"].get("seed"))
  parts = [f"{device}: " + "; ".join(f"{arm} (seeds {', '.join(map(str, sorted(seeds)))})"
                                    for arm, seeds in arms.items())
           for device, arms in sorted(where.items())]
  return ("**Arms by device** (compare arms of one device; between devices the difference "
          "includes their numerics): " + ". ".join(parts) + ".")


def wall_time_text(rows: list) -> str:
  wall = sweep_results.wall_seconds(rows)
  if wall is None:
    return ("wall time not recorded (points finished before results recorded when they "
            "ended).")
  ends = sorted(r["finished"] for r in rows)
  return (f"wall time {wall / 60:.1f} min (the time at least one point was running, "
          f"{ends[0][:10]} to {ends[-1][:10]}).")
