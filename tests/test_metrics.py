"""tfjax/training/metrics.py: metrics.jsonl, TensorBoard events and progress output."""

import json
import os
import subprocess
import sys

import pytest

from run_helpers import REPO



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
