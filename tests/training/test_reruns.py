"""The same command gives the same numbers (issue 60, item 8): a training command run twice, in
fresh processes, writes bit-identical losses to metrics.jsonl, whether its programs were compiled
(cold compilation cache), loaded from the persistent cache (warm) or compiled with the cache off;
and, with one XLA device, a small model's losses do not change with the cores it may use.

The children run with the environment a user's shell has: this suite's speed-ups (conftest.py
sets JAX_DISABLE_MOST_OPTIMIZATIONS and --xla_cpu_use_fusion_emitters=false for every child) are
taken out, since they compile other programs and so give other (equally deterministic) numbers;
docs/modalities.md and docs/attention/funnel.md give the measured difference.
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A 1-layer decoder on the default reversal task, 6 steps, a loss logged at every step.
TRAIN = [sys.executable, os.path.join(REPO, "experiments", "train.py"),
         "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
         "--config.train.num_steps=6", "--config.train.log_every=1",
         "--config.train.eval_every=6", "--config.train.checkpoint_every=6",
         "--config.train.batch_size=8", "--config.train.eval_batch_size=8",
         "--config.train.eval_batches=1", "--config.train.eval_at_start=False",
         "--config.data.test_lengths=(8,)"]


def user_env(tmp_path) -> dict:
  """os.environ without the test suite's compile speed-ups (module docstring)."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"}
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "fusion_emitters" not in f]
  env["XLA_FLAGS"] = " ".join(flags)
  env.update(PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  return env


def run(args, tmp_path, cores=None):
  """Runs args (pinned to `cores` if given) and returns its stdout; fails with its stderr."""
  preexec = (lambda: os.sched_setaffinity(0, cores)) if cores else None
  result = subprocess.run(args, cwd=REPO, env=user_env(tmp_path), capture_output=True, text=True,
                          timeout=600, preexec_fn=preexec)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def losses(workdir) -> list[tuple[int, str]]:
  """(step, the loss as written: the exact float32 value's repr) of every train-loss record."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  out = [(m["step"], repr(m[k])) for m in records for k in ("train/loss", "eval/loss") if k in m]
  assert out, records
  return out


def test_train_reruns_give_bit_identical_losses_cold_warm_and_without_the_cache(tmp_path):
  cold, warm, off = (str(tmp_path / name) for name in ("cold", "warm", "off"))
  run([*TRAIN, f"--workdir={cold}"], tmp_path)
  assert os.listdir(tmp_path / "cache" / "xla"), "the first run wrote no compiled program"
  run([*TRAIN, f"--workdir={warm}"], tmp_path)
  run([*TRAIN, f"--workdir={off}", "--compilation_cache=none"], tmp_path)
  first = losses(cold)
  assert len([s for s, _ in first]) == 7  # 6 train losses and the final eval
  assert losses(warm) == first
  assert losses(off) == first


@pytest.mark.slow  # two compiles with the optimizations on (~130-180 s at load average 8-10)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to compare with 1")
def test_with_one_device_the_small_model_losses_do_not_depend_on_the_cores(tmp_path):
  """XLA:CPU sizes its thread pool from the cores the process may use. With the device count
  fixed (mesh.cpu_devices=0: one device), this small model's losses are the same on one core and
  on two (each run compiles: the cache is off). What does move with the cores, measured in
  docs/attention/funnel.md: the device count of mesh.cpu_devices=-1 (one device per usable
  core, configs/default.py's setting: another program, the gradient summed over devices), and
  the Funnel config's larger matmuls, whose multi-threaded sums are split by thread count."""
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  cores = sorted(os.sched_getaffinity(0))
  for workdir, pinned in ((one, {cores[0]}), (two, set(cores[:2]))):
    run([*TRAIN, f"--workdir={workdir}", "--compilation_cache=none",
         "--config.mesh.cpu_devices=0"], tmp_path, cores=pinned)
  assert losses(one) == losses(two)


@pytest.mark.slow  # two Funnel runs (~280 s at load average 8-10)
def test_modality_reruns_give_bit_identical_losses(tmp_path):
  """experiments/train_modality.py (docs/attention/funnel.md's command, the 'test' size, 20
  steps, a loss at every step) twice."""
  args = [sys.executable, os.path.join(REPO, "experiments", "train_modality.py"),
          "--config=" + os.path.join(REPO, "configs", "funnel_synthetic.py") + ":test",
          "--config.train.num_steps=20", "--config.train.log_every=1",
          "--config.train.eval_batches=1"]
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  run([*args, f"--workdir={a}"], tmp_path)
  run([*args, f"--workdir={b}"], tmp_path)
  assert len(losses(a)) == 22 and losses(a) == losses(b)  # 20 steps, evals at 0 and 20
