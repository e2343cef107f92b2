"""Every entry point on a user's mistake (tfjax/training/entry/cli.py): one `error:` line naming the
key/value/file, exit status 2, no traceback, and no file created or changed.

Each case runs the real command in a child process (they fail before training, well under a
second of CPU each) from a scratch directory whose whole file tree is compared before and after.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tfjax.training.entry import cli
from tfjax.runtime.workdir_lock import WorkdirLock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = [os.path.join(REPO, "experiments", "train.py")]
GENERATE = [os.path.join(REPO, "experiments", "generate.py")]
SWEEP = [os.path.join(REPO, "experiments", "sweep.py")]
PARAMS = ["-m", "tfjax.params"]
BENCH_TRAIN = [os.path.join(REPO, "experiments", "bench_train.py")]
BENCH_DECODE = [os.path.join(REPO, "experiments", "bench_decode.py")]
EVAL_LENGTH = [os.path.join(REPO, "experiments", "eval_length.py")]
TRAIN_MODALITY = [os.path.join(REPO, "experiments", "train_modality.py")]
HF = ["-m", "tfjax.hf"]
DEFAULT = f"--config={REPO}/configs/default.py"

# (id, command, arguments ({w}: the scratch directory), regex the error line must match)
CASES = [
    ("train-wrong-type", TRAIN, ["--config.model.num_layers=abc"],
     r"--config\.model\.num_layers=abc: invalid literal for int\(\)"),
    ("train-unknown-key", TRAIN, ["--config.modle.x=1"],
     r"--config\.modle\.x=1: unknown config key modle; did you mean \"model\""),
    ("train-unknown-nested-key", TRAIN, ["--config.model.nm_layers=2"],
     r"--config\.model\.nm_layers=2: unknown config key model\.nm_layers; did you mean "
     r"\"num_layers\""),
    ("train-unknown-flag", TRAIN, ["--wrokdir={w}/run"], r"Unknown command line flag 'wrokdir'"),
    ("train-missing-config-file", TRAIN, ["--config=configs/nope.py", "--workdir={w}/run"],
     r"--config=configs/nope\.py: no such config file 'configs/nope\.py'"),
    ("train-bad-config-arg", TRAIN, [f"--config={REPO}/configs/shakespeare_char.py:gpu"],
     r"the config file failed: ValueError: .*takes no argument or 'cpu', got 'gpu'"),
    ("train-bad-value", TRAIN, ["--config.model.position=foo", "--workdir={w}/run"],
     r"model\.position='foo' is invalid; choose one of"),
    ("train-bad-combination", TRAIN, ["--config.train.batch_size=6",
                                      "--config.optimizer.grad_accum_steps=4", "--workdir={w}/run"],
     r"train\.batch_size=6 does not divide into optimizer\.grad_accum_steps=4"),
    ("train-path-for-another-dataset", TRAIN, ["--config.data.path=/nonexistent",
                                               "--workdir={w}/run"],
     r"data\.path='/nonexistent' is read only by data\.name='text'"),
    ("train-missing-text-file", TRAIN, ["--config.data.name=text", "--config.data.path=/nonexistent",
                                        "--config.data.tokenizer=byte", "--workdir={w}/run"],
     r"data\.path='/nonexistent': no such text file"),
    ("train-run-of-another-model", TRAIN, ["--workdir={w}/other_model"],
     r"holds a run with a different model or task"),
    ("train-workdir-in-use", TRAIN, ["--workdir={w}/locked"],
     r"locked is being trained by process \d+ on host"),
    ("generate-no-workdir", GENERATE, ["--workdir={w}/nowhere"],
     r"--workdir=.*nowhere: no such directory"),
    ("generate-not-a-run", GENERATE, ["--workdir={w}"], r"has no config\.json: not a tfjax training"),
    ("sweep-missing-file", SWEEP, ["--config=nope.py", "--workdir={w}/sweep"], r"nope\.py"),
    ("sweep-pack-seeds-1", SWEEP, [f"--config={REPO}/configs/ablations/ffn.py",
                                   "--workdir={w}/sweep", "--pack_seeds=1"],
     r"--pack_seeds=1: a group of one seed packs nothing"),  # was silently off
    ("params-bad-mesh", PARAMS, [DEFAULT, "--mesh=1,x"],
     r"--mesh='1,x': give three or four positive"),
    ("bench-train-missing-config", BENCH_TRAIN, ["--config=configs/nope.py"],
     r"no such config file 'configs/nope\.py'"),
    ("bench-decode-unknown-flag", BENCH_DECODE, ["--bogus"], r"unrecognized arguments: --bogus"),
    ("eval-length-not-a-run", EVAL_LENGTH, ["--workdir={w}"], r"has no config\.json"),
    # issue 60: each message names the fix that works
    ("train-bare-config-key-flag", TRAIN, ["--num_steps=10", "--workdir={w}/run"],
     r"Unknown command line flag 'num_steps'; did you mean --config\.train\.num_steps=10\?"),
    ("train-misspelled-choice", TRAIN, ["--config.model.attention_kind=perfomer",
                                        "--workdir={w}/run"],
     r"model\.attention_kind='perfomer' is invalid; choose one of .*; did you mean 'performer'\?"),
    ("modality-unknown-key", TRAIN_MODALITY, [f"--config={REPO}/configs/vit_synthetic.py:test",
                                              "--config.model.attention_kind=performer",
                                              "--workdir={w}/run"],
     r"--config\.model\.attention_kind=performer: unknown config key model\.attention_kind; "
     r"did you mean \"attention_impl\""),  # ViT's config.model (base_config('vit')) has one
    ("modality-classes-mismatch", TRAIN_MODALITY, [
        f"--config={REPO}/configs/vit_synthetic.py:test", "--config.data.classes=3",
        "--workdir={w}/run"], r"config\.model\.num_classes=4 differs from "
                              r"config\.data\.classes=3; set them equal"),
    ("generate-modality-run", GENERATE, ["--workdir={w}/vit"],
     r"vit is a 'vit' run of the removed modality loop .*experiments/train\.py "
     r"--config=configs/vit_synthetic\.py"),
    ("hf-missing-dir", HF, ["import", "--hf_dir={w}/missing", "--workdir={w}/run"],
     r"missing does not exist"),
    ("hf-bad-choice", HF, ["import", "--hf_dir={w}/missing", "--workdir={w}/run",
                           "--dtype=float16"],
     r"argument --dtype: invalid choice: 'float16'"),
]


def snapshot(root):
  """{path: (size, mtime_ns)} of every file and directory under root."""
  out = {}
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(directory, name)
      stat = os.stat(path)
      out[os.path.relpath(path, root)] = (stat.st_size if name in files else 0, stat.st_mtime_ns)
  return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
  """A directory with a run of another model (its config.json only) and a workdir in use."""
  root = tmp_path_factory.mktemp("cli")
  other = root / "other_model"
  other.mkdir()
  (other / "config.json").write_text(json.dumps({"task": "lm", "model": {"d_model": 8}}))
  (root / "vit").mkdir()  # the config.json of a run of the removed modality loop
  (root / "vit" / "config.json").write_text(json.dumps(
      {"task": "vit", "data": {"classes": 4}, "model": {"d_model": 8},
       "train": {"learning_rate": 3e-3}}))
  lock = WorkdirLock(str(root / "locked"), heartbeat_s=1e6)  # held by this (live) process
  lock.acquire()
  yield root
  lock.release()


@pytest.mark.parametrize("command,args,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_mistake_ends_in_one_error_line(scratch, command, args, pattern):
  before = snapshot(scratch)
  result = subprocess.run(
      [sys.executable, *command, *(a.format(w=scratch) for a in args)], cwd=scratch,
      capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == cli.USAGE_ERROR, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, result.stderr
  assert re.search(pattern, errors[0]), errors[0]
  assert result.stderr.rstrip().splitlines()[-1] == errors[0]  # nothing after it
  assert snapshot(scratch) == before  # nothing created or changed


def test_an_internal_bug_keeps_its_traceback(capsys):
  @cli.guarded
  def buggy():
    raise TypeError("a bug")
  with pytest.raises(TypeError):
    buggy()

  @cli.guarded
  def user_error():
    raise ValueError("train.num_steps=0 must be a positive integer\n(fix it)")
  with pytest.raises(SystemExit) as info:
    user_error()
  assert info.value.code == 2
  assert capsys.readouterr().err == "error: train.num_steps=0 must be a positive integer (fix it)\n"


@pytest.mark.parametrize("command", [TRAIN, GENERATE, SWEEP, PARAMS], ids=["train", "generate",
                                                                          "sweep", "params"])
def test_help_lists_each_flag_on_one_line(command):
  result = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
  assert result.returncode == 0, result.stderr
  flag_lines = [l for l in result.stdout.splitlines() if l.lstrip().startswith("--")]
  expected = {"train": ["--config", "--workdir", "--compilation_cache"],
              "generate": ["--workdir", "--prompt", "--max_new_tokens", "--strategy"],
              "sweep": ["--config", "--workdir", "--parallel", "--launcher"],
              "params": ["--config", "--mesh", "--seq_len"]}[
                  "train" if command is TRAIN else "generate" if command is GENERATE
                  else "sweep" if command is SWEEP else "params"]
  for flag in expected:
    lines = [l for l in flag_lines if re.match(rf"\s*{flag}\b", l)]
    assert len(lines) == 1, (flag, result.stdout)
    assert len(lines[0].split(flag, 1)[1].strip()) > 5  # the line carries the flag's help
