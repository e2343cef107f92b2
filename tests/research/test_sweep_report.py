"""tfjax/research/sweep_report.py: mean reciprocal rank tables and bars from the seed means, and
plots of several metric families drawing exactly the table's numbers. (Aggregation and the
error-bar check of the other plots: tests/research/test_sweep.py.)"""

import os

import numpy as np
import pytest

from test_sweep import _drawn, _errorbar_lines, fabricate  # pylint: disable=unused-import
from tfjax.research import mrr, sweep_report


def _lengthgen_points(root, rng):
  """2 tasks x 3 positions x 2 seeds, exact match at lengths 4 (trained) and 12, 16."""
  points, written = [], {}
  for task in ("copy", "reverse"):
    for position in ("none", "rope", "alibi"):
      for seed in range(2):
        acc = {f"eval/exact_match@{n}": float(rng.uniform()) for n in (4, 12, 16)}
        records = [{"step": 0, "eval/loss": 4.0},
                   {"step": 10, "train/loss": 1.0, "eval/loss": 1.0, **acc}]
        overrides = {"data.name": task, "model.position": position, "seed": seed}
        points.append(fabricate(root, f"name={task},position={position},seed={seed}",
                                overrides, records))
        written[(task, position, seed)] = acc
  return points, written


def test_mrr_table_and_bars_are_the_hand_ranked_seed_means(tmp_path, monkeypatch):
  root = str(tmp_path)
  points, written = _lengthgen_points(root, np.random.default_rng(1))
  saved = _drawn(monkeypatch)
  report = {"metrics": ["eval/exact_match"], "plots": [],
            "mrr": [{"metric": "eval/exact_match", "arms": "model.position", "min_n": 12,
                     "title": "exact match past the training lengths"}]}
  result = sweep_report.write_report(root, points, report)
  # Independently: per (task, N >= 12) rank the seed means with NumPy, average 1 / rank.
  expected = {}
  for task in ("copy", "reverse"):
    for n in (12, 16):
      means = {p: np.mean([written[(task, p, s)][f"eval/exact_match@{n}"] for s in range(2)])
               for p in ("none", "rope", "alibi")}
      order = sorted(means, key=lambda p: -means[p])  # no ties among uniform draws
      for rank, p in enumerate(order, 1):
        expected[p] = expected.get(p, 0.0) + 1.0 / rank / 4
  (ranking,) = result["rankings"]
  assert len(ranking["settings"]) == 4
  assert ranking["mrr"] == pytest.approx(expected)
  assert list(ranking["mrr"]) == sorted(expected, key=lambda p: -expected[p])  # best first
  md = open(os.path.join(root, "results.md")).read()
  assert "Mean reciprocal rank of model.position by eval/exact_match@N (4 settings, N >= 12" in md
  for p, value in expected.items():
    assert f"| {p} | {value:.3f} |" in md
  (fig,) = saved
  ax = fig.axes[0]
  (bars,) = ax.containers
  drawn = {t.get_text(): patch.get_width()
           for t, patch in zip(ax.get_yticklabels(), bars.patches)}
  assert drawn == pytest.approx(expected)  # the bars are the table
  assert "mean reciprocal rank" in ax.get_xlabel() and fig._suptitle.get_text() == \
      "exact match past the training lengths"
  assert root not in fig._suptitle.get_text()
  assert result["plots"] == [os.path.join(root, "mrr_eval_exact_match.png")]


def test_mrr_ranks_perplexity_lower_first_and_na_last(tmp_path):
  root = str(tmp_path)
  points = []
  ppl = {"learned": (8.0, None), "rope": (7.0, 14.0), "alibi": (8.0, 8.0)}
  for position, (at1, at2) in ppl.items():
    records = [{"step": 0, "eval/loss": 4.0}, {"step": 10, "train/loss": 1.0}]
    points.append(fabricate(root, f"position={position}", {"model.position": position}, records,
                            {"long/ppl@64": at1, "long/ppl@128": at2}))
  report = {"metrics": ["long/ppl"], "plots": [],
            "mrr": [{"metric": "long/ppl", "arms": "model.position",
                     "higher_is_better": False}]}
  (ranking,) = sweep_report.write_report(root, points, report)["rankings"]
  # @64: rope 1, learned and alibi tied 2; @128: alibi 1, rope 2, learned (n/a) 3.
  assert ranking["mrr"] == pytest.approx({"alibi": (1 / 2 + 1) / 2, "rope": (1 + 1 / 2) / 2,
                                          "learned": (1 / 2 + 1 / 3) / 2})
  assert mrr.ranks({"a": 8.0, "b": None}, higher_is_better=False) == {"a": 1, "b": 2}


def test_several_families_in_one_plot_draw_each_tables_mean_and_std(tmp_path, monkeypatch):
  """The position ablation's figure: every arm's perplexity against length, plus RoPE evaluated
  with each scaling as extra lines; the family tables leave out arms with no value at any N."""
  root = str(tmp_path)
  rng = np.random.default_rng(2)
  points, written = [], {}
  for position in ("alibi", "rope"):
    for seed in range(3):
      extra = {f"long/ppl@{n}": float(rng.uniform(5, 20)) for n in (64, 128)}
      if position == "rope":
        extra.update({f"long/ppl_linear@{n}": float(rng.uniform(5, 20)) for n in (64, 128)})
      records = [{"step": 0, "eval/loss": 4.0}, {"step": 10, "train/loss": 1.0}]
      points.append(fabricate(root, f"position={position},seed={seed}",
                              {"model.position": position, "seed": seed}, records, extra))
      written[(position, seed)] = extra
  saved = _drawn(monkeypatch)
  report = {"metrics": ["long/ppl", "long/ppl_linear"],
            "plots": [{"metric": ["long/ppl", "long/ppl_linear"], "x": "@",
                       "lines": ("model.position",), "metric_labels": {"long/ppl_linear": "PI"},
                       "ylabel": "perplexity", "logy": True}]}
  sweep_report.write_report(root, points, report)
  drawn = _errorbar_lines(saved[0].axes[0])
  assert set(drawn) == {"position=alibi", "position=rope", "position=rope + PI"}
  for label, (position, family) in {"position=alibi": ("alibi", "long/ppl"),
                                    "position=rope": ("rope", "long/ppl"),
                                    "position=rope + PI": ("rope", "long/ppl_linear")}.items():
    for n in (64, 128):
      values = [written[(position, s)][f"{family}@{n}"] for s in range(3)]
      assert drawn[label][n] == pytest.approx((np.mean(values), np.std(values, ddof=1)))
  assert saved[0].axes[0].get_ylabel() == "perplexity"
  assert saved[0].axes[0].get_yscale() == "log"
  md = open(os.path.join(root, "results.md")).read()
  linear_table = md.split("## long/ppl_linear@N")[1]
  assert "| rope |" in linear_table and "| alibi |" not in linear_table
