"""Pre-registered confirmations (tfjax/research/confirm.py, issue 59 item 4): a plan's points are
the section's arms on fresh seeds; nothing is read before every planned point has a result;
rows of another plan version or of two devices are not read; the confirmatory words are the
rule's on the planned seeds alone (checked against scipy here); the runner refuses a plan that
is not committed and never overwrites another plan's results."""

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from tfjax.research import confirm, sweep, sweep_doc, verdicts

REPO = sweep_doc.REPO
PLAN = os.path.join(REPO, "configs", "ablations", "confirm", "replication_1.py")


@pytest.fixture(scope="module", name="plan")
def plan_module():
  return sweep.load_module(PLAN)


def test_planned_points_are_the_claims_arms_on_seeds_no_sweep_has_run(plan):
  used = set()
  for path in glob.glob(os.path.join(REPO, sweep_doc.RESULTS_DIR, "*.jsonl")):
    with open(path, encoding="utf-8") as f:
      used |= {json.loads(line).get("overrides", {}).get("seed") for line in f}
  for name, spec in plan.PLAN["sections"].items():
    points = plan.get_sweep(name)
    assert {p["seed"] for p in points} == set(spec["seeds"])
    assert not set(spec["seeds"]) & used, name  # fresh seeds
    section = sweep.load_module(os.path.join(REPO, "configs", "ablations", f"{name}.py"))
    exploratory = [{k: v for k, v in p.items() if k != "seed"}
                   for p in section.get_sweep("medium")]
    arms = {json.dumps({k: v for k, v in p.items() if k != "seed"}, sort_keys=True)
            for p in points}
    for arm in map(json.loads, arms):
      assert arm in exploratory, (name, arm)  # the section's own arms, nothing new
      assert any(verdicts.reads(c, arm) for c in plan.CLAIMS(name)), (name, arm)
    # every side of every planned claim (but a fixed number) has its arm planned
    for claim in plan.CLAIMS(name):
      assert "earlier_looks" not in claim  # planned seeds are read once
      if claim.get("kind") == "mrr":
        continue
      for side in (claim["a"], claim["b"]):
        if "value" not in side:
          assert any(verdicts.matches({"overrides": json.loads(a)}, side) for a in arms)


def _rows_for(plan, section, values, device="cpu (2 cores)", tag=None):
  """Result records of every planned point of `section`, metric values from values(point)."""
  tag = tag or {"id": plan.PLAN["id"], "commit": "abc1234", "hash": confirm.plan_hash(plan.PLAN)}
  return [{"point": f"p{i}", "overrides": p, "seed": p["seed"], "status": "done",
           "metrics": values(p), "commit": "abc1234", "seconds": 1.0, "device": device,
           "config": None, "plan": tag}
          for i, p in enumerate(plan.get_sweep(section))]


def _write(repo, plan, section, recs):
  path = confirm.results_path(str(repo), plan.PLAN["id"], section)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for rec in recs:
      f.write(json.dumps(rec, sort_keys=True) + "\n")


def _grad_norms(p):
  """norm_init metrics: a post-LN ratio layer 6 / layer 1 that grows with the seed."""
  rng = np.random.default_rng(p["seed"])
  grows = p["model.norm_placement"] == "post"
  last = 1.0 + (0.3 if grows else -0.4) + 0.05 * rng.standard_normal()
  return {"init/grad_norm_ffn_wo@1": 1.0, "init/grad_norm_ffn_wo@6": last, "diverged": 0.0}


def test_nothing_is_read_until_every_planned_point_has_a_result(plan, tmp_path):
  recs = _rows_for(plan, "norm_init", _grad_norms)
  _write(tmp_path, plan, "norm_init", recs[:-1])
  judged = confirm.judge(plan, "norm_init", str(tmp_path))
  assert judged["status"] == "pending"
  assert (judged["done"], judged["planned"]) == (len(recs) - 1, len(recs))
  assert all("result" not in c for c in judged["claims"])


def test_complete_results_are_judged_by_the_rule_on_the_planned_seeds_alone(plan, tmp_path):
  recs = _rows_for(plan, "norm_init", _grad_norms)
  _write(tmp_path, plan, "norm_init", recs)
  judged = confirm.judge(plan, "norm_init", str(tmp_path))
  assert judged["status"] == "read" and judged["commit"] == ["abc1234"]
  ratio = lambda place: [r["metrics"]["init/grad_norm_ffn_wo@6"] for r in recs  # noqa: E731
                         if r["overrides"]["model.norm_placement"] == place]
  grows, relative = (c["result"] for c in judged["claims"])
  # scipy, independently: one-sample t of post's ratios against 1, Welch of post vs pre; Holm
  # over the two (the section's planned family), no looks.
  p_grows = stats.ttest_1samp(ratio("post"), 1.0).pvalue
  p_rel = stats.ttest_ind(ratio("post"), ratio("pre"), equal_var=False).pvalue
  assert grows["p"] == pytest.approx(p_grows, rel=1e-6)
  assert relative["p"] == pytest.approx(p_rel, rel=1e-6)
  assert grows["p_holm"] == pytest.approx(min(1.0, 2 * max(p_grows, p_rel)) if p_grows > p_rel
                                          else min(1.0, 2 * p_grows), rel=1e-6)
  assert grows["word"] == relative["word"] == "reproduced"
  assert "looks" not in grows


def test_rows_of_another_plan_version_or_of_two_devices_are_not_read(plan, tmp_path):
  other = {"id": plan.PLAN["id"], "commit": "abc1234", "hash": "000000000000"}
  _write(tmp_path, plan, "norm_init", _rows_for(plan, "norm_init", _grad_norms, tag=other))
  judged = confirm.judge(plan, "norm_init", str(tmp_path))
  assert judged["status"] == "mismatch" and "another version of the plan" in judged["why"]
  recs = _rows_for(plan, "norm_init", _grad_norms)
  recs[0]["device"] = "gpu: NVIDIA H100"
  _write(tmp_path, plan, "norm_init", recs)
  judged = confirm.judge(plan, "norm_init", str(tmp_path))
  assert judged["status"] == "mismatch" and "one device kind" in judged["why"]


def test_the_doc_shows_exploratory_and_confirmatory_words_side_by_side(plan, tmp_path):
  for rel in ("configs/ablations", sweep_doc.RESULTS_DIR):
    shutil.copytree(os.path.join(REPO, rel), tmp_path / rel)
  recs = _rows_for(plan, "norm_init", _grad_norms)
  _write(tmp_path, plan, "norm_init", recs)
  module = sweep.load_module(str(tmp_path / "configs/ablations/confirm/replication_1.py"))
  sections = [sweep_doc.load_section("norm_init", str(tmp_path))]
  sections[0]["judged"] = sweep_doc.judge(sections[0])
  block = sweep_doc.confirm_block(sweep_doc.confirmations(sections, str(tmp_path)))
  line = next(l for l in block.split("\n") if "| norm_init |" in l and "grows towards" in l)
  cells = [c.strip() for c in line.strip("|").split("|")]
  explored = next(c for c in sections[0]["judged"] if c["id"] == "xiong_postln_grows")
  assert cells[3] == explored["result"]["word"] and cells[4] == "reproduced"
  assert cells[6] == ("confirmed" if explored["result"]["word"] == "reproduced" else
                      f"not confirmed ({explored['result']['word']} -> reproduced) (the claim "
                      "itself reads reproduced on the planned seeds)")
  assert module.PLAN["id"] in cells[0] and "abc1234" in cells[0]
  pending = next(l for l in block.split("\n") if "| heads |" in l)
  assert "pending" in pending and "0 of 16 planned points" in pending


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _plan_repo(tmp_path):
  """A git repository holding the configs and experiments with the plan committed: (root, the
  plan's path)."""
  repo = tmp_path / "repo"
  for rel in ("configs/ablations", "experiments"):
    shutil.copytree(os.path.join(REPO, rel), repo / rel)
  _git(repo, "init", "-q")
  _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
  _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "plan")
  return repo, repo / "configs/ablations/confirm/replication_1.py"


def test_the_runner_refuses_an_uncommitted_plan_and_another_plans_results(tmp_path):
  """experiments/confirm.py: an edited, uncommitted plan is refused before anything runs; once
  committed, an existing results file of another plan version is not overwritten."""
  repo, plan_path = _plan_repo(tmp_path)
  plan_path.write_text(plan_path.read_text() + "\n# edited after the commit\n")
  cmd = [sys.executable, str(repo / "experiments/confirm.py"), f"--plan={plan_path}",
         "--section=norm_init", f"--workdir={tmp_path / 'runs'}"]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
  assert out.returncode == 2 and "is not committed as it stands" in out.stderr, out.stderr
  _git(repo, "checkout", "-q", "--", str(plan_path))
  module = sweep.load_module(str(plan_path))
  other = {"id": module.PLAN["id"], "commit": "abc1234", "hash": "000000000000"}
  _write(repo, module, "norm_init", _rows_for(module, "norm_init", _grad_norms, tag=other))
  path = confirm.results_path(str(repo), module.PLAN["id"], "norm_init")
  before = open(path, encoding="utf-8").read()
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
  assert out.returncode == 2 and "is not overwritten" in out.stderr, out.stderr
  assert open(path, encoding="utf-8").read() == before
  assert not (tmp_path / "runs").exists()  # nothing ran


def test_the_runner_runs_only_the_points_the_committed_results_lack(tmp_path):
  """A section whose every planned point has a row of this plan is not run again; with one row
  missing, --export_only from an empty workdir finds nothing to add and leaves the file as is."""
  repo, plan_path = _plan_repo(tmp_path)
  module = sweep.load_module(str(plan_path))
  recs = _rows_for(module, "norm_init", _grad_norms)
  for rec, point in zip(recs, sweep.load_sweep(str(plan_path), "norm_init").points):
    rec["point"] = point.name
  _write(repo, module, "norm_init", recs)
  cmd = [sys.executable, str(repo / "experiments/confirm.py"), f"--plan={plan_path}",
         "--section=norm_init", f"--workdir={tmp_path / 'runs'}"]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
  assert out.returncode == 0 and "nothing to run" in out.stdout, out.stderr
  assert not (tmp_path / "runs").exists()
  _write(repo, module, "norm_init", recs[:-1])
  path = confirm.results_path(str(repo), module.PLAN["id"], "norm_init")
  before = open(path, encoding="utf-8").read()
  out = subprocess.run(cmd + ["--export_only"], capture_output=True, text=True, cwd=repo)
  assert out.returncode == 2 and "no planned point finished there" in out.stderr, out.stderr
  assert open(path, encoding="utf-8").read() == before


def test_stamped_rows_carry_the_plans_commit_and_hash(plan):
  rows = confirm.stamp([{"point": "x"}], plan.PLAN, "abc1234")
  assert rows == [{"point": "x", "plan": {"id": "replication_1", "commit": "abc1234",
                                          "hash": confirm.plan_hash(plan.PLAN)}}]
