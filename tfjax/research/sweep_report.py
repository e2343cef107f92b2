"""Sweep results: ROOT/results.csv, results_summary.csv, results.md and PNG plots.

Per point (ROOT/<name>/): the last value of every metric in metrics.jsonl, except
train/tokens_per_sec, which is the median over log events after the first (the first one includes
compilation); everything in point_metrics.json (evaluate_point hooks); and `diverged` = 1 when the
final train or eval loss is not finite or the final training loss is above the loss of the
untrained model (the step-0 eval loss, else the first logged training loss), else 0. (Training,
not eval, loss: on length-generalization tasks a model that learned the training lengths can have
a final eval loss far above the initial one.)

Points differing only in SEED_KEYS form one group; results.md shows per group the mean ± sample
standard deviation (ddof=1) over the seeds whose value is finite ('[k of n]' when some were not),
'n/a' when none is (e.g. learned positions past their table). Only finished points (SWEEP_DONE.json)
are aggregated; results.csv lists every point with its status.

Metrics named 'prefix@N' (eval/exact_match@32, long/ppl_sliding@256, init/grad_norm@3) form a
family: a table with one column per N and a plot against N.

A config module may set REPORT = dict(metrics=[...], plots=[...], mrr=[...]). `metrics` lists the
metrics (or families, by prefix) of results.md. Each plot is a dict:
  metric  a metric, or a family prefix with x='@'; with x='@' also a list of family prefixes,
          each drawn as its own lines (e.g. RoPE evaluated with and without scaling), labelled by
          `metric_labels` {prefix: text}
  x       None: bar chart | '@': against the family's N | an override key (e.g. 'optimizer.lr')
  curve   instead of metric: that metric against training step (from metrics.jsonl)
  lines   override keys telling lines (bars) apart; points equal in these are pooled (mean ± std).
          Default: every override key except seeds and x.
  panels  an override key: one subplot per value
  where   {override key: value or list of values}: only the points whose override is one of
          those values are drawn (one figure per claim out of a larger grid, and no pooling of
          points that differ in a key the lines do not name)
  xlabel, ylabel  axis labels (default: the x key, 'N (metric@N)' for families; the metric)
  logx, logy  log scales of the x axis / the metric axis (default: log when the positive values
          span a factor >= 8 (x) or >= 30 (metric); bar charts: metric axis linear)
  sort    True: lines (bars) in the order of their values of the `lines` keys, so that the
          pairs a claim compares sit together (default: the sweep's order)
  zero    bar charts: True (default) draws bars from 0; False draws each mean as a dot with its
          error bar on an axis that spans the data, for metrics (losses) whose differences are
          small next to their size
  published  the paper's numbers, drawn as a second panel titled `published_label` whose metric
          axis is labelled `published_xlabel` (the paper's units, hence its own axis), so that
          the paper's ranking or curve sits beside ours. Bar charts: {line label: number} (labels
          as drawn, e.g. 'ffn=relu'), in the same rows; plots against an override key:
          {line label: {x: number}}, on the same x axis
  title, file
Each `mrr` entry ranks arms by Kazemnejad et al.'s mean reciprocal rank (tfjax/research/mrr.py):
  metric  a family prefix; a setting is one N of it (N >= min_n) for one value of every other
          variant key (e.g. task x length), scored by the mean over seeds
  arms    the override key whose values are ranked (e.g. 'model.position')
  min_n   the smallest N counted (e.g. the first length past training); default all
  higher_is_better  default True (accuracy); False for perplexity
  title, file  of its bar chart; results.md gets a table of the same numbers
"""

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

_FAMILY = re.compile(r"^(.*)@(\d+)$")
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
    values = tuple(_hashable(row["overrides"].get(k)) for k in keys)
    groups.setdefault(values, []).append(row)
  return list(groups.items())


def _hashable(value):
  return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


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
                     if (m := _FAMILY.match(key)) and m.group(1) == name)
    out += [key for _, key in members]
  return list(dict.fromkeys(out))


def families(metrics: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
  """{prefix: [(N, 'prefix@N'), ...] sorted by N}, each member once however often it is named
  (a plot passes every finished point's keys: a repeated member would count each seed's value
  once per point, shrinking the error bars towards the population std)."""
  out: dict[str, set[tuple[int, str]]] = {}
  for key in metrics:
    if m := _FAMILY.match(key):
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
  scalars = [m for m in metrics if not _FAMILY.match(m)]
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
  first), 'settings': [...], 'heading', 'arms', 'spec'}."""
  arms_key, members = spec["arms"], families(metrics).get(spec["metric"], [])
  members = [(n, key) for n, key in members if n >= spec.get("min_n", 0)]
  settings: dict = {}
  for entry in summary:
    if arms_key not in entry["variant"]:
      raise ValueError(f"mrr: arms key {arms_key!r} is not an override of this sweep "
                       f"(overrides: {list(entry['variant'])})")
    others = tuple((k, _hashable(v)) for k, v in entry["variant"].items() if k != arms_key)
    arm = _hashable(entry["variant"][arms_key])
    for n, key in members:
      setting = settings.setdefault(others + (("@", n),), {})
      if arm in setting:
        raise ValueError(f"mrr: two variants give arm {arm!r} in setting {setting}; rank by a "
                         "key that tells every variant of a setting apart")
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


def plot_ranking(ranking: dict, out_dir: str) -> str:
  """A bar per arm: its mean reciprocal rank (the numbers of the results.md table)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  spec, values = ranking["spec"], ranking["mrr"]
  labels = [sweep_lib.format_value(a) for a in values]
  fig, ax = plt.subplots(figsize=(6, 1.5 + 0.35 * len(labels)))
  ax.barh(range(len(labels)), list(values.values()), color="C0")
  for i, v in enumerate(values.values()):
    ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
  ax.set_yticks(range(len(labels)), labels)
  ax.invert_yaxis()
  ax.set_xlim(0, 1.1)
  ax.set_xlabel(f"mean reciprocal rank over {len(ranking['settings'])} settings "
                "(1 = best in every one)")
  ax.set_ylabel(ranking["arms"].split(".")[-1])
  ax.grid(alpha=0.3, axis="x")
  fig.suptitle(spec.get("title") or f"mean reciprocal rank by {spec['metric']}")
  fig.tight_layout()
  name = spec.get("file") or "mrr_" + re.sub(r"[^A-Za-z0-9]+", "_", spec["metric"]).strip("_") + \
      ".png"
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def default_plots(metrics: Sequence[str]) -> list[dict]:
  plots = [{"metric": prefix, "x": "@"} for prefix in families(metrics)]
  return plots + [{"metric": m} for m in metrics if not _FAMILY.match(m)]


def _auto_log(values: Sequence[float], factor: float) -> bool:
  finite = [v for v in values if sweep_lib.finite(v)]
  return len(finite) > 1 and min(finite) > 0 and max(finite) / min(finite) >= factor


def _series(rows, spec, metric_keys):
  """{line label: {x: stats}} pooling the points equal in spec['lines']; with several families
  (metric_keys {prefix: [(N, key)]}), one line per group and family that has data."""
  x = spec.get("x")
  line_keys = spec["lines"]
  out = {}
  groups = group(rows, line_keys)
  if spec.get("sort"):  # by the line keys' values in their order (numbers as numbers)
    groups.sort(key=lambda g: [(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
                               for v in g[0]])
  for values, members in groups:
    label = ", ".join(f"{k.split('.')[-1]}={sweep_lib.format_value(v)}"
                      for k, v in zip(line_keys, values)) or "all"
    if isinstance(metric_keys, dict):  # several families
      for prefix, keys in metric_keys.items():
        points = {n: stats([r["metrics"].get(key) for r in members]) for n, key in keys}
        if any(s["n"] for s in points.values()):
          suffix = ("" if prefix == spec["metric"][0] else
                    " + " + spec.get("metric_labels", {}).get(prefix, prefix))
          out[label + suffix] = points
      continue
    points: dict[Any, list] = {}
    for r in members:
      if x == "@":
        for n, key in metric_keys:
          points.setdefault(n, []).append(r["metrics"].get(key))
      elif "curve" in spec:
        for step, value in r["curves"].get(spec["curve"], {}).items():
          points.setdefault(step, []).append(value)
      else:
        xv = _hashable(r["overrides"].get(x)) if x else None
        points.setdefault(xv, []).append(r["metrics"].get(spec["metric"]))
    out[label] = {k: stats(v) for k, v in points.items()}
  return out


def plot(spec: dict, rows: Sequence[dict], out_dir: str) -> Optional[str]:
  """Draws one plot spec (see module docstring) from the finished points; returns its path."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  done = [r for r in select(rows, spec) if r["status"] == "done"]
  metric = spec.get("curve") or spec["metric"]
  found = families(sorted({k for r in done for k in r["metrics"]}))
  if isinstance(metric, (list, tuple)):  # several families against N
    metric_keys = {m: found[m] for m in metric if m in found}
    metric = metric[0]
  else:
    metric_keys = found.get(metric, [])
  if not done or (spec.get("x") == "@" and not metric_keys):
    return None
  panel_key = spec.get("panels")
  spec = {**spec, "lines": line_keys(spec, done)}
  panels = group(done, [panel_key]) if panel_key else [((None,), done)]
  panel_series = [_series(members, spec, metric_keys) for _, members in panels]
  bars = spec.get("x") is None and "curve" not in spec
  published = spec.get("published")
  if published and (panel_key or "curve" in spec):
    raise ValueError(f"plot {spec.get('file') or metric!r}: 'published' needs a plot without "
                     "'panels' or 'curve' (the paper's panel sits beside one panel of ours)")
  height = 1.5 + 0.3 * max(len(s) for s in panel_series) if bars else 4.2  # a row per bar label
  columns = len(panels) + (1 if published else 0)
  extra_width = (3 if bars else 4.5) * (columns - len(panels))
  fig, axes = plt.subplots(1, columns, figsize=(6 * len(panels) + extra_width, max(3.0, height)),
                           squeeze=False)
  if published:
    paper_spec = {**spec, "ylabel": spec.get("published_xlabel") or "published value"}
    if bars:
      _published_rows(axes[0][-1], list(panel_series[0]), published, paper_spec)
    else:
      _lines(axes[0][-1], {label: {x: {"mean": y, "std": None} for x, y in by_x.items()}
                           for label, by_x in published.items()}, paper_spec)
    axes[0][-1].set_title(spec.get("published_label") or "published", fontsize=9)
  for ax, ((panel_value,), _), series in zip(axes[0], panels, panel_series):
    if bars:
      _bars(ax, series, spec)
    else:
      _lines(ax, series, spec)
    if panel_key:
      ax.set_title(f"{panel_key.split('.')[-1]}={sweep_lib.format_value(panel_value)}")
  fig.suptitle(spec.get("title") or metric)  # never a path: the workdir stays out of figures
  fig.tight_layout()
  name = spec.get("file") or "plot_" + re.sub(r"[^A-Za-z0-9]+", "_", "_".join(
      str(p) for p in (("curve", metric) if "curve" in spec else (metric, spec.get("x") or "")))
      ).strip("_") + ".png"
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def line_keys(spec: dict, rows: Sequence[dict]) -> tuple:
  """The override keys that tell a plot's lines (bars) apart: spec['lines'], else every variant
  key but x and the panels. A drawn point pools the rows equal in these, x and the panel key."""
  excluded = {spec.get("x"), spec.get("panels")}
  return tuple(spec.get("lines") or [k for k in variant_keys(rows) if k not in excluded])


def select(rows: Sequence[dict], spec: dict) -> list[dict]:
  """The rows (finished or not) whose overrides match every condition of spec['where']; a
  condition that matches no point of the sweep is a mistake in the spec, not an empty plot."""
  for key, allowed in (spec.get("where") or {}).items():
    allowed = [_hashable(v) for v in
               ([allowed] if isinstance(allowed, (str, int, float, bool)) else allowed)]
    kept = [r for r in rows if _hashable(r["overrides"].get(key)) in allowed]
    if rows and not kept:
      values = sorted({repr(r["overrides"].get(key)) for r in rows})
      raise ValueError(f"plot {spec.get('file') or spec.get('metric')!r}: where {key}={allowed} "
                       f"matches no point of the sweep (its values of {key}: "
                       f"{', '.join(values)})")
    rows = kept
  return list(rows)


def _lines(ax, series, spec):
  all_x, all_y = [], []
  for label, points in series.items():
    xs = sorted(x for x, s in points.items() if s["mean"] is not None and x is not None)
    if not xs:
      continue
    ys = [points[x]["mean"] for x in xs]
    errs = [points[x]["std"] or 0.0 for x in xs]
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=label)
    all_x += xs
    all_y += ys
  xlabel = spec.get("xlabel") or {"@": "N (metric@N)"}.get(spec.get("x"), spec.get("x"))
  ax.set_xlabel("step" if "curve" in spec else xlabel)
  metric = spec.get("curve") or spec["metric"]
  ax.set_ylabel(spec.get("ylabel") or (metric if isinstance(metric, str) else metric[0]))
  numeric_x = all(isinstance(x, (int, float)) for x in all_x)
  if numeric_x and spec.get("logx", _auto_log(all_x, 8) and "curve" not in spec):
    ax.set_xscale("log", base=2 if spec.get("x") == "@" else 10)
  if numeric_x and "curve" not in spec and 0 < len(set(all_x)) <= 12:
    ax.set_xticks(sorted(set(all_x)), [f"{x:g}" for x in sorted(set(all_x))])  # the values run
    ax.minorticks_off()
  if spec.get("logy", _auto_log(all_y, 30)):
    ax.set_yscale("log")
  ax.grid(alpha=0.3)
  if spec["lines"] and all_x:
    ax.legend(fontsize=7)


def _bars(ax, series, spec):
  labels = list(series)
  means = [series[l].get(None, {}).get("mean") for l in labels]
  stds = [series[l].get(None, {}).get("std") or 0.0 for l in labels]
  shown = [0.0 if m is None else m for m in means]
  zero = spec.get("zero", True)
  if zero:
    ax.barh(range(len(labels)), shown, xerr=stds, capsize=3,
            color=["C0" if m is not None else "lightgray" for m in means])
  else:
    rows = [i for i, m in enumerate(means) if m is not None]
    ax.errorbar([means[i] for i in rows], rows, xerr=[stds[i] for i in rows], fmt="o",
                capsize=3, color="C0", label="mean ± sample std over seeds")
  found = [m for m in means if m is not None]
  text_x = 0.0 if zero or not found else min(found)
  for i, m in enumerate(means):
    if m is None:
      ax.text(text_x, i, " n/a", va="center", fontsize=8)
  ax.set_yticks(range(len(labels)), labels, fontsize=7)
  ax.set_ylim(len(labels) - 0.5, -0.5)  # the first variant on top
  ax.set_xlabel(spec.get("ylabel") or spec["metric"])
  if spec.get("logy", False):
    ax.set_xscale("log")
  ax.grid(alpha=0.3, axis="x")


def _published_rows(ax, labels, published, spec):
  """The paper's numbers in the rows of the bar chart beside it (rows it lacks are left empty)."""
  rows = [i for i, label in enumerate(labels) if label in published]
  ax.plot([published[labels[i]] for i in rows], rows, "D", color="C3")
  for i in rows:
    ax.annotate(f" {published[labels[i]]:g}", (published[labels[i]], i), va="center", fontsize=7)
  ax.set_yticks(range(len(labels)), [""] * len(labels))
  ax.set_ylim(len(labels) - 0.5, -0.5)
  ax.margins(x=0.2)  # room for the annotations
  ax.set_xlabel(spec["ylabel"])
  ax.grid(alpha=0.3, axis="x")


# ---------------------------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------------------------
def write_report(root: str, points: Sequence[sweep_lib.Point], report: Optional[dict] = None,
                 title: str = "Sweep results") -> dict:
  """Writes results.csv, results_summary.csv, results.md and the plots (and MRR bar charts) into
  ROOT; returns {'rows', 'summary', 'metrics', 'plots', 'rankings'}."""
  report = report or {}
  rows = collect(root, points)
  available = sorted({k for r in rows if r["status"] == "done" for k in r["metrics"]})
  metrics = expand_metrics(report.get("metrics", DEFAULT_METRICS), available)
  summary = summarize(rows, metrics)
  rankings = [r for spec in report.get("mrr", ()) if (r := rank_arms(summary, metrics, spec))]
  write_csv(os.path.join(root, "results.csv"), rows)
  write_summary_csv(os.path.join(root, "results_summary.csv"), summary, metrics)
  with open(os.path.join(root, "results.md"), "w", encoding="utf-8") as f:
    f.write(markdown(title, rows, summary, metrics, rankings))
  plots = [p for spec in report.get("plots", default_plots(metrics))
           if (p := plot(spec, rows, root))]
  plots += [plot_ranking(r, root) for r in rankings]
  return {"rows": rows, "summary": summary, "metrics": metrics, "plots": plots,
          "rankings": rankings}
