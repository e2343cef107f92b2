"""Sweep results: ROOT/results.csv, results_summary.csv, results.md and PNG plots
(tables: tfjax/research/sweep_tables.py; plots: tfjax/research/sweep_plots.py; this module
writes them all and re-exports their names).

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

import os
from typing import Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.research.sweep_plots import default_plots, plot, plot_ranking  # noqa: F401
from tfjax.research.sweep_tables import (  # noqa: F401
    DEFAULT_METRICS, collect, expand_metrics, group, line_keys, markdown, rank_arms, read_point,
    select, summarize, variant_keys, write_csv, write_summary_csv)


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
