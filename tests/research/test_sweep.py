"""Sweeps and the research scripts: point naming, validation, skip / resume / failure handling,
aggregation checked against hand-computed numbers, plots checked against the tables, a sweep
through the CLI in child processes, the sqrt(d_k) demo and attention maps of a tiny trained run.
(Length evaluation: tests/research/test_length_eval.py; gradient norms: tests/research/test_grad_norms.py.)"""

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.research import sweep, sweep_report
from tfjax.training.loop import train
from tfjax.training.config.defaults import base_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A sweep config module: a 1-layer decoder on the synthetic copy task, a few steps.
TINY_SWEEP = '''
from tfjax.research import sweep
from tfjax.training.config.defaults import base_config

def get_config(scale=None):
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 4), test_lengths=(4, 8),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, position="rope", max_len=32)
  config.optimizer.update(lr=3e-3, warmup_steps=1)
  config.train.update(num_steps={steps}, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every={steps}, log_every=2, checkpoint_every={steps},
                      eval_at_start=True)
  return config

def get_sweep(scale=None):
  return {points}
'''


def load_script(name):
  """experiments/NAME.py as a module (the scripts are not a package)."""
  return sweep.load_module(os.path.join(REPO, "experiments", f"{name}.py"))


def write_sweep_module(tmp_path, points, steps=4, name="tiny_sweep.py"):
  path = tmp_path / name
  path.write_text(TINY_SWEEP.format(steps=steps, points=points))
  return str(path)


def png_ok(path):
  with open(path, "rb") as f:
    return os.path.getsize(path) > 2000 and f.read(8) == PNG_MAGIC


# ---------------------------------------------------------------------------------------------
# Defining points
# ---------------------------------------------------------------------------------------------
def test_product_order_and_readable_names():
  points = sweep.product({"model.position": ["rope", "alibi"], "optimizer.lr": [3e-4],
                          "seed": [0, 1]})
  assert points == [
      {"model.position": "rope", "optimizer.lr": 3e-4, "seed": 0},
      {"model.position": "rope", "optimizer.lr": 3e-4, "seed": 1},
      {"model.position": "alibi", "optimizer.lr": 3e-4, "seed": 0},
      {"model.position": "alibi", "optimizer.lr": 3e-4, "seed": 1}]
  assert sweep.point_names(points) == [
      "position=rope,lr=0.0003,seed=0", "position=rope,lr=0.0003,seed=1",
      "position=alibi,lr=0.0003,seed=0", "position=alibi,lr=0.0003,seed=1"]
  # Deterministic: the same overrides always give the same names.
  assert sweep.point_names(points) == sweep.point_names([dict(p) for p in points])


def test_names_keep_full_keys_when_short_ones_clash_and_stay_filesystem_safe():
  names = sweep.point_names([{"seed": 1, "data.seed": 2, "data.train_lengths": (1, 8)},
                             {"seed": 1, "data.seed": 3, "data.path": "a b/c:d"}])
  assert names == ["seed=1,data.seed=2,train_lengths=1-8", "seed=1,data.seed=3,path=a_b_c_d"]
  long_points = [{"data.path": "x" * 300 + str(i)} for i in range(2)]
  long_names = sweep.point_names(long_points)
  assert len(set(long_names)) == 2 and all(len(n) <= 200 for n in long_names)
  assert sweep.point_names([{}]) == ["base"]


def test_children_start_every_variant_before_repeating_a_seed():
  points = [sweep.Point(n, o) for n, o in zip(["a0", "a1", "b0", "b1"], sweep.product(
      {"model.ffn": ["relu", "gelu"], "seed": [0, 1]}))]
  assert [p.name for p in sweep.seeds_last(points)] == ["a0", "b0", "a1", "b1"]


def test_only_selects_whole_names_that_contain_commas():
  overrides = [{"seed": 0}, {"seed": 0, "optimizer.lr": 1e-3}, {"seed": 1, "optimizer.lr": 1e-3}]
  points = [sweep.Point(n, o) for n, o in zip(sweep.point_names(overrides), overrides)]
  s = sweep.Sweep("tiny.py", None, None, points)
  assert [p.name for p in points] == ["seed=0", "seed=0,lr=0.001", "seed=1,lr=0.001"]
  assert s.select("seed=0,lr=0.001,seed=0") == ["seed=0,lr=0.001", "seed=0"]
  assert s.select("seed=1,lr=0.001") == ["seed=1,lr=0.001"] and s.select("") == []
  with pytest.raises(ValueError, match="no point named 'seed=2'"):
    s.select("seed=0,seed=2,lr=0.001")


def test_duplicate_points_are_an_error():
  with pytest.raises(ValueError, match="both get the directory name"):
    sweep.point_names([{"seed": 0}, {"seed": 0}])


def test_unknown_or_mistyped_override_fails_before_anything_runs(tmp_path):
  path = write_sweep_module(tmp_path, "[{'model.position': 'alibi'}, {'model.positon': 'rope'}, "
                                      "{'train.num_steps': 1.5}, {'model.norm': 'batchnorm'}]")
  with pytest.raises(ValueError) as info:
    sweep.load_sweep(path)
  message = str(info.value)
  assert "3 of 4 sweep points are invalid, nothing was run" in message
  assert "unknown override key 'model.positon'; did you mean 'model.position'" in message
  assert "train.num_steps=1.5" in message
  assert "model.norm='batchnorm' is invalid" in message
  # Through the CLI: exit status 2, and the sweep directory is never created.
  root = tmp_path / "never"
  result = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "sweep.py"),
                           f"--config={path}", f"--workdir={root}"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
  assert result.returncode == 2 and "model.positon" in result.stderr
  assert not root.exists()


# ---------------------------------------------------------------------------------------------
# Running: skip, failure, interruption, resume
# ---------------------------------------------------------------------------------------------
class FakeTrainer:
  """Stands in for train_and_evaluate: writes a metrics.jsonl up to `reach` steps (default: the
  config's num_steps), or raises for the named points."""

  def __init__(self, fail=(), reach=None):
    self.calls, self.fail, self.reach = [], set(fail), reach

  def __call__(self, config, workdir):
    name = os.path.basename(workdir)
    self.calls.append(name)
    if name in self.fail:
      raise RuntimeError(f"boom in {name}")
    steps = self.reach or config.train.num_steps
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      f.write(json.dumps({"step": 0, "eval/loss": 3.0}) + "\n")
      f.write(json.dumps({"step": steps, "train/loss": 1.0, "eval/loss": 1.5}) + "\n")
    return {"eval/loss": 1.5}


def test_finished_points_are_skipped_and_a_failure_does_not_stop_the_others(tmp_path):
  s = sweep.load_sweep(write_sweep_module(tmp_path, "[{'seed': s} for s in range(3)]"))
  root = str(tmp_path / "sweep")
  trainer = FakeTrainer(fail={"seed=1"})
  statuses = sweep.run_sweep(s, root, train_fn=trainer)
  assert statuses == {"seed=0": "done", "seed=1": "failed", "seed=2": "done"}
  assert trainer.calls == ["seed=0", "seed=1", "seed=2"]
  failure = sweep.read_json(os.path.join(root, "seed=1", sweep.FAILED_FILE))
  assert failure["error"] == "RuntimeError: boom in seed=1" and "Traceback" in failure["traceback"]
  assert sweep.is_done(os.path.join(root, "seed=0"))
  assert not sweep.is_done(os.path.join(root, "seed=1"))

  retry = FakeTrainer()  # the second run retries only the failed point
  assert sweep.run_sweep(s, root, train_fn=retry) == {
      "seed=0": "skipped", "seed=1": "done", "seed=2": "skipped"}
  assert retry.calls == ["seed=1"]
  assert not os.path.exists(os.path.join(root, "seed=1", sweep.FAILED_FILE))


def test_interrupted_point_is_not_marked_done_and_stops_the_sweep(tmp_path):
  s = sweep.load_sweep(write_sweep_module(tmp_path, "[{'seed': 0}, {'seed': 1}]", steps=10))
  root = str(tmp_path / "sweep")
  trainer = FakeTrainer(reach=6)  # like train_and_evaluate returning after a SIGTERM at step 6
  assert sweep.run_sweep(s, root, train_fn=trainer) == {"seed=0": "interrupted"}
  assert trainer.calls == ["seed=0"] and not sweep.is_done(os.path.join(root, "seed=0"))


def test_unfinished_point_is_rerun_in_its_own_workdir(tmp_path):
  """An interrupted point is started again in the same directory, where train_and_evaluate finds
  its checkpoints and resumes (tests/training/test_train.py checks that resuming is exact)."""
  s = sweep.load_sweep(write_sweep_module(tmp_path, "[{'seed': 0}]", steps=10))
  root = str(tmp_path / "sweep")
  assert sweep.run_sweep(s, root, train_fn=FakeTrainer(reach=6)) == {"seed=0": "interrupted"}
  seen = []

  def resume(config, workdir):
    seen.append(sweep.last_step(workdir))  # what the real trainer would resume from
    return FakeTrainer()(config, workdir)

  assert sweep.run_sweep(s, root, train_fn=resume) == {"seed=0": "done"}
  assert seen == [6]
  done = sweep.read_json(os.path.join(root, "seed=0", sweep.DONE_FILE))
  assert done["overrides"] == {"seed": 0} and done["final"] == {"eval/loss": 1.5}


# ---------------------------------------------------------------------------------------------
# Aggregation on fabricated results
# ---------------------------------------------------------------------------------------------
def fabricate(root, name, overrides, records, point_metrics=None, done=True):
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  if point_metrics is not None:
    sweep.write_json(os.path.join(workdir, sweep.POINT_METRICS_FILE), point_metrics)
  if done:
    sweep.write_json(os.path.join(workdir, sweep.DONE_FILE), {"overrides": overrides})
  return sweep.Point(name, overrides)


def test_aggregation_matches_hand_computed_statistics(tmp_path):
  root = str(tmp_path)
  a_losses, b_losses = [2.0, 2.5, 3.0], [1.0, 1.2, float("nan")]
  points = []
  for ffn, losses in (("relu", a_losses), ("swiglu", b_losses)):
    for seed, loss in enumerate(losses):
      records = [{"step": 0, "eval/loss": 4.0},
                 {"step": 10, "train/loss": 9.9, "train/tokens_per_sec": 50.0},  # compile
                 {"step": 20, "train/loss": loss, "train/tokens_per_sec": 100.0 + seed},
                 {"step": 20, "eval/loss": loss, "eval/exact_match@8": 0.5 + 0.1 * seed,
                  "eval/exact_match@16": 0.1 * seed}]
      extra = {"long/ppl@64": 10.0 + seed, "long/ppl@128": None}  # None: n/a (learned table)
      points.append(fabricate(root, f"ffn={ffn},seed={seed}", {"model.ffn": ffn, "seed": seed},
                              records, extra))
  points.append(fabricate(root, "ffn=gelu,seed=0", {"model.ffn": "gelu", "seed": 0},
                          [{"step": 0, "eval/loss": 4.0}, {"step": 5, "train/loss": 3.0}],
                          done=False))

  report = {"metrics": ["eval/loss", "eval/exact_match", "long/ppl", "diverged",
                        "train/tokens_per_sec"],
            "plots": [{"metric": "eval/loss"}, {"metric": "eval/exact_match", "x": "@"},
                      {"curve": "eval/loss"}]}
  result = sweep_report.write_report(root, points, report, title="fabricated")
  assert result["metrics"] == ["eval/loss", "eval/exact_match@8", "eval/exact_match@16",
                               "long/ppl@64", "long/ppl@128", "diverged", "train/tokens_per_sec"]
  relu, swiglu = result["summary"]  # gelu never finished: not aggregated
  assert relu["variant"] == {"model.ffn": "relu"} and relu["seeds"] == 3
  loss = relu["stats"]["eval/loss"]
  assert loss["mean"] == pytest.approx(2.5) and loss["std"] == pytest.approx(0.5)
  exact8 = relu["stats"]["eval/exact_match@8"]  # 0.5, 0.6, 0.7
  assert exact8["mean"] == pytest.approx(0.6) and exact8["std"] == pytest.approx(0.1)
  # Median of the log events after the first (which includes compilation): 100, 101, 102.
  assert relu["stats"]["train/tokens_per_sec"]["mean"] == pytest.approx(101.0)
  assert relu["stats"]["long/ppl@128"] == {"mean": None, "std": None, "n": 0, "total": 3}
  # The NaN seed is left out of the mean and counted as diverged.
  nan_loss = swiglu["stats"]["eval/loss"]
  assert nan_loss["mean"] == pytest.approx(1.1) and nan_loss["n"] == 2
  assert nan_loss["std"] == pytest.approx(math.sqrt(0.02))
  assert swiglu["stats"]["diverged"]["mean"] == pytest.approx(1 / 3)
  assert relu["stats"]["diverged"]["mean"] == 0.0

  md = open(os.path.join(root, "results.md")).read()
  assert "7 points: 6 finished, 0 failed, 1 not finished" in md
  assert "| relu | 3 | 2.5 ± 0.5 |" in md
  assert "| swiglu | 3 | 1.1 ± 0.14 [2 of 3] |" in md
  assert "## long/ppl@N" in md and "| relu | 11 ± 1 | n/a |" in md
  with open(os.path.join(root, "results.csv"), newline="") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 7 and list(rows[0])[:4] == ["name", "status", "model.ffn", "seed"]
  assert [r["status"] for r in rows] == ["done"] * 6 + ["incomplete"]
  assert [float(r["eval/loss"]) for r in rows[:3]] == a_losses
  assert math.isnan(float(rows[5]["eval/loss"])) and rows[0]["long/ppl@128"] == ""
  assert len(result["plots"]) == 3 and all(png_ok(p) for p in result["plots"])


def _drawn(monkeypatch):
  """Captures every figure the report saves (the figure object itself, after drawing)."""
  from matplotlib import figure  # pylint: disable=import-outside-toplevel
  saved, savefig = [], figure.Figure.savefig

  def capture(fig, *args, **kwargs):
    saved.append(fig)
    return savefig(fig, *args, **kwargs)

  monkeypatch.setattr(figure.Figure, "savefig", capture)
  return saved


def _errorbar_lines(ax):
  """{label: {x: (y, half error bar)}} read back from the error-bar artists of one axes."""
  from matplotlib.container import ErrorbarContainer  # pylint: disable=import-outside-toplevel
  out = {}
  for container in ax.containers:
    if not isinstance(container, ErrorbarContainer) or container.lines[0] is None:
      continue  # a bar chart's own error bars have no data line
    line, _, (bars,) = container.lines
    half = {float(seg[0][0]): (seg[1][1] - seg[0][1]) / 2 for seg in bars.get_segments()}
    out[container.get_label()] = {float(x): (float(y), half[float(x)])
                                  for x, y in zip(line.get_xdata(), line.get_ydata())}
  return out


def test_plots_draw_the_tables_mean_and_sample_std(tmp_path, monkeypatch):
  """Error bars are the sample std over seeds, as in results.md: every seed's value is counted
  once (not once per finished point), in family (@N), bar and override-axis plots alike."""
  root = str(tmp_path)
  rng = np.random.default_rng(0)
  points, written = [], []
  for ffn in ("relu", "gelu"):
    for lr in (1e-3, 1e-2):
      for seed in range(3):
        loss = float(rng.uniform(1, 3))
        records = [{"step": 0, "eval/loss": 4.0},
                   {"step": 20, "train/loss": loss, "eval/loss": loss}]
        extra = {"long/ppl@64": float(rng.uniform(5, 10)), "long/ppl@128": float(rng.uniform(5,
                                                                                             20))}
        overrides = {"model.ffn": ffn, "optimizer.lr": lr, "seed": seed}
        name = f"ffn={ffn},lr={lr:g},seed={seed}"
        points.append(fabricate(root, name, overrides, records, extra))
        written.append((overrides, {"eval/loss": loss, **extra}))
  saved = _drawn(monkeypatch)
  report = {"metrics": ["eval/loss", "long/ppl"],
            "plots": [{"metric": "long/ppl", "x": "@"}, {"metric": "eval/loss"},
                      {"metric": "eval/loss", "x": "optimizer.lr", "lines": ("model.ffn",)}]}
  result = sweep_report.write_report(root, points, report)
  assert len(saved) == 3

  def table(ffn, lr, metric):  # the numbers results.md prints, recomputed here with NumPy
    values = [m[metric] for o, m in written if (o["model.ffn"], o["optimizer.lr"]) == (ffn, lr)]
    assert len(values) == 3
    return np.mean(values), np.std(values, ddof=1)

  for entry in result["summary"]:  # the tables' own statistics agree with NumPy's
    ffn, lr = entry["variant"]["model.ffn"], entry["variant"]["optimizer.lr"]
    for metric in ("eval/loss", "long/ppl@64", "long/ppl@128"):
      mean, std = table(ffn, lr, metric)
      assert entry["stats"][metric]["mean"] == pytest.approx(mean)
      assert entry["stats"][metric]["std"] == pytest.approx(std)

  family, bars, by_lr = (fig.axes[0] for fig in saved)
  drawn = _errorbar_lines(family)  # one line per variant, x = N
  assert len(drawn) == 4
  for ffn in ("relu", "gelu"):
    for lr in (1e-3, 1e-2):
      line = drawn[f"ffn={ffn}, lr={lr:g}"]
      for n in (64, 128):
        mean, std = table(ffn, lr, f"long/ppl@{n}")
        assert line[n] == pytest.approx((mean, std))

  (bar_container,) = [c for c in bars.containers if hasattr(c, "patches")]
  labels = [t.get_text() for t in bars.get_yticklabels()]
  widths = [patch.get_width() for patch in bar_container.patches]
  halves = [(seg[1][0] - seg[0][0]) / 2
            for seg in bar_container.errorbar.lines[2][0].get_segments()]
  assert len(labels) == 4
  for label, width, half in zip(labels, widths, halves):
    ffn, lr = (part.split("=")[1] for part in label.split(", "))
    assert (width, half) == pytest.approx(table(ffn, float(lr), "eval/loss"))

  drawn = _errorbar_lines(by_lr)  # one line per ffn, x = the learning rate
  for ffn in ("relu", "gelu"):
    for lr in (1e-3, 1e-2):
      assert drawn[f"ffn={ffn}"][lr] == pytest.approx(table(ffn, lr, "eval/loss"))


def test_dot_chart_and_published_panel_draw_the_table_and_the_papers_numbers(tmp_path,
                                                                                monkeypatch):
  """zero=False draws each variant's mean ± sample std as a dot in its row; `published` puts the
  paper's number in the same row of a second panel (a variant the paper lacks stays empty)."""
  root = str(tmp_path)
  rng = np.random.default_rng(1)
  points, losses = [], {}
  for ffn in ("relu", "swiglu", "mine"):
    for seed in range(3):
      loss = float(rng.uniform(1.7, 1.9))
      losses.setdefault(ffn, []).append(loss)
      points.append(fabricate(root, f"ffn={ffn},seed={seed}", {"model.ffn": ffn, "seed": seed},
                              [{"step": 10, "train/loss": loss, "eval/loss": loss}], {}))
  saved = _drawn(monkeypatch)
  published = {"ffn=relu": 1.997, "ffn=swiglu": 1.944}
  sweep_report.write_report(root, points, {"metrics": ["eval/loss"], "plots": [
      {"metric": "eval/loss", "zero": False, "published": published,
       "published_label": "Shazeer 2020"}]})
  (fig,) = saved
  ours, paper = fig.axes
  labels = [t.get_text() for t in ours.get_yticklabels()]
  assert labels == ["ffn=relu", "ffn=swiglu", "ffn=mine"]
  (container,) = ours.containers  # one error-bar container: x = the means, y = the rows
  line, _, (bars,) = container.lines
  assert sorted(line.get_ydata()) == [0, 1, 2]
  for x, row, seg in zip(line.get_xdata(), line.get_ydata(), bars.get_segments()):
    values = losses[labels[int(row)].split("=")[1]]
    assert x == pytest.approx(np.mean(values))
    assert (seg[1][0] - seg[0][0]) / 2 == pytest.approx(np.std(values, ddof=1))
  assert ours.get_xlim()[0] > 1.0  # the axis spans the data, not 0
  (marks,) = paper.get_lines()
  drawn = dict(zip(marks.get_ydata(), marks.get_xdata()))
  assert drawn == {0: 1.997, 1: 1.944}  # rows of relu and swiglu; 'mine' (row 2) left empty
  assert paper.get_ylim() == ours.get_ylim() and paper.get_title() == "Shazeer 2020"


def test_published_curve_sits_beside_a_plot_against_an_override_key(tmp_path, monkeypatch):
  root = str(tmp_path)
  points = [fabricate(root, f"heads={h},seed={seed}", {"model.num_heads": h, "seed": seed},
                      [{"step": 10, "train/loss": 2.0 + h / 100 + seed / 1000,
                        "eval/loss": 2.0 + h / 100 + seed / 1000}], {})
            for h in (1, 4, 16) for seed in range(2)]
  saved = _drawn(monkeypatch)
  sweep_report.write_report(root, points, {"metrics": ["eval/loss"], "plots": [
      {"metric": "eval/loss", "x": "model.num_heads", "lines": (),
       "published": {"paper": {1: 5.29, 4: 5.00, 32: 5.01}}, "published_label": "Vaswani"}]})
  (fig,) = saved
  ours, paper = fig.axes
  (drawn,) = _errorbar_lines(ours).values()
  assert {x: m for x, (m, _) in drawn.items()} == pytest.approx({1: 2.0105, 4: 2.0405,
                                                                 16: 2.1605})
  assert {x: m for x, (m, _) in _errorbar_lines(paper)["paper"].items()} == {1: 5.29, 4: 5.0,
                                                                              32: 5.01}
  assert paper.get_title() == "Vaswani"
  with pytest.raises(ValueError, match="'published' needs a plot without 'panels'"):
    sweep_report.plot({"metric": "eval/loss", "x": "model.num_heads", "panels": "seed",
                       "published": {"paper": {1: 5.29}}},
                      sweep_report.collect(root, points), root)


def test_where_draws_only_the_matching_points_and_rejects_a_condition_matching_none(
    tmp_path, monkeypatch):
  """A plot restricted with `where` pools only the matching points: the per-layer line of
  placement=post is the mean ± sample std of its warmup=60 seeds alone (the warmup=0 points, with
  other values, would otherwise be pooled into it)."""
  root = str(tmp_path)
  rng = np.random.default_rng(2)
  points, kept = [], {}
  for placement in ("pre", "post"):
    for warmup in (0, 60):
      for seed in range(3):
        grads = {f"init/grad@{i}": float(rng.uniform(0.1, 1.0)) for i in (1, 2)}
        overrides = {"model.norm_placement": placement, "optimizer.warmup_steps": warmup,
                     "seed": seed}
        points.append(fabricate(root, f"p={placement},w={warmup},seed={seed}", overrides,
                                [{"step": 10, "train/loss": 1.0, "eval/loss": 1.0}], grads))
        if warmup == 60:
          kept.setdefault(placement, []).append(grads)
  saved = _drawn(monkeypatch)
  spec = {"metric": "init/grad", "x": "@", "lines": ("model.norm_placement",),
          "where": {"optimizer.warmup_steps": 60}}
  sweep_report.write_report(root, points, {"metrics": ["init/grad"], "plots": [spec]})
  (fig,) = saved
  drawn = _errorbar_lines(fig.axes[0])
  assert set(drawn) == {"norm_placement=pre", "norm_placement=post"}
  for placement, seeds in kept.items():
    for i in (1, 2):
      values = [g[f"init/grad@{i}"] for g in seeds]
      assert drawn[f"norm_placement={placement}"][i] == pytest.approx(
          (np.mean(values), np.std(values, ddof=1)))
  rows = sweep_report.collect(root, points)
  with pytest.raises(ValueError, match=r"where optimizer.warmup_steps=\[40\] matches no point"):
    sweep_report.plot({**spec, "where": {"optimizer.warmup_steps": [40]}}, rows, root)
  with pytest.raises(ValueError, match="matches no point"):
    sweep_report.plot({**spec, "where": {"model.norm": "rmsnorm"}}, rows, root)


def test_sort_puts_bars_in_the_order_of_their_values(tmp_path, monkeypatch):
  """sort=True orders the rows by the line keys' values, numbers numerically (6 before 12), so
  that a LayerNorm / RMSNorm pair sits together; each row still draws its own variant's mean."""
  root = str(tmp_path)
  points, losses = [], {}
  for layers in (12, 6):
    for norm in ("rmsnorm", "layernorm"):
      for seed in range(2):
        loss = layers / 10 + (norm == "rmsnorm") / 100 + seed / 1000
        losses.setdefault((layers, norm), []).append(loss)
        points.append(fabricate(root, f"L={layers},n={norm},seed={seed}",
                                {"model.num_layers": layers, "model.norm": norm, "seed": seed},
                                [{"step": 10, "train/loss": loss, "eval/loss": loss}], {}))
  saved = _drawn(monkeypatch)
  sweep_report.write_report(root, points, {"metrics": ["eval/loss"], "plots": [
      {"metric": "eval/loss", "lines": ("model.num_layers", "model.norm"), "sort": True}]})
  (fig,) = saved
  ax = fig.axes[0]
  labels = [t.get_text() for t in ax.get_yticklabels()]
  assert labels == ["num_layers=6, norm=layernorm", "num_layers=6, norm=rmsnorm",
                    "num_layers=12, norm=layernorm", "num_layers=12, norm=rmsnorm"]
  (bar_container,) = [c for c in ax.containers if hasattr(c, "patches")]
  for label, patch in zip(labels, bar_container.patches):
    layers, norm = (part.split("=")[1] for part in label.split(", "))
    assert patch.get_width() == pytest.approx(np.mean(losses[(int(layers), norm)]))


# ---------------------------------------------------------------------------------------------
# End to end through the CLI
# ---------------------------------------------------------------------------------------------
def test_sweep_end_to_end_in_child_processes_survives_a_failing_point(tmp_path):
  # A third point fails at run time (the data rejects 1 symbol): recorded, the others finish.
  path = write_sweep_module(tmp_path, "[{'seed': 0}, {'seed': 1}, {'data.num_symbols': 1}]")
  root = tmp_path / "sweep"
  cmd = [sys.executable, os.path.join(REPO, "experiments", "sweep.py"), f"--config={path}",
         f"--workdir={root}", "--parallel=2"]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert result.returncode == 1, result.stdout + result.stderr
  assert "failed points (1): num_symbols=1" in result.stderr
  failure = sweep.read_json(str(root / "num_symbols=1" / sweep.FAILED_FILE))
  assert "num_symbols must be >= 2" in failure["error"]
  for name in ("seed=0", "seed=1"):
    assert sweep.is_done(str(root / name)), (root / name / sweep.LOG_FILE).read_text()
  md = (root / "results.md").read_text()
  assert "3 points: 2 finished, 1 failed" in md and "## Failed points" in md
  assert "| none | 2 |" in md  # one variant (no num_symbols override), two seeds
  rows = (root / "results.csv").read_text().splitlines()
  assert [r.split(",")[1] for r in rows[1:]] == ["done", "done", "failed"]
  plots = sorted(p for p in os.listdir(root) if p.endswith(".png"))
  assert plots and all(png_ok(str(root / p)) for p in plots)
  assert "plot_eval_exact_match.png" in plots  # the exact_match@4/@8 family against length
  # Again: the finished points are skipped, the failed one is retried (and fails again).
  again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert again.returncode == 1 and "'skipped': 2" in again.stdout, again.stdout + again.stderr


# ---------------------------------------------------------------------------------------------
# Research scripts
# ---------------------------------------------------------------------------------------------
def test_sqrt_dk_demo_variance_grows_with_dk_unless_scaled(tmp_path):
  demo = load_script("sqrt_dk_demo")
  rows = demo.score_statistics(dims=(4, 64, 256), samples=20000)
  for row in rows:
    assert row["var_unscaled"] == pytest.approx(row["d_k"], rel=0.1)
    assert row["var_scaled"] == pytest.approx(1.0, rel=0.1)
    assert row["max_weight_scaled"] < row["max_weight_unscaled"]
  assert rows[-1]["max_weight_unscaled"] > 0.8  # nearly one-hot without the scaling
  assert png_ok(demo.plot(rows, str(tmp_path / "sqrt_dk.png"), keys=64))
  assert "| 64 |" in demo.markdown(rows, 64)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  """A tiny char LM trained for a few steps on a small text file (learned positions, table of
  2 x seq_len)."""
  root = tmp_path_factory.mktemp("text_run")
  rng = np.random.default_rng(0)
  words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis"]
  text = "\n".join(" ".join(rng.choice(words, 8)) for _ in range(200))
  (root / "corpus.txt").write_text(text)
  config = base_config()
  config.data.update(name="text", path=str(root / "corpus.txt"), tokenizer="char", seq_len=16)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=2, num_heads=2,
                      d_ff=32, position="learned", max_len=32)
  config.optimizer.update(lr=3e-3, warmup_steps=1)
  config.train.update(num_steps=6, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=6, log_every=3, checkpoint_every=6)
  workdir = str(root / "run")
  train.train_and_evaluate(config, workdir)
  return workdir, sweep.restore_run(workdir)  # (config, experiment, params) from the checkpoint


def test_visualize_attention_writes_a_grid_of_causal_maps(text_run, tmp_path):
  viz = load_script("visualize_attention")
  workdir, run = text_run
  tokens, maps = viz.attention_maps(workdir, "to be or not to be", run=run)
  assert "".join(tokens) == "to be or not to " and maps.shape == (2, 2, 16, 16)  # cut to seq_len
  np.testing.assert_allclose(maps.sum(-1), 1.0, rtol=1e-5)  # each query's weights sum to one
  assert np.all(np.triu(maps, k=1) == 0)  # causal: no query attends to a later key
  assert png_ok(viz.plot_grid(tokens, maps, str(tmp_path / "attention.png")))
  assert viz.run_title("runs/ablations/position_medium/position=alibi,seed=0/", 27) == (
      "position=alibi,seed=0: 27 tokens")  # the point's name, no workdir path


def test_points_trained_in_process_get_the_cpu_devices_their_config_asks_for(tmp_path):
  # parallel=1 trains in the sweep's own process: mesh.cpu_devices must be applied before JAX
  # starts there too, or every point warns and trains on one device.
  path = write_sweep_module(tmp_path, "[{'seed': 0}]")
  script = f"""
import jax
from tfjax.research import sweep
s = sweep.load_sweep({path!r}, None)
s.base_config.mesh.cpu_devices = 2
seen = []
sweep.run_sweep(s, {str(tmp_path / 'root')!r},
                train_fn=lambda config, workdir: seen.append(jax.local_device_count()) or {{}})
print("devices", seen)
"""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "devices [2]" in result.stdout, result.stdout + result.stderr[-2000:]
