"""Each point's state from the files it wrote (tfjax/research/sweep_status.py), fabricated here
file by file, and the --status table."""

import json
import os
import socket
import subprocess

import pytest

from tfjax.research import sweep, sweep_status


def write(root, name, filename, obj, mtime=None):
  path = os.path.join(root, name, filename)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    if filename.endswith(".jsonl"):
      f.write("".join(json.dumps(r) + "\n" for r in obj))
    else:
      json.dump(obj, f)
  if mtime is not None:
    os.utime(path, (mtime, mtime))


@pytest.fixture
def root(tmp_path):
  """A sweep directory with one point in every state."""
  root = str(tmp_path)
  names = ["done", "diverged", "running", "elsewhere", "died", "failed", "queued", "resubmitted", "stopped",
           "stale", "interrupted", "pending"]
  write(root, "", sweep.SWEEP_FILE, {"config": "x.py", "scale": None,
                                     "points": {n: {"seed": i} for i, n in enumerate(names)}})
  here = socket.gethostname()
  dead = subprocess.Popen(["true"])
  dead.wait()  # a pid that existed and is gone
  write(root, "done", sweep.DONE_FILE, {})
  write(root, "done", "metrics.jsonl", [{"step": 0}, {"step": 8}])
  write(root, "diverged", sweep.DONE_FILE, {"diverged_at_step": 5})
  write(root, "running", sweep.RUNNING_FILE, {"host": here, "pid": os.getpid(), "job": "7_1"})
  write(root, "running", "metrics.jsonl", [{"step": 0}, {"step": 3, "train/loss": 1.0}])
  write(root, "running", "config.json", {"train": {"num_steps": 8}})
  write(root, "elsewhere", sweep.RUNNING_FILE, {"host": "node-that-is-not-this-one", "pid": 1})
  write(root, "died", sweep.RUNNING_FILE, {"host": here, "pid": dead.pid})
  write(root, "failed", sweep.FAILED_FILE, {"error": "ValueError: bad\nsecond line",
                                            "log": "/logs/9_0_log.err"})
  write(root, "queued", sweep.JOB_FILE, {"job_id": "7_5", "stderr": "/logs/7_5_0_log.err"})
  write(root, "resubmitted", sweep.FAILED_FILE, {"error": "old failure"}, mtime=1000)
  write(root, "resubmitted", sweep.JOB_FILE, {"job_id": "8_0"}, mtime=2000)
  write(root, "stopped", sweep.JOB_FILE, {"job_id": "7_7", "stopped": "CalledProcessError: x"})
  write(root, "stale", sweep.RUNNING_FILE, {"host": "gone-node", "pid": 5, "job": "7_8"},
        mtime=1000)
  write(root, "stale", sweep.JOB_FILE, {"job_id": "9_0"}, mtime=2000)
  write(root, "interrupted", "metrics.jsonl", [{"step": 2}])
  return root


def test_states_follow_the_files(root):
  rows = {r["name"]: r for r in sweep_status.collect(root)}
  assert {n: r["state"] for n, r in rows.items()} == {
      "done": "done", "diverged": "done", "running": "running", "elsewhere": "running", "died": "interrupted",
      "failed": "failed", "queued": "queued", "resubmitted": "queued", "stopped": "interrupted",
      "stale": "queued", "interrupted": "interrupted", "pending": "pending"}
  assert rows["running"]["step"] == 3 and rows["running"]["num_steps"] == 8
  assert rows["running"]["job"] == "7_1"
  assert rows["failed"]["error"] == "ValueError: bad" and rows["failed"]["log"] == "/logs/9_0_log.err"
  assert rows["queued"]["log"] == "/logs/7_5_0_log.err"  # the job's log, before it even starts
  assert rows["stale"]["job"] == "9_0"
  assert rows["stopped"]["error"] == "CalledProcessError: x"


def test_status_table_has_one_line_per_point_and_the_counts(root):
  text = sweep_status.format_status(sweep_status.collect(root))
  lines = text.splitlines()
  assert len(lines) == 13
  by_name = {line.split()[1]: line for line in lines[:-1]}
  assert by_name["failed"].split()[0] == "failed"
  assert by_name["diverged"].endswith("diverged at step 5")
  assert by_name["failed"].endswith("ValueError: bad; log: /logs/9_0_log.err")
  assert "step 3/8" in by_name["running"] and "job 7_1" in by_name["running"]
  assert "last metrics" in by_name["running"]
  assert "job 7_5" in by_name["queued"]
  assert lines[-1] == ("12 points: 2 done, 2 running, 3 queued, 1 failed, 3 interrupted, "
                       "1 pending")


def test_a_directory_without_a_sweep_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="holds no sweep"):
    sweep_status.collect(str(tmp_path))
