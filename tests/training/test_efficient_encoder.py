"""configs/efficient_encoder.py: the documented command (docs/attention/README.md, its smoke run)
trains each encoder-only attention kind: longformer, bigbird and linformer."""

import math
import os
import re
import shlex
import subprocess
import sys

from run_helpers import REPO, read_metrics

KINDS = ("longformer", "bigbird", "linformer")


def documented_smoke_command() -> list:
  """The smoke-run command of docs/attention/README.md, as written (its arguments)."""
  with open(os.path.join(REPO, "docs", "attention", "README.md"), encoding="utf-8") as f:
    text = f.read()
  [line] = [l for l in text.splitlines()
            if l.startswith("python experiments/train.py --config=configs/efficient_encoder.py:")
            and "num_steps" in l]
  return shlex.split(line)


def test_the_documented_command_trains_each_encoder_only_kind(tmp_path):
  args = documented_smoke_command()
  assert args[:2] == ["python", "experiments/train.py"]
  documented_kind = re.search(r"efficient_encoder\.py:(\w+)", " ".join(args)).group(1)
  assert documented_kind in KINDS
  procs = {}
  for kind in KINDS:  # the documented line, with each kind and a workdir of the test's
    line = [a.replace(f"efficient_encoder.py:{documented_kind}", f"efficient_encoder.py:{kind}")
            for a in args[2:] if not a.startswith("--workdir=")]
    workdir = tmp_path / kind
    procs[kind] = (workdir, subprocess.Popen(
        [sys.executable, os.path.join(REPO, "experiments", "train.py"), *line,
         f"--workdir={workdir}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, TFJAX_CACHE_DIR=str(tmp_path / "cache"))))
  for kind, (workdir, proc) in procs.items():
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1].startswith(f"done: {workdir}"), out
    rows = read_metrics(str(workdir))
    train = [r["train/loss"] for r in rows if "train/loss" in r]
    evals = {r["step"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    assert len(train) == 6 and all(math.isfinite(x) for x in train), (kind, train)
    assert sorted(evals) == [0, 6], (kind, evals)
    assert evals[6] < evals[0], (kind, evals)  # it learned something in 6 steps
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      assert f'"attention_kind": "{kind}"' in f.read()
