"""tfjax/research/sweep_results.py: the per-seed results file round-trips what the tables read,
keeps only finished points, and refuses points that name no commit."""

import os

import pytest

from tfjax.research import sweep_results


def _rows():
  return [
      {"name": "position=rope,seed=0", "overrides": {"model.position": "rope", "seed": 0},
       "status": "done", "metrics": {"eval/loss": 1.75, "long/ppl_sliding@64": 6.1,
                                     "train/tokens_per_sec": 1e4, "diverged": 0.0}},
      {"name": "position=rope,seed=1", "overrides": {"model.position": "rope", "seed": 1},
       "status": "failed", "metrics": {"eval/loss": 9.0}},
  ]


def test_records_round_trip_through_the_file(tmp_path):
  done = {"position=rope,seed=0": {"seconds": 61.5, "commit": "abc1234",
                                   "device": "gpu: NVIDIA H200"}}
  recs = sweep_results.records(_rows(), done, ["eval/loss", "long/ppl_sliding@64"])
  assert len(recs) == 1  # the failed point is no result
  assert recs[0]["metrics"] == {"eval/loss": 1.75, "long/ppl_sliding@64": 6.1, "diverged": 0.0}
  path = str(tmp_path / "r" / "position_smoke.jsonl")
  sweep_results.write(path, recs)
  first = open(path, "rb").read()
  sweep_results.write(path, recs)
  assert open(path, "rb").read() == first
  (row,) = sweep_results.load(path)
  assert row["name"] == "position=rope,seed=0" and row["status"] == "done"
  assert row["overrides"] == {"model.position": "rope", "seed": 0}
  assert row["commit"] == "abc1234" and row["seconds"] == 61.5
  assert row["metrics"]["long/ppl_sliding@64"] == 6.1
  assert row["device"] == "gpu: NVIDIA H200"


def test_results_recorded_before_devices_were_named_load_without_one(tmp_path):
  recs = sweep_results.records(_rows(), {"position=rope,seed=0": {"commit": "abc1234"}},
                               ["eval/loss"])
  assert "device" not in recs[0]  # the bytes of older results files do not change on export
  path = str(tmp_path / "old.jsonl")
  sweep_results.write(path, recs)
  assert sweep_results.load(path)[0]["device"] is None


def test_device_name_names_this_process_backend():
  import jax  # pylint: disable=import-outside-toplevel
  name = sweep_results.device_name()
  if jax.default_backend() == "cpu":
    assert name.startswith("cpu (") and name.endswith(" cores)" if len(jax.devices()) == 1
                                                       else " devices)")
  else:
    assert name.startswith(jax.default_backend() + ": ")


def test_device_name_counts_the_cores_this_process_may_use(monkeypatch):
  """A point pinned to fewer cores (taskset, a cgroup) trains with other float32 rounding
  (XLA:CPU sizes its thread pool from the affinity): its record says so, not the machine's count."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.default_backend() != "cpu" or len(jax.devices()) != 1:
    pytest.skip("names one CPU device")
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
  monkeypatch.setattr(os, "cpu_count", lambda: 64)
  assert sweep_results.device_name() == "cpu (1 cores)"


def test_a_point_without_a_commit_needs_results_commit():
  with pytest.raises(ValueError, match="--results_commit"):
    sweep_results.records(_rows(), {"position=rope,seed=0": {"seconds": 1.0}}, ["eval/loss"])
  recs = sweep_results.records(_rows(), {"position=rope,seed=0": {"seconds": 1.0}},
                               ["eval/loss"], commit="def5678")
  assert recs[0]["commit"] == "def5678"


def test_a_broken_line_names_the_file_and_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text("{not json\n")
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    sweep_results.load(str(path))


def test_tfjax_code_commit_names_the_commit_of_a_copied_tree(monkeypatch):
  monkeypatch.setenv("TFJAX_CODE_COMMIT", "fbc79d3")
  assert sweep_results.code_commit() == "fbc79d3"
  monkeypatch.delenv("TFJAX_CODE_COMMIT")
  assert sweep_results.code_commit() != "fbc79d3"


def test_config_fingerprint_names_what_was_trained_only():
  from tfjax.research import sweep  # pylint: disable=import-outside-toplevel
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
  base = base_config()
  same = {"seed": 7, "data.seed": 3, "train.log_every": 1, "train.checkpoint_every": 5}
  changed = {"optimizer.lr": base.optimizer.lr * 2, "optimizer.warmup_steps": 11,
             "model.num_layers": base.model.num_layers + 1, "train.num_steps": 17}
  fingerprint = sweep_results.config_fingerprint(base)
  assert len(fingerprint) == 12 and int(fingerprint, 16) >= 0
  for key, value in same.items():
    assert sweep_results.config_fingerprint(sweep.apply_overrides(base, {key: value})) == \
        fingerprint, key
  for key, value in changed.items():
    assert sweep_results.config_fingerprint(sweep.apply_overrides(base, {key: value})) != \
        fingerprint, key
  # Setting a key to its default changes nothing trained, nor the fingerprint.
  assert sweep_results.config_fingerprint(sweep.apply_overrides(
      base, {"optimizer.lr": base.optimizer.lr})) == fingerprint


def test_records_carry_the_config_fingerprint_of_the_done_file():
  rows = [{"name": "a", "overrides": {"seed": 0}, "status": "done", "metrics": {}}]
  done = {"a": {"commit": "abc1234", "seconds": 1.0, "device": "cpu (2 cores)",
                "config": "0123456789ab"}}
  assert sweep_results.records(rows, done, [])[0]["config"] == "0123456789ab"


def test_provenance_names_commit_device_and_config(monkeypatch):
  """What run_point writes into every SWEEP_DONE.json, diverged points included."""
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("TFJAX_CODE_COMMIT", "feed123")
  got = sweep_results.provenance(base_config())
  assert got["commit"] == "feed123" and got["device"].startswith("cpu (")
  assert got["config"] == sweep_results.config_fingerprint(base_config())


def test_wall_seconds_is_the_union_of_the_points_running_intervals():
  """Two packed groups side by side (10:00-10:10 and 10:05-10:12, their members sharing the
  group's interval), then a lone point after a gap (10:20-10:21): 12 + 1 = 13 minutes; unknown
  (None) as soon as one row records no end."""
  def row(end, span):
    return {"finished": f"2026-11-28 {end}", "span_seconds": span}
  rows = [row("10:10:00", 600), row("10:10:00", 600), row("10:12:00", 420),
          row("10:21:00", 60)]
  assert sweep_results.wall_seconds(rows) == 13 * 60
  assert sweep_results.wall_seconds(rows + [{"finished": None, "span_seconds": 5}]) is None
