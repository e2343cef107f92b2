"""A real multi-process run: 2 processes on 127.0.0.1, 4 CPU devices each, collectives over gloo.

Both processes run the actual CLI (`python -m tfjax.training.entry.main ...
--coordinator_address=... --num_processes=2 --process_id=i`), i.e. jax.distributed.initialize, a
mesh spanning both processes, per-process data loading with
jax.make_array_from_process_local_data, orbax checkpoints written by both, metrics written only
by process 0. The 5 losses must equal a single-device run's.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)

from scaleout_helper import FAST_COMPILE  # pylint: disable=wrong-import-position
from tfjax.training.loop import metrics  # pylint: disable=wrong-import-position


TIMEOUT_S = 240


# ---- jax.distributed settings (no initialization happens here) --------------------------------
_LAUNCH_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               "JAX_LOCAL_DEVICE_IDS", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID",
               "OMPI_COMM_WORLD_SIZE")


# ---- Two real processes --------------------------------------------------------------------------
def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(workdir, mesh, num_processes=2, devices_per_process=4, overrides=()):
  """Starts the CLI once per process; returns the Popen objects (stdout+stderr to log files)."""
  port = free_port()
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
             TFJAX_CACHE_DIR=os.path.join(workdir, "cache"),  # a relaunch loads its programs
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "  # the suite's (tests/conftest.py)
                       f"--xla_force_host_platform_device_count={devices_per_process} "
                       f"{FAST_COMPILE}")
  for key in _LAUNCH_ENV:
    env.pop(key, None)
  procs = []
  for pid in range(num_processes):
    log = open(os.path.join(workdir, f"process_{pid}.log"), "w")
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "tfjax.training.entry.main", f"--config={TESTS}/scaleout_config.py",
         f"--workdir={workdir}/run", f"--coordinator_address=127.0.0.1:{port}",
         f"--num_processes={num_processes}", f"--process_id={pid}",
         f"--config.mesh.data={mesh[0]}", f"--config.mesh.fsdp={mesh[1]}",
         f"--config.mesh.tensor={mesh[2]}", *overrides],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    log.close()
  return procs


def wait_all(procs, workdir, deadline, status=0):
  """Waits for every process; on failure or timeout reports the logs. Never leaves one running."""
  try:
    for proc in procs:
      proc.wait(timeout=max(1.0, deadline - time.time()))
  except subprocess.TimeoutExpired:
    pytest.fail(f"multi-process run did not finish within {TIMEOUT_S} s:\n" + logs(workdir))
  finally:
    kill(procs)
  codes = [p.returncode for p in procs]
  assert codes == [status] * len(procs), f"exit codes {codes}\n" + logs(workdir)


def kill(procs):
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
  for proc in procs:
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover
      pass


def logs(workdir):
  out = []
  for name in sorted(os.listdir(workdir)):
    if name.endswith(".log"):
      with open(os.path.join(workdir, name)) as f:
        out.append(f"--- {name} ---\n{f.read()[-4000:]}")
  return "\n".join(out)


def train_records(run, name="metrics.jsonl"):
  with open(os.path.join(run, name)) as f:
    return [r for r in map(json.loads, f) if "train/loss" in r]


def single_device_losses():
  import jax  # pylint: disable=import-outside-toplevel
  import scaleout_config  # pylint: disable=import-outside-toplevel
  import scaleout_helper  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  config = scaleout_config.get_config()
  config.mesh.update(data=1, fsdp=1, tensor=1)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  losses, _ = scaleout_helper.run_steps(config, mesh, config.train.num_steps)
  return losses


def run_two_processes(workdir, mesh, deadline, expected=None, overrides=()):
  """One 2-process CLI run; computes the single-device reference meanwhile if not given."""
  procs = launch(workdir, mesh, overrides=overrides)
  try:
    if expected is None:
      expected = single_device_losses()  # while the two processes compile
  finally:
    wait_all(procs, workdir, deadline)
  return expected


def test_two_processes_match_single_device(tmp_path):
  workdir = str(tmp_path)
  # Mesh (1, 4, 2): fsdp spans both processes (weights all-gathered across them over gloo),
  # tensor inside each; process p holds batch rows [4p, 4p + 4). The steps run through the
  # multi-step program (stacked batches placed from each process's rows; one step per call, as
  # every step logs); the resume test below runs one train_step call per batch.
  expected = run_two_processes(workdir, (1, 4, 2), time.time() + TIMEOUT_S,
                               overrides=("--config.train.steps_per_call=2",))
  run = os.path.join(workdir, "run")
  records = train_records(run)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # process 0 alone wrote metrics
  np.testing.assert_allclose([r["train/loss"] for r in records], expected, rtol=2e-5)
  assert sorted(os.listdir(os.path.join(run, "checkpoints")), key=int) == ["3", "5"]
  assert not [n for n in os.listdir(run) if ".tmp" in n]


@pytest.mark.slow
def test_two_processes_resume_on_another_mesh(tmp_path):
  workdir = str(tmp_path)
  deadline = time.time() + 2 * TIMEOUT_S
  expected = run_two_processes(workdir, (1, 4, 2), deadline)
  # Resume from the step-3 checkpoint on another mesh: (2, 2, 2), data now across the processes.
  run = os.path.join(workdir, "run")
  shutil.rmtree(os.path.join(run, "checkpoints", "5"))
  run_two_processes(workdir, (2, 2, 2), deadline, expected)
  # The resume moved the first run's steps 4-5 aside (metrics.SUPERSEDED_FILE) and wrote its own.
  superseded = train_records(run, metrics.SUPERSEDED_FILE)
  assert [r["step"] for r in superseded] == [4, 5]
  records = train_records(run)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
  np.testing.assert_allclose([r["train/loss"] for r in records], expected, rtol=2e-5)


@pytest.mark.slow
def test_a_signal_to_one_process_stops_every_process_at_the_same_step(tmp_path):
  # SLURM signals each host on its own; the run must still stop as one: both processes checkpoint
  # the same step and exit 128 + SIGUSR1 (without agreeing, process 0 would wait for process 1 in the next
  # step's collectives until the timeout).
  import signal as signals  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path)
  procs = launch(workdir, (1, 4, 2), overrides=("--config.train.num_steps=100000",
                                                "--config.train.checkpoint_every=100000"))
  run = os.path.join(workdir, "run")
  deadline = time.time() + TIMEOUT_S
  try:
    while not (os.path.exists(os.path.join(run, "metrics.jsonl")) and train_records(run)):
      assert time.time() < deadline and all(p.poll() is None for p in procs), logs(workdir)
      time.sleep(0.5)
    procs[1].send_signal(signals.SIGUSR1)
  finally:
    wait_all(procs, workdir, deadline, status=128 + signals.SIGUSR1)
  saved = sorted(os.listdir(os.path.join(run, "checkpoints")), key=int)
  last_logged = train_records(run)[-1]["step"]
  assert len(saved) == 1 and int(saved[0]) == last_logged < 100000, (saved, last_logged)
  for pid in range(2):
    with open(os.path.join(workdir, f"process_{pid}.log")) as f:
      assert f"checkpoint saved at step {saved[0]}, exiting" in f.read(), logs(workdir)
