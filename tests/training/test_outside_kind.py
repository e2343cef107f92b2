"""An attention kind defined outside the package, used the documented way (docs/attention/README.md,
"A kind from a file of your own"): examples/sigmoid_attention.py on PYTHONPATH and
--import=sigmoid_attention. Trains, resumes without --import (config.json records it), generates
and counts parameters, runs as a sweep's child process; the unknown-key and failed-import
messages name the fix. Each command is the real entry point in a child process."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import run_helpers

REPO = run_helpers.REPO
EXAMPLES = os.path.join(REPO, "examples")
# A 1-layer decoder on the synthetic copy task (run_helpers.tiny_config): compiles in seconds.
TINY_CONFIG = '''
from tfjax.training.config.defaults import base_config

def get_config(arg=None):
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(8,),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=32, num_layers=1, num_heads=2,
                      d_ff=64, position="rope", max_len=64)
  config.optimizer.update(lr=3e-3, warmup_steps=2, min_lr=1e-4)
  config.train.update(num_steps=4, batch_size=8, eval_batch_size=8, eval_batches=1, eval_every=4,
                      log_every=1, checkpoint_every=4, eval_at_start=False)
  return config
'''
SWEEP_CONFIG = TINY_CONFIG + '''

def get_sweep(scale=None):
  return [{"model.attention_kind": "sigmoid"}]
'''


def _env(tmp, with_examples=True):
  path = [EXAMPLES] if with_examples else []
  path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [REPO]
  return dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp / "cache"),
              PYTHONPATH=os.pathsep.join(path))


def _run(args, tmp, with_examples=True, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=tmp, capture_output=True, text=True,
                        timeout=timeout, env=_env(tmp, with_examples))


def _train(args, tmp, **kwargs):
  return _run([os.path.join(REPO, "experiments", "train.py"), *args], tmp, **kwargs)


def _config_json(workdir):
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("outside_kind")
  (tmp / "tiny.py").write_text(TINY_CONFIG)
  (tmp / "sweep_tiny.py").write_text(SWEEP_CONFIG)
  return tmp


@pytest.fixture(scope="module")
def trained(scratch):
  """4 steps of the sigmoid kind, trained with --import=sigmoid_attention."""
  workdir = scratch / "sigmoid_run"
  result = _train(["--import=sigmoid_attention", f"--config={scratch}/tiny.py",
                   "--config.model.attention_kind=sigmoid", f"--workdir={workdir}"], scratch)
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


def test_training_records_the_import_in_config_json(trained):
  config = _config_json(trained)
  assert config["imports"] == ["sigmoid_attention"]
  assert config["model"]["attention_kind"] == "sigmoid"
  assert config["model"]["sigmoid_bias"] is None  # the kind's own key, at its default
  assert max(m["step"] for m in run_helpers.read_metrics(trained)) == 4


def test_resume_imports_what_the_run_records(trained, scratch):
  workdir = scratch / "resumed"
  shutil.copytree(trained, workdir)
  result = _train([f"--config={scratch}/tiny.py", "--config.model.attention_kind=sigmoid",
                   "--config.train.num_steps=6", f"--workdir={workdir}"], scratch)
  assert result.returncode == 0, result.stderr[-3000:]
  steps = [m["step"] for m in run_helpers.read_metrics(workdir) if "train/loss" in m]
  assert steps[-2:] == [5, 6]  # went on from the checkpoint at step 4
  assert _config_json(workdir)["imports"] == ["sigmoid_attention"]


def test_generate_on_the_run_needs_no_import_flag(trained, scratch):
  result = _run([os.path.join(REPO, "experiments", "generate.py"), f"--workdir={trained}",
                 "--prompt_ids=3 4 5", "--max_new_tokens=4"], scratch)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith("--- 0 | checkpoint step 4 | log-prob ")


def test_params_counts_the_kind_with_import(scratch):
  args = ["-m", "tfjax.params", f"--config={scratch}/tiny.py"]
  softmax = _run(args, scratch)
  sigmoid = _run([*args, "--import=sigmoid_attention", "--config.model.attention_kind=sigmoid",
                  "--config.model.sigmoid_bias=-2"], scratch)
  assert softmax.returncode == 0 and sigmoid.returncode == 0, sigmoid.stderr[-3000:]
  # sigmoid attention has no parameters beyond the projections: softmax's total
  assert sigmoid.stdout.splitlines()[-1] == softmax.stdout.splitlines()[-1]
  assert sigmoid.stdout.splitlines()[-1].startswith("total: ")


def test_a_sweep_child_process_imports_it_again(scratch):
  root = scratch / "sweep"
  result = _run([os.path.join(REPO, "experiments", "sweep.py"), "--import=sigmoid_attention",
                 f"--config={scratch}/sweep_tiny.py", f"--workdir={root}", "--parallel=2"],
                scratch)
  [point] = [d for d in os.listdir(root) if os.path.isdir(root / d) and not d.startswith(".")]
  log = (root / point / "sweep.log").read_text()
  assert result.returncode == 0, result.stderr[-2000:] + log[-2000:]
  assert "start attention_kind=sigmoid" in result.stdout + result.stderr  # by a child process (sweep_children)
  config = _config_json(root / point)
  assert config["imports"] == ["sigmoid_attention"] and config["model"]["attention_kind"] == (
      "sigmoid")


def test_the_kinds_key_without_its_import_is_an_unknown_config_key(scratch):
  result = _train([f"--config={scratch}/tiny.py", "--config.model.sigmoid_bias=1",
                   f"--workdir={scratch}/never"], scratch)
  assert result.returncode == 2 and not os.path.exists(scratch / "never")
  [line] = result.stderr.strip().splitlines()
  assert line.startswith("error: --config.model.sigmoid_bias=1: unknown config key "
                         "model.sigmoid_bias (a key of a kind or position defined outside tfjax "
                         "is known once its module is imported: --import=MODULE)"), line


def test_a_run_whose_config_json_has_the_key_but_no_import_names_the_fix(trained, scratch):
  workdir = scratch / "no_record"
  shutil.copytree(trained, workdir)
  config = _config_json(workdir)
  del config["imports"]  # as a run trained through a config file that imported the kind itself
  (workdir / "config.json").write_text(json.dumps(config))
  generate = [os.path.join(REPO, "experiments", "generate.py"), f"--workdir={workdir}",
              "--prompt_ids=3 4", "--max_new_tokens=2"]
  result = _run(generate, scratch)
  [line] = result.stderr.strip().splitlines()
  assert result.returncode == 2
  assert line.startswith(f"error: unknown config key model.sigmoid_bias in {workdir}/config.json: "
                         "a key of a kind or position defined outside tfjax is known once its "
                         "module is imported: --import=MODULE (the run records none"), line
  assert "unknown to this version" not in line
  assert _run([*generate, "--import=sigmoid_attention"], scratch).returncode == 0


def test_a_recorded_module_that_is_gone_names_it_and_the_fix(trained, scratch):
  result = _run([os.path.join(REPO, "experiments", "generate.py"), f"--workdir={trained}",
                 "--prompt_ids=3"], scratch, with_examples=False)
  assert result.returncode == 2
  [line] = result.stderr.strip().splitlines()
  assert line.startswith(f"error: {trained}/config.json records --import=sigmoid_attention: no "
                         "module named 'sigmoid_attention'"), line
  assert "PYTHONPATH" in line


def documented_commands() -> list:
  """The commands of docs/attention/README.md's "A kind from a file of your own" bash block."""
  with open(os.path.join(REPO, "docs", "attention", "README.md"), encoding="utf-8") as f:
    section = f.read().split("## A kind from a file of your own", 1)[1]
  block = section.split("```bash\n", 1)[1].split("```", 1)[0]
  return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()
          if line.startswith("python ")]


def test_the_documented_commands_train_resume_generate_and_count(tmp_path):
  """train, resume, generate and params as docs/attention/README.md writes them (a 1-layer model
  and 2 + 1 steps appended), from a directory laid out like the repository."""
  for name in ("configs", "experiments", "examples"):
    os.symlink(os.path.join(REPO, name), tmp_path / name)
  commands = documented_commands()
  train, resume, generate, params = commands[:4]
  assert "--import=sigmoid_attention" in train and "--import" not in resume + generate
  assert generate.startswith("python experiments/generate.py --workdir=runs/sigmoid")
  small = ["--config.model.num_layers=1", "--config.train.eval_at_start=False",
           "--config.train.eval_every=2", "--config.train.checkpoint_every=2"]
  env = dict(_env(tmp_path, with_examples=False),
             PYTHONPATH=os.pathsep.join([str(tmp_path / "examples"), REPO]))  # export PYTHONPATH
  for command, extra in ((train, small + ["--config.train.num_steps=2"]),
                         (resume, small + ["--config.train.num_steps=3"]), (generate, []),
                         (params, [])):
    args = shlex.split(command)
    result = subprocess.run([sys.executable, *args[1:], *extra], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (command, result.stderr[-3000:])
  assert result.stdout.splitlines()[-1].startswith("total: ")
  steps = [m["step"] for m in run_helpers.read_metrics(tmp_path / "runs" / "sigmoid")
           if "train/loss" in m]
  assert steps[-1] == 3 and _config_json(tmp_path / "runs" / "sigmoid")["imports"] == [
      "sigmoid_attention"]
