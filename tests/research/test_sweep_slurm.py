"""Sweeps as submitit jobs (tfjax/research/sweep_slurm.py), through experiments/sweep.py.

The same 2-point smoke sweep (plus a point that fails at run time) runs three ways:
--launcher=local (the reference), --launcher=submitit_local (submitit's real submission, pickling,
signal and requeue machinery, each job a local process) and, in the test marked `slurm`,
--launcher=slurm through a real sbatch (scripts/slurm_localhost.sh start). Every way must give the
same results.csv. In the submitit runs one point is preempted at step 2 by a real SIGUSR1 sent from
inside its job: it must checkpoint, be requeued by submitit and resume from step 2.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from tfjax.research import sweep, sweep_slurm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP_SCRIPT = os.path.join(REPO, "experiments", "sweep.py")
PREEMPTED = "seed=0,data.seed=1"
FAILING = "num_symbols=1"

# One variant, two seed pairs: the points compile one program, so after the reference run every
# job finds it in the shared compilation cache. A third point fails at run time (1 symbol).
# With SWEEP_TEST_PREEMPT=<point> the job training that point sends itself SIGUSR1 right after
# logging step 2, once (a marker file remembers it), as SLURM does before a time limit.
SMOKE_SWEEP = '''
import os, signal
from tfjax.research import sweep
from tfjax.training.config.defaults import base_config

REPORT = dict(plots=[])

def get_config(scale=None):
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 4), test_lengths=(4, 8),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, position="rope", max_len=32)
  config.optimizer.update(lr=3e-3, warmup_steps=1)
  config.train.update(num_steps=4, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=2, log_every=2, checkpoint_every=4, eval_at_start=True)
  return config

def get_sweep(scale=None):
  return [{"seed": 0, "data.seed": 1}, {"seed": 1, "data.seed": 0}, {"data.num_symbols": 1}]

if os.environ.get("SWEEP_TEST_PREEMPT") and os.environ.get("SUBMITIT_EXECUTOR"):
  from tfjax.training.loop import metrics

  _write = metrics.MetricsWriter.write

  def _write_then_preempt(self, step, values):
    _write(self, step, values)
    workdir = os.path.dirname(self._jsonl.name)
    marker = os.path.join(workdir, "preempted_by_test")
    if (os.path.basename(workdir) == os.environ["SWEEP_TEST_PREEMPT"] and step == 2
        and "train/loss" in values and not os.path.exists(marker)):
      open(marker, "w").close()
      os.kill(os.getpid(), signal.SIGUSR1)

  metrics.MetricsWriter.write = _write_then_preempt
'''

# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, minutes", [
    (90, 90), ("90", 90), ("1:30:00", 90), ("0:00:30", 1), ("1:30", 2), ("2-00:00:00", 2880),
    ("2-12", 3600), ("1-2:30", 1590)])
def test_slurm_times_in_minutes(text, minutes):
  assert sweep_slurm.time_minutes(text) == minutes


@pytest.mark.parametrize("bad", ["abc", "1h", "0", "-5", "1:2:3:4"])
def test_bad_slurm_times_are_rejected(bad):
  with pytest.raises(ValueError, match="slurm time"):
    sweep_slurm.time_minutes(bad)


def test_flags_override_the_sweep_configs_slurm_resources():
  resources = sweep_slurm.Resources.from_sources(
      {"partition": "gpu", "time": "2:00:00", "gpus_per_node": 8, "sbatch": {"account": "a"}},
      {"partition": "debug", "nodes": "2", "time": None, "sbatch": ["--qos=high", "exclusive"],
       "setup": []})
  assert (resources.partition, resources.nodes, resources.minutes) == ("debug", 2, 120)
  assert resources.processes_per_node == 8  # one process per GPU unless tasks_per_node says
  assert resources.sbatch == {"qos": "high", "exclusive": True}  # the flags' list replaces it
  with pytest.raises(ValueError, match="unknown key 'partiton'; did you mean 'partition'"):
    sweep_slurm.Resources.from_sources({"partiton": "gpu"}, {})
  with pytest.raises(ValueError, match="nodes='two' is not a valid int"):
    sweep_slurm.Resources.from_sources({}, {"nodes": "two"})
  with pytest.raises(ValueError, match="slurm.nodes=0 is out of range"):
    sweep_slurm.Resources.from_sources({"nodes": 0}, {})


# ---------------------------------------------------------------------------------------------
# The smoke sweep through the launchers
# ---------------------------------------------------------------------------------------------
VOLATILE = ("train/tokens_per_sec", "train/mfu")  # wall-clock rates, different in every run


def run_cli(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, SWEEP_SCRIPT, *args], capture_output=True, text=True,
                        timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def results(root):
  """results.csv as {name: row} without the wall-clock columns."""
  with open(os.path.join(root, "results.csv"), newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  return {r["name"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in rows}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  base = tmp_path_factory.mktemp("smoke_sweep")
  (base / "smoke.py").write_text(SMOKE_SWEEP)
  return {"config": str(base / "smoke.py"), "cache": str(base / "xla_cache"), "base": base}


@pytest.fixture(scope="module")
def local_run(smoke):
  root = str(smoke["base"] / "local")
  result = run_cli(f"--config={smoke['config']}", f"--workdir={root}", "--launcher=local",
                   f"--compilation_cache={smoke['cache']}")
  assert result.returncode == 1, result.stdout + result.stderr  # the failing point
  return root


def run_jobs(smoke, local_run, launcher, *extra):
  """The smoke sweep through a submitting launcher, one point preempted; then --status."""
  del local_run  # run first: it fills the compilation cache the jobs read
  root = str(smoke["base"] / launcher)
  result = run_cli(f"--config={smoke['config']}", f"--workdir={root}", f"--launcher={launcher}",
                   f"--compilation_cache={smoke['cache']}", *extra,
                   env={"SWEEP_TEST_PREEMPT": PREEMPTED}, timeout=600)
  status = run_cli(f"--workdir={root}", "--status")
  return root, result, status


@pytest.fixture(scope="module")
def submitit_run(smoke, local_run):
  # Local jobs end without a queue to settle: check them every 0.2 s, not every 2 s.
  return run_jobs(smoke, local_run, "submitit_local", "--poll_s=0.2")


def check_sweep(root, result, status, local_root):
  out = result.stdout + result.stderr
  # Same results.csv as the local launcher: statuses, overrides and every metric to the last digit.
  assert result.returncode == 1, out
  assert f"failed points (1): {FAILING}" in result.stderr
  assert results(root) == results(local_root)
  assert [r["status"] for r in results(root).values()] == ["done"] * 2 + ["failed"]

  # The preempted point checkpointed at step 2, was requeued by submitit and resumed from there.
  workdir = os.path.join(root, PREEMPTED)
  assert os.path.exists(os.path.join(workdir, "preempted_by_test"))
  job = sweep.read_json(os.path.join(workdir, sweep.JOB_FILE))
  with open(job["stderr"], encoding="utf-8") as f:
    log = f.read()
  assert f"signal {10}: checkpoint saved at step 2" in log, log  # SIGUSR1 = 10
  assert "Requeued job" in log and "resumed from step 2" in log, log
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    steps = [json.loads(line)["step"] for line in f]
  assert steps == [0, 2, 2, 4, 4], steps  # each step once: nothing retrained after the resume

  # The failing point: its error and log recorded, and --status shows both.
  failure = sweep.read_json(os.path.join(root, FAILING, sweep.FAILED_FILE))
  assert failure["error"] == "ValueError: num_symbols must be >= 2, got 1"
  with open(failure["log"], encoding="utf-8") as f:
    assert "num_symbols must be >= 2" in f.read()
  lines = status.stdout.splitlines()
  assert status.returncode == 0, status.stderr
  assert lines[-1] == "3 points: 2 done, 1 failed", status.stdout
  failed_line = next(line for line in lines if FAILING in line)
  assert failed_line.split()[0] == "failed"
  assert f"ValueError: num_symbols must be >= 2, got 1; log: {failure['log']}" in failed_line
  assert sum(line.startswith("done ") and "step 4/4" in line for line in lines) == 2
  assert [line.split()[1] for line in lines[:-1]] == list(results(local_root))  # sweep order


def test_submitit_jobs_give_the_local_results_resume_a_preempted_point_and_report_a_failure(
    smoke, local_run, submitit_run):
  root, result, status = submitit_run
  check_sweep(root, result, status, local_run)
  # Every unfinished point went through submitit: one job (and its logs) per point.
  jobs = {sweep.read_json(os.path.join(root, n, sweep.JOB_FILE))["job_id"]
          for n in results(root)}
  assert len(jobs) == 3
  # A finished sweep submits nothing again: done points are skipped, the failed one retried.
  again = run_cli(f"--config={smoke['config']}", f"--workdir={root}", "--launcher=submitit_local",
                  f"--compilation_cache={smoke['cache']}", "--poll_s=0.2",
                  "--only=seed=1,data.seed=0")
  assert again.returncode == 1 and "'skipped': 1" in again.stdout, again.stdout + again.stderr


def test_a_poll_interval_that_is_not_positive_is_a_clear_error(smoke):
  result = run_cli(f"--config={smoke['config']}", f"--workdir={smoke['base'] / 'poll'}",
                   "--launcher=submitit_local", "--poll_s=0")
  assert result.returncode == 2, result.stdout + result.stderr
  assert "--poll_s=0.0: give the seconds between job checks, > 0" in result.stderr, result.stderr


def slurm_unavailable():
  """Why no SLURM cluster can take jobs from here, or None."""
  if shutil.which("sbatch") is None:
    return ("needs a SLURM cluster: sbatch is not on PATH (scripts/slurm_localhost.sh install "
            "and start set up one on this machine)")
  ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=60)
  if ping.returncode != 0 or "UP" not in ping.stdout:
    said = ((ping.stdout + ping.stderr).strip().splitlines() or ["no answer"])[0]
    return (f"sbatch is installed but no SLURM controller answers (scontrol ping: {said}); "
            "scripts/slurm_localhost.sh start")
  return None


@pytest.mark.slurm
def test_real_slurm_runs_the_smoke_sweep_as_one_job_array(smoke, request):
  reason = slurm_unavailable()
  if reason:
    pytest.skip(reason)
  local_run = request.getfixturevalue("local_run")  # only when there is a cluster to compare
  root, result, status = run_jobs(smoke, local_run, "slurm", "--slurm.time=10",
                                  "--slurm.signal_delay_s=30")
  check_sweep(root, result, status, local_run)
  job_ids = [sweep.read_json(os.path.join(root, n, sweep.JOB_FILE))["job_id"]
             for n in results(root)]
  assert len({j.split("_")[0] for j in job_ids}) == 1, job_ids  # one array, a task per point
