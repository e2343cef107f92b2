"""The experiment system end to end: training, exact resume, checkpoints, CLI errors."""

import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.training import cpu_fusion, experiment, flops, sharding, steps, tasks, train
from tfjax.training.defaults import base_config
from tfjax.nn.models import build_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(num_steps=8, **train_overrides):
  """A 1-layer decoder on the synthetic copy task: compiles and steps in seconds."""
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(4, 8),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=32, num_layers=1, num_heads=2,
                      d_ff=64, position="rope", max_len=64)
  config.optimizer.update(lr=3e-3, warmup_steps=2, min_lr=1e-4)
  config.train.update(num_steps=num_steps, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=4, log_every=1, checkpoint_every=4, eval_at_start=False)
  config.train.update(**train_overrides)
  return config


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def train_losses(workdir):
  return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


def test_default_config_trains_and_writes_outputs(tmp_path):
  sys.path.insert(0, REPO)
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.train.update(num_steps=40, eval_every=20, log_every=1, batch_size=16,
                      eval_batch_size=16, eval_batches=1, checkpoint_every=20)
  config.optimizer.warmup_steps = 5  # the full run warms up over 100 of its 1000 steps
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


def test_multi_step_equals_single_steps_and_ignores_padding():
  """make_multi_step over 5 of 8 stacked batches = 5 train_step calls (the 3 padded rows unread);
  its metrics are the 5th step's."""
  config = tiny_config()
  exp = experiment.prepare(config)
  model = build_model(exp.model_config.replace(deterministic=False))
  step_fn = steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.0, 1)
  state = experiment.state_layout(exp, _one_device_placement(config)).init()
  batches = [exp.dataset.train_batch(i, 8) for i in range(5)]
  single = jax.jit(step_fn)
  expected = state
  for batch in batches:
    expected, expected_metrics = single(expected, batch)
  stacked = experiment.stack_batches(batches, 8)
  for key in stacked:  # other batches in the padding must not matter
    stacked[key][5:] = np.asarray(batches[0][key])[::-1]
  got, got_metrics = jax.jit(steps.make_multi_step(step_fn))(state, stacked, np.int32(5))
  assert int(got.step) == 5
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(expected.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  for key in expected_metrics:
    np.testing.assert_allclose(got_metrics[key], expected_metrics[key], rtol=1e-5)


def test_state_init_draws_flax_init_params():
  """The state's params are model.init's with the params half of split(PRNGKey(seed)); on CPU the
  init program is compiled unoptimized (faster), which may change float rounding only."""
  config = tiny_config()
  config.seed = 7
  exp = experiment.prepare(config)
  state = experiment.state_layout(exp, _one_device_placement(config)).init()
  args, kwargs = tasks.model_inputs(exp.dataset.train_batch(0, 1), config.task)
  params_rng = jax.random.split(jax.random.PRNGKey(7))[0]
  model = build_model(exp.model_config)
  expected = nn.meta.unbox(model.init(params_rng, *args, **kwargs)["params"])
  assert jax.tree.structure(state.params) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert int(state.step) == 0


def test_train_step_gets_the_cpu_fusion_boundary_the_config_asks_for():
  """train.cpu_fusion reaches the jitted train step: 'on' routes each sublayer's residual-stream
  cotangent through a cond (tfjax/training/cpu_fusion.py), 'off' leaves none; the loss is the same."""
  config = tiny_config()
  placement = _one_device_placement(config)
  conds, losses = {}, {}
  try:
    for policy in ("on", "off"):
      config.train.cpu_fusion = policy
      exp = experiment.prepare(config)
      layout = experiment.state_layout(exp, placement)
      step = experiment.jit_train_step(exp, placement, layout.shardings)
      batch = placement.put(exp.dataset.train_batch(0, 8))
      with placement.axis_rules():
        conds[policy] = str(jax.make_jaxpr(step)(layout.abstract, batch)).count("cond[")
        losses[policy] = float(step(layout.init(), batch)[1]["train/loss"])
  finally:
    cpu_fusion.install("auto")
  assert conds["off"] == 0 and conds["on"] >= 2, conds  # 1 layer: attention and FFN sublayers
  assert losses["on"] == pytest.approx(losses["off"], rel=1e-6)


def _one_device_placement(config):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), sharding.MESH_AXES)
  return sharding.BatchPlacement.create(mesh, sharding.rules(config))


def test_corrupt_latest_checkpoint_falls_back_and_is_kept(tmp_path, caplog):
  config = tiny_config(num_steps=8)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir, stop_after_step=8)
  expected = train_losses(workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckpt_dir)) == ["4", "8"]
  # Corrupt step 8: truncate every file of its state item.
  for root, _, files in os.walk(os.path.join(ckpt_dir, "8", "state")):
    for name in files:
      open(os.path.join(root, name), "w").close()
  with caplog.at_level("WARNING"):
    train.train_and_evaluate(config, workdir)  # same config: resumes from step 4
  assert "corrupt or partial" in caplog.text
  quarantined = os.listdir(os.path.join(workdir, "checkpoints_unreadable"))
  assert len(quarantined) == 1 and quarantined[0].startswith("8-")
  assert sorted(os.listdir(ckpt_dir), key=int) == ["4", "8"]
  # Steps 5..8 were retrained from step 4 and gave the same losses as the first time.
  retrained = [m for m in read_metrics(workdir) if "train/loss" in m][-4:]
  assert [m["step"] for m in retrained] == [5, 6, 7, 8]
  for m in retrained:
    assert m["train/loss"] == expected[m["step"]]


def test_gradient_accumulation_equals_one_big_batch():
  config = tiny_config()
  exp = experiment.prepare(config)
  model = build_model(exp.model_config)
  placement = sharding.BatchPlacement.for_config(config)
  mesh = placement.mesh
  state = experiment.state_layout(exp, placement).init()
  batch = {k: jnp.asarray(v) for k, v in exp.dataset.train_batch(0, 8).items()}
  one = jax.jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 1))
  four = jax.jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 4))
  # Rows carry different numbers of answer tokens, so a mean of micro-batch means would differ.
  weights = np.asarray(batch["weights"]).sum(1)
  assert len(set(weights.tolist())) > 1
  # The same four micro-batches, summed by cpu_fusion.summed_over_shards' flat all-reduce.
  flat = functools.partial(cpu_fusion.summed_over_shards, mesh=mesh,
                           batch_spec=placement.sharding.spec)
  four_flat = jax.jit(steps.make_train_step(model, exp.optimizer, exp.schedule, "lm", 0.1, 4,
                                            flat))
  state_one, metrics_one = one(state, batch)
  for state_four, metrics_four in (four(state, batch), four_flat(state, batch)):
    np.testing.assert_allclose(metrics_one["train/loss"], metrics_four["train/loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 state_one.params, state_four.params)


@pytest.mark.parametrize("task,data,model", [
    ("seq2seq", dict(name="reverse", form="seq2seq"), dict(family="encoder_decoder")),
    ("mlm", dict(name="text"), dict(family="encoder", mlm_head=True)),
    ("classification", dict(name="majority"), dict(family="encoder", pooler=True,
                                                   num_classes=2, mlm_head=False)),
])
def test_every_task_trains(tmp_path, task, data, model):
  config = tiny_config(num_steps=30, eval_every=30, log_every=30, checkpoint_every=30)
  config.task = task
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


def test_lm_run_logs_the_greedy_sample_of_the_params_it_evaluated(tmp_path, caplog):
  """At an evaluation a text LM run logs a greedy continuation of train.sample_prompt (decoded
  with the KV cache on the sampler's own thread): it must be the argmax chain of full forward
  passes under the checkpointed params of that step."""
  path = tmp_path / "corpus.txt"
  path.write_text("abcdefgh" * 2000)  # learnt within 30 steps: the sample is not one repeated id
  config = tiny_config(num_steps=30, eval_every=30, checkpoint_every=30, sample_tokens=7,
                       sample_prompt="abc")
  config.data.update(name="text", path=str(path), tokenizer="char", seq_len=16)
  config.model.update(position="learned", max_len=16)
  workdir = str(tmp_path / "run")
  with caplog.at_level(logging.INFO, logger="tfjax"):
    train.train_and_evaluate(config, workdir)
  samples = [r.getMessage() for r in caplog.records if " sample: " in r.getMessage()]
  from tfjax.training import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)
  step, params = run.step, run.params
  model, tokenizer = build_model(run.model_config), run.dataset.tokenizer
  tokens = np.asarray(tokenizer.encode("abc")).tolist()
  for _ in range(7):
    logits = model.apply({"params": params}, np.asarray([tokens], np.int32))
    tokens.append(int(np.argmax(logits[0, -1])))
  assert step == 30 and samples == [f"step 30 sample: {tokenizer.decode(tokens)}"], samples
  assert not [t.name for t in threading.enumerate() if t.name.startswith("tfjax-sample")]


def _run_cli(args, cwd, timeout=120, **env_vars):
  # The compilation cache goes under the test's directory, not the user's ~/.cache.
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(cwd / "cache"), **env_vars)
  return subprocess.run([sys.executable, os.path.join(REPO, "experiments", "train.py"), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_console_script_trains_the_default_config_into_a_fresh_run_directory(tmp_path):
  """`tfjax-train` with no --config and no --workdir: configs/default.py into runs/default-<time>
  under the current directory (here shrunk by overrides to a few steps)."""
  script = shutil.which("tfjax-train", path=os.path.dirname(sys.executable))
  if script is None:
    pytest.skip("the tfjax-train console script is not installed here (pip install -e .)")
  env = dict(os.environ, TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run(
      [script, "--config.model.num_layers=1", "--config.model.d_model=32",
       "--config.model.d_ff=64", "--config.train.num_steps=2", "--config.train.eval_every=2",
       "--config.train.checkpoint_every=2", "--config.train.batch_size=8",
       "--config.train.eval_batch_size=8"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  [name] = os.listdir(tmp_path / "runs")
  assert re.fullmatch(r"default-\d{8}-\d{6}", name), name
  workdir = tmp_path / "runs" / name
  assert f"done: {os.path.join('runs', name)} " in run.stdout
  assert json.loads((workdir / "config.json").read_text())["data"]["name"] == "reverse"
  records = read_metrics(workdir)
  assert [m["step"] for m in records if "eval/exact_match@8" in m] == [0, 2]  # the reversal task
  assert [m["step"] for m in records if "train/loss" in m] == [2]
  assert os.listdir(workdir / "checkpoints") == ["2"]


@pytest.mark.parametrize("override,message", [
    ("--config.model.no_such_key=1", "no_such_key"),
    ("--config.model.position=fourier", "model.position='fourier' is invalid"),
    ("--config.model.num_heads=5", "not divisible by model.num_heads=5"),
    ("--config.optimizer.schedule=cos", "schedule"),
    ("--config.train.steps_per_call=0", "train.steps_per_call=0 must be a positive integer"),
    ("--config.train.cpu_fusion=fast", "train.cpu_fusion='fast' is invalid; choose one of"),
])
def test_cli_rejects_bad_config_without_making_a_workdir(tmp_path, override, message):
  workdir = tmp_path / "run"
  result = _run_cli([f"--workdir={workdir}", override], cwd=tmp_path)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert not workdir.exists()


@pytest.mark.parametrize("content,message", [("", "empty"), ("abc\n" * 5, "too short")])
def test_empty_or_short_text_file_is_a_clear_error(tmp_path, content, message):
  path = tmp_path / "tiny.txt"
  path.write_text(content)
  workdir = tmp_path / "run"
  result = _run_cli([f"--workdir={workdir}", "--config.data.name=text",
                     f"--config.data.path={path}", "--config.data.seq_len=64"], cwd=tmp_path)
  assert result.returncode == 2
  assert message in result.stderr.lower() and str(path) in result.stderr, result.stderr[-2000:]
  assert not workdir.exists()


def test_cli_loads_compiled_programs_from_the_persistent_cache(tmp_path):
  """A second run of the same config loads its programs from the cache (JAX logs the hit) and
  trains to the same losses; --compilation_cache=none writes no cache."""
  args = ["--config.train.num_steps=3", "--config.train.log_every=1", "--config.train.eval_every=3",
          "--config.model.num_layers=1", "--config.model.d_model=32",
          f"--compilation_cache={tmp_path / 'xla'}"]
  first = _run_cli([f"--workdir={tmp_path / 'a'}", *args], cwd=tmp_path)
  assert first.returncode == 0, first.stderr[-2000:]
  assert any(name.startswith("jit_train_step-") for name in os.listdir(tmp_path / "xla"))
  second = _run_cli([f"--workdir={tmp_path / 'b'}", *args], cwd=tmp_path, JAX_LOG_COMPILES="1")
  assert second.returncode == 0, second.stderr[-2000:]
  assert "Persistent compilation cache hit for 'jit_train_step'" in second.stderr, (
      second.stderr[-3000:])
  assert train_losses(str(tmp_path / "a")) == train_losses(str(tmp_path / "b"))
  off = _run_cli([f"--workdir={tmp_path / 'c'}", *args[:-1], "--compilation_cache=none"],
                 cwd=tmp_path)
  assert off.returncode == 0, off.stderr[-2000:]
  assert not (tmp_path / "cache").exists()  # 'none' does not fall back to the default either


def test_unusable_compilation_cache_directory_warns_and_leaves_jax_alone(tmp_path, caplog):
  from tfjax.training import compile_cache  # pylint: disable=import-outside-toplevel
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  before = jax.config.jax_compilation_cache_dir
  with caplog.at_level(logging.WARNING):
    assert compile_cache.enable(str(blocker / "xla")) is None
  assert "compilation cache disabled" in caplog.text and str(blocker) in caplog.text
  assert compile_cache.enable("none") is None
  assert jax.config.jax_compilation_cache_dir == before


def test_resuming_with_a_different_model_is_refused(tmp_path):
  config = tiny_config(num_steps=2)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config.model.d_model = 48
  with pytest.raises(ValueError, match="different model"):
    train.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


_WRITE_METRICS = """
import os, sys
from tfjax.training import metrics
writer = metrics.MetricsWriter(sys.argv[1], total_steps=10, progress=False)
writer.write(1, {"train/loss": 2.5})
writer.text(1, "sample", "To be")
writer.close()
print("torch imported by the writer:", "torch" in sys.modules)
import torch  # works as usual afterwards
print("torch imported afterwards:", torch.MARK)
"""


def test_tensorboard_writer_does_not_import_torch(tmp_path):
  """tensorboardX imports torch when it is installed (~1.3 s); the writer keeps it out. A stand-in
  `torch` package on the path takes the place of an installed one."""
  (tmp_path / "torch").mkdir()
  (tmp_path / "torch" / "__init__.py").write_text("Tensor = object\nMARK = 'stand-in'\n")
  workdir = tmp_path / "run"
  workdir.mkdir()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  out = subprocess.run([sys.executable, "-c", _WRITE_METRICS, str(workdir)], env=env, cwd=REPO,
                       check=True, capture_output=True, text=True).stdout
  assert "torch imported by the writer: False" in out
  assert "torch imported afterwards: stand-in" in out
  [events] = os.listdir(workdir / "tensorboard")
  data = (workdir / "tensorboard" / events).read_bytes()
  assert b"train/loss" in data and b"To be" in data
  assert json.loads((workdir / "metrics.jsonl").read_text()) == {"step": 1, "train/loss": 2.5}


_PROGRESS = """
import logging, sys
from tfjax.training import metrics
metrics.setup_logging()
if sys.argv[2] == "tty":
  sys.stderr.isatty = lambda: True
writer = metrics.MetricsWriter(sys.argv[1], total_steps=10)
writer.write(5, {"train/loss": 2.5})
writer.progress(5, loss=2.5, lr=1e-3, tokens_per_sec=12345.0)
writer.close()
"""


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_bar_on_a_terminal_and_plain_log_lines_otherwise(tmp_path, terminal):
  """On a terminal a tqdm bar shows step, loss, lr and tokens/s in place of the per-step log
  lines; elsewhere (a file, a pipe, a batch job) the log lines are written and no bar."""
  run = subprocess.run([sys.executable, "-c", _PROGRESS, str(tmp_path),
                        "tty" if terminal else "pipe"], cwd=REPO, check=True,
                       capture_output=True, text=True)
  bar = "5/10" in run.stderr and "loss=2.5000" in run.stderr and "lr=1.00e-03" in run.stderr
  assert bar == terminal, run.stderr
  assert ("tok_s=12,345" in run.stderr) == terminal
  assert ("step 5 train/loss=2.5" in run.stderr) != terminal, run.stderr
  assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 5, "train/loss": 2.5}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_checkpoint_and_exits(tmp_path, signum):
  workdir = tmp_path / "run"
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "experiments", "train.py"), f"--workdir={workdir}",
       "--config.train.num_steps=100000", "--config.train.log_every=1",
       "--config.train.eval_at_start=False", "--config.train.eval_every=100000",
       "--config.model.num_layers=1", "--config.model.d_model=32"],
      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
      time.sleep(0.5)
    assert metrics.exists(), "training never logged a step"
    proc.send_signal(signum)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  steps = [int(s) for s in os.listdir(workdir / "checkpoints")]
  assert len(steps) == 1 and steps[0] >= 1
  assert proc.returncode == 0


def test_checkpoint_of_another_optimizer_is_a_clear_error_and_left_untouched(tmp_path):
  # The model matches (config.json allows the resume), but the optimizer chain does not: the
  # checkpoint is readable, so it must not be mistaken for a corrupt one and moved aside.
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(tiny_config(num_steps=4), workdir)
  changed = tiny_config(num_steps=8)
  changed.optimizer.clip_norm = 0.0  # drops the clipping transform: the state tree changes
  with pytest.raises(ValueError, match="different model or optimizer state"):
    train.train_and_evaluate(changed, workdir)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["4"]
  assert not os.path.exists(os.path.join(workdir, "checkpoints_unreadable"))
  # The restore failed while the steps were compiling in the background: the failing run waited
  # for those compiles instead of leaving them running (and logging) into the caller's next work.
  assert not [t.name for t in threading.enumerate() if t.name.startswith("tfjax-compile")]


def test_run_saved_on_two_cpu_devices_restores_and_resumes_on_one(tmp_path):
  workdir = str(tmp_path / "run")
  overrides = [f"--config.{k}={v}" for k, v in (
      ("data.name", "copy"), ("model.d_model", 32), ("model.num_layers", 1),
      ("model.num_heads", 2), ("model.d_ff", 64), ("train.num_steps", 4),
      ("train.batch_size", 8), ("train.eval_batch_size", 8), ("train.eval_batches", 1),
      ("train.eval_every", 4), ("train.checkpoint_every", 4), ("train.log_every", 1),
      ("mesh.cpu_devices", 2))]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="",
             TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  run = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "train.py"),
                        f"--workdir={workdir}", *overrides], check=True, env=env, cwd=REPO,
                       capture_output=True, text=True)
  assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1} over 2 cpu devices" in run.stderr + run.stdout
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["mesh"]["cpu_devices"] == 2
  from tfjax.training import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)  # this process: 1 device
  config, step, params = run.config, run.step, run.params
  assert step == 4 and jax.device_count() == 1
  assert all(np.all(np.isfinite(p)) for p in jax.tree.leaves(params))
  config.train.num_steps = 6
  train.train_and_evaluate(config, workdir)  # resumes the 2-device run on 1 device
  assert sorted(train_losses(workdir)) == list(range(1, 7))
  assert not os.path.exists(os.path.join(workdir, "checkpoints_unreadable"))


_QUEUED_STEPS = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tfjax.training.runtime import HostLeadLimiter
mesh = Mesh(np.array(jax.devices()), ("data",))
replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

def step(w, x):  # data-parallel gradient step: one all-reduce
  loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
  return w - 0.01 * grad, loss

step = jax.jit(step, in_shardings=(replicated, rows), out_shardings=(replicated, replicated),
               donate_argnums=0)
w = jax.device_put(jnp.full((512, 512), 0.01), replicated)
x = jax.device_put(jnp.ones((64, 512)), rows)
host_lead = HostLeadLimiter()
for _ in range(600):
  w, loss = step(w, x)
  host_lead.wait_if_ahead(loss)
print("done", float(loss))
"""


def test_host_lead_limiter_keeps_two_cpu_devices_from_deadlocking():
  """Regression: with 2 XLA:CPU devices (jax 0.10.2), 25-75 steps queued without a host sync
  deadlock the all-reduce (XLA aborts after 40 s); this loop queues 600 unless limited."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  run = subprocess.run([sys.executable, "-c", _QUEUED_STEPS], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=240)
  assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


@pytest.mark.parametrize("per_call,program", [(1, "train_step"), (2, "multi_step")])
def test_steps_compile_once_in_background_and_serve_the_first_calls(tmp_path, caplog, per_call,
                                                                     program):
  """runtime.compiling_in_background compiles the train and eval steps from shapes alone while the
  state initializes; the first calls must reuse those programs (same shapes, shardings and axis
  rules), not compile second ones. Eval batches compile once per distinct shape."""
  config = tiny_config(num_steps=4, eval_at_start=True, steps_per_call=per_call, log_every=2)
  previous = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)
  try:
    with caplog.at_level(logging.WARNING):
      train.train_and_evaluate(config, str(tmp_path / "run"))
  finally:
    jax.config.update("jax_log_compiles", previous)
  messages = [r.getMessage() for r in caplog.records]
  compiles = [m for m in messages if "XLA compilation of jit(" in m and "_step)" in m
              and "eval_step" not in m]
  assert len(compiles) == 1 and f"jit({program})" in compiles[0], compiles
  eval_shapes = {tuple(sorted((k, np.shape(v)) for k, v in batch.items()))
                 for _, batch in experiment.prepare(config).dataset.eval_batches(
                     config.train.eval_batch_size, config.train.eval_batches)}
  eval_compiles = [m for m in messages if "XLA compilation of jit(eval_step)" in m]
  assert len(eval_compiles) == len(eval_shapes) >= 2, (eval_compiles, eval_shapes)
