"""tfjax/training/loop/train.py: the training loop end to end (outputs, exact resume, steps per
call, every task, signals)."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tfjax.training.accounting import flops
from tfjax.training.loop import experiment, train
from run_helpers import REPO, read_metrics, tiny_config, train_losses



def test_default_config_trains_and_writes_outputs(tmp_path):
  sys.path.insert(0, REPO)
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.train.update(num_steps=40, eval_every=20, log_every=1, batch_size=16,
                      eval_batch_size=16, eval_batches=1, checkpoint_every=20)
  config.optimizer.warmup_steps = 5  # the full run warms up over 100 of its 1000 steps
  config.data.test_lengths = (8, 32)  # of its four: one in distribution, one past it
  config.train.peak_flops = 1e9  # CPUs are not in the peak table; a given peak turns MFU on
  workdir = str(tmp_path / "run")
  final = train.train_and_evaluate(config, workdir)
  records = read_metrics(workdir)
  losses = [m["train/loss"] for m in records if "train/loss" in m]
  # It learns: from ~ln(vocab=20) at step 1 to below ln(16 symbols) (the plateau of guessing).
  assert losses[0] > 2.9 and np.mean(losses[-5:]) < 2.7, losses
  last_train = [m for m in records if "train/loss" in m][-1]
  for key in ("train/lr", "train/grad_norm", "train/tokens_per_sec", "train/accuracy"):
    assert np.isfinite(last_train[key])
  exp = experiment.prepare(config)
  seq_len = exp.dataset.train_batch(0, 1)["inputs"].shape[-1]
  flops_per_token = flops.flops_per_token(exp.model_config, seq_len)
  assert last_train["train/mfu"] == pytest.approx(
      last_train["train/tokens_per_sec"] * flops_per_token / (1e9 * jax.device_count()), rel=1e-6)
  for key in ("eval/loss", "eval/perplexity", "eval/accuracy", "eval/exact_match@8",
              "eval/exact_match@32"):
    assert key in final
  assert records[0]["step"] == 0 and "eval/loss" in records[0]  # eval at start, like nanoGPT
  assert os.path.exists(os.path.join(workdir, "config.json"))
  assert any(n.startswith("events") for n in os.listdir(os.path.join(workdir, "tensorboard")))
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20", "40"]


def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path):
  config = tiny_config(num_steps=8)
  straight = str(tmp_path / "straight")
  train.train_and_evaluate(config, straight)
  resumed = str(tmp_path / "resumed")
  train.train_and_evaluate(config, resumed, stop_after_step=3)  # like SIGTERM during step 3
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["3"]
  train.train_and_evaluate(config, resumed)
  expected, got = train_losses(straight), train_losses(resumed)
  assert sorted(got) == list(range(1, 9))
  for step in range(4, 9):  # bitwise equal after the restart
    assert got[step] == expected[step], (step, got[step], expected[step])


def test_several_steps_per_call_log_evaluate_and_checkpoint_at_the_same_steps(tmp_path):
  """train.steps_per_call=3 runs up to 3 steps per jitted call, cut short at every step that logs,
  evaluates or checkpoints: the same records and checkpoints as one step per call, the same
  losses; an interrupted run (mid-call boundary at step 5) resumes to the same losses."""
  runs = {}
  for name, per_call, stop in (("one", 1, None), ("three", 3, None), ("resumed", 3, 5)):
    config = tiny_config(num_steps=10, steps_per_call=per_call, log_every=4, eval_every=8,
                         checkpoint_every=4, keep_checkpoints=5)
    config.data.test_lengths = (8,)  # one eval length: the steps that evaluate are what's tested
    workdir = str(tmp_path / name)
    if stop:
      train.train_and_evaluate(config, workdir, stop_after_step=stop)
      assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int) == ["4", "5"]
    train.train_and_evaluate(config, workdir)
    runs[name] = workdir
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int) == (
        ["4", "5", "8", "10"] if stop else ["4", "8", "10"])
    assert [m["step"] for m in read_metrics(workdir) if "eval/loss" in m] == [8, 10]
  one, three, resumed = (train_losses(runs[n]) for n in ("one", "three", "resumed"))
  assert sorted(one) == sorted(three) == [4, 8, 10] and sorted(resumed) == [4, 8, 10]
  for step in (4, 8, 10):
    np.testing.assert_allclose(three[step], one[step], rtol=1e-6)
    assert resumed[step] == three[step], (step, resumed[step], three[step])


@pytest.mark.parametrize("task,data,model", [
    ("seq2seq", dict(name="reverse", form="seq2seq"), dict(family="encoder_decoder")),
    ("mlm", dict(name="text"), dict(family="encoder", mlm_head=True)),
    ("classification", dict(name="majority"), dict(family="encoder", pooler=True,
                                                   num_classes=2, mlm_head=False)),
])
def test_every_task_trains(tmp_path, task, data, model):
  config = tiny_config(num_steps=30, eval_every=30, log_every=30, checkpoint_every=30)
  config.task = task
  config.data.test_lengths = (8,)  # one eval length: each task's train and eval path is tested
  if data["name"] == "text":
    path = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    path.write_text(" ".join("".join(rng.choice(list("abcde"), 4)) for _ in range(800)))
    data = dict(data, path=str(path), tokenizer="char", seq_len=32)
  config.data.update(**data)
  config.model.update(**model)
  if task == "classification":
    config.model.num_classes = 2
  final = train.train_and_evaluate(config, str(tmp_path / task))
  losses = [m["train/loss"] for m in read_metrics(str(tmp_path / task)) if "train/loss" in m]
  assert np.isfinite(final["eval/loss"]) and np.isfinite(losses[-1])


def _start_long_run(tmp_path):
  """(process, workdir) of a train.py run of 100000 steps that has logged its first step."""
  workdir = tmp_path / "run"
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "experiments", "train.py"), f"--workdir={workdir}",
       "--config.train.num_steps=100000", "--config.train.log_every=1",
       "--config.train.eval_at_start=False", "--config.train.eval_every=100000",
       "--config.model.num_layers=1", "--config.model.d_model=32"],
      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 120
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
    time.sleep(0.5)
  if not metrics.exists():
    proc.kill()
    proc.wait()
    raise AssertionError("training never logged a step")
  return proc, workdir


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_checkpoint_and_exits(tmp_path, signum):
  proc, workdir = _start_long_run(tmp_path)
  try:
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  steps = [int(s) for s in os.listdir(workdir / "checkpoints")]
  assert len(steps) == 1 and steps[0] >= 1
  # A scheduler must tell a stopped run from a finished one: 128 + the signal, never `done:`.
  assert proc.returncode == 128 + signum, err[-2000:]
  name = signal.Signals(signum).name
  assert out.strip().splitlines()[-1] == (
      f"stopped at step {steps[0]} by {name}; resume with the same command"), out
  assert "done:" not in out


def test_ctrl_c_through_tee_keeps_the_stopped_line(tmp_path):
  """`train.py | tee log` and Ctrl-C: the SIGINT reaches tee too, which exits at once, so the
  run's stdout has no reader when it prints `stopped at step ...` after its checkpoint. The line
  was lost (a BrokenPipeError on stdout); it now goes to stderr (the terminal)."""
  proc, workdir = _start_long_run(tmp_path)
  try:
    proc.stdout.close()  # tee, killed by the same Ctrl-C: the pipe's reader is gone
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  steps = [int(s) for s in os.listdir(workdir / "checkpoints")]
  assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
  assert err.strip().splitlines()[-1] == (
      f"stopped at step {steps[0]} by SIGINT; resume with the same command"), err[-2000:]
  assert "Traceback" not in err and "BrokenPipeError" not in err, err[-2000:]


@pytest.mark.slow  # ~15 s: a child process imports JAX and compiles before the signal lands
def test_a_signal_before_the_first_step_exits_128_plus_it_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "experiments", "train.py"), f"--workdir={workdir}",
       "--config.model.num_layers=1", "--config.model.d_model=32"],
      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    # Once the workdir exists the run is past flag parsing and imports, before its first step
    # (compiling a fresh model takes seconds): the stop must undo what the start wrote.
    deadline = time.time() + 60
    while not workdir.exists() and time.time() < deadline and proc.poll() is None:
      time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert err.strip().splitlines()[-1] == (
      "stopped by SIGTERM before the first step; nothing was written"), err[-2000:]
  assert "Traceback" not in err
  assert not workdir.exists()


def test_a_start_that_fails_leaves_no_workdir_behind(tmp_path):
  # A model that cannot hold the data's rows fails while its state is traced; the workdir this
  # start created must be gone, so the corrected rerun is not refused as "a different model".
  config = tiny_config(num_steps=1)
  config.model.update(position="learned", max_len=4)  # rows are longer than 4 tokens
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match="max_len=4"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
  # An existing workdir is left as it was: nothing of a failed start is written into it.
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="max_len=4"):
    train.train_and_evaluate(config, str(workdir))
  assert sorted(os.listdir(workdir)) == ["notes.txt"]


def _catches(pid, signum):
  """Whether process `pid` has a handler installed for `signum` (Linux /proc SigCgt mask)."""
  with open(f"/proc/{pid}/status") as f:
    mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
  return bool(mask >> (signum - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_a_signal_while_the_train_command_imports_is_one_line_and_no_traceback(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "experiments", "train.py"), f"--workdir={workdir}"],
      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 30
    while proc.poll() is None and not _catches(proc.pid, signal.SIGTERM):
      assert time.time() < deadline
      time.sleep(0.001)
    proc.send_signal(signal.SIGTERM)  # the script's first lines installed the handler: imports
    _, err = proc.communicate(timeout=60)  # of tfjax and JAX are still running (~1-2 s)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert err.strip().splitlines() == [
      "stopped by SIGTERM before the first step; nothing was written"], err[-2000:]
  assert not workdir.exists()
