"""tfjax/research/sweep_packed.py: --pack_seeds groups a variant's seeds, writes every member the
records of a separate run, reuses finished points and resumes a stopped group."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfjax.research import sweep, sweep_packed, sweep_report, sweep_results
from run_helpers import train_losses
from test_sweep import REPO, write_sweep_module

POINTS = [{"model.d_ff": f, "seed": s} for f in (32, 48) for s in (0, 1, 2)]


def test_parse_pack_and_groups():
  assert sweep_packed.parse_pack("") is None and sweep_packed.parse_pack("0") is None
  with pytest.raises(ValueError, match=r"--pack_seeds=1: a group of one seed packs nothing"):
    sweep_packed.parse_pack("1")  # was read as off, silently
  assert sweep_packed.parse_pack("auto") == "auto" and sweep_packed.parse_pack("3") == 3
  for bad in ("-2", "x", "2.5"):
    with pytest.raises(ValueError, match="--pack_seeds="):
      sweep_packed.parse_pack(bad)
  points = [sweep.Point(n, o) for n, o in zip(sweep.point_names(POINTS), POINTS)]
  grouped = sweep_packed.groups(points, 2)
  assert [[p.name for p in g] for g in grouped] == [
      ["d_ff=32,seed=0", "d_ff=32,seed=1"], ["d_ff=32,seed=2"],
      ["d_ff=48,seed=0", "d_ff=48,seed=1"], ["d_ff=48,seed=2"]]


def test_packed_sweep_writes_the_records_of_separate_runs(tmp_path):
  loaded = sweep.load_sweep(write_sweep_module(tmp_path, POINTS[:3], steps=6))
  separate, packed_root = str(tmp_path / "separate"), str(tmp_path / "packed")
  sweep.run_sweep(loaded, separate, only=[loaded.points[0].name])  # finished before: reused
  sweep.run_sweep(loaded, packed_root, only=[loaded.points[0].name])
  statuses = sweep_packed.run_packed(loaded, packed_root, loaded.points, 2, stop_after_step=3)
  assert statuses == {"d_ff=32,seed=0": "skipped", "d_ff=32,seed=1": "interrupted",
                      "d_ff=32,seed=2": "interrupted"}
  assert not sweep.is_done(os.path.join(packed_root, "d_ff=32,seed=1"))
  statuses = sweep_packed.run_packed(loaded, packed_root, loaded.points, 2)  # resumes the group
  assert statuses == {"d_ff=32,seed=0": "skipped", "d_ff=32,seed=1": "done",
                      "d_ff=32,seed=2": "done"}
  sweep.run_sweep(loaded, separate)
  for point in loaded.points:
    want = train_losses(os.path.join(separate, point.name))
    got = train_losses(os.path.join(packed_root, point.name))
    assert sorted(got) == sorted(want) == [2, 4, 6]
    np.testing.assert_allclose([got[s] for s in (2, 4, 6)], [want[s] for s in (2, 4, 6)],
                               rtol=2e-5)
  done = [sweep.read_json(os.path.join(r, "d_ff=32,seed=1", sweep.DONE_FILE))
          for r in (separate, packed_root)]
  assert set(done[1]) == set(done[0]) | {"packed"}
  assert done[1]["packed"]["group"] == ["d_ff=32,seed=1", "d_ff=32,seed=2"]
  # The per-seed results a separate sweep writes, key for key.
  results = []
  for root in (separate, packed_root):
    report = sweep_report.write_report(root, loaded.points, {"metrics": ["eval/loss"]})
    done_files = {p.name: sweep.read_json(os.path.join(root, p.name, sweep.DONE_FILE))
                  for p in loaded.points}
    results.append(sweep_results.records(report["rows"], done_files, ["eval/loss"], "abc"))
  assert [set(r) for r in results[1]] == [set(r) for r in results[0]]
  for a, b in zip(*results):
    assert a["point"] == b["point"] and a["status"] == b["status"] == "done"
    assert b["metrics"]["eval/loss"] == pytest.approx(a["metrics"]["eval/loss"], rel=2e-5)


def test_pack_seeds_flag_errors_name_the_fix(tmp_path):
  path = write_sweep_module(tmp_path, POINTS[:2])
  base = [sys.executable, os.path.join(REPO, "experiments", "sweep.py"), f"--config={path}",
          f"--workdir={tmp_path / 'w'}"]
  for flags, message in ((["--pack_seeds=x"], "give a group size"),
                         (["--pack_seeds=auto", "--parallel=2"], "give the group size"),
                         (["--pack_seeds=2", "--launcher=slurm"], "--launcher=local")):
    result = subprocess.run(base + flags, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_packed_groups_in_child_processes(tmp_path):
  """--parallel=2 --pack_seeds=2: one child per group; every member done with its records."""
  path = write_sweep_module(tmp_path, POINTS[:3], steps=4)
  root = tmp_path / "w"
  cmd = [sys.executable, os.path.join(REPO, "experiments", "sweep.py"), f"--config={path}",
         f"--workdir={root}", "--parallel=2", "--pack_seeds=2", "--compilation_cache=none"]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  dones = {n: sweep.read_json(os.path.join(root, n, sweep.DONE_FILE))
           for n in ("d_ff=32,seed=0", "d_ff=32,seed=1", "d_ff=32,seed=2")}
  assert dones["d_ff=32,seed=0"]["packed"]["group"] == ["d_ff=32,seed=0", "d_ff=32,seed=1"]
  assert "packed" not in dones["d_ff=32,seed=2"]  # a group of one trains as a separate run
  for name in dones:
    assert sorted(train_losses(os.path.join(root, name))) == [2, 4]
