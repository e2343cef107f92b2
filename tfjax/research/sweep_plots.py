"""Sweep results as PNG plots: one per REPORT plot spec, and a bar chart per MRR ranking. The
spec keys: tfjax/research/sweep_report.py."""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.research.sweep_tables import (FAMILY, hashable, families, group, line_keys, select,
                                         stats)


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
def default_plots(metrics: Sequence[str]) -> list[dict]:
  plots = [{"metric": prefix, "x": "@"} for prefix in families(metrics)]
  return plots + [{"metric": m} for m in metrics if not FAMILY.match(m)]


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
        xv = hashable(r["overrides"].get(x)) if x else None
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


