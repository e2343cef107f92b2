"""tfjax/training/loop/metrics.py: metrics.jsonl, TensorBoard events and progress output."""

import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from run_helpers import REPO



_WRITE_METRICS = """
import os, sys
from tfjax.training.loop import metrics
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
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 1, "train/loss": 2.5}, {"step": 1, "sample": "To be"}]


def test_a_sample_is_one_short_log_line_and_whole_in_metrics_jsonl(tmp_path, caplog):
  """An untrained model's sample can be dozens of blank lines: the log shows line breaks as \\n,
  at most LOG_TEXT_LINES lines, and says where the rest is; metrics.jsonl keeps every character."""
  from tfjax.training.loop import metrics  # pylint: disable=import-outside-toplevel
  sample = "\nFirst Citizen:\nBefore we proceed" + "\n" * 64 + "end"
  writer = metrics.MetricsWriter(str(tmp_path), total_steps=10, progress=False)
  with caplog.at_level(logging.INFO, logger="tfjax"):
    writer.text(0, "sample", sample)
  writer.close()
  [message] = [r.getMessage() for r in caplog.records]
  # 67 lines: "", "First Citizen:", "Before we proceed", 63 empty ones, "end"; 4 shown.
  assert "\n" not in message
  assert message == ("step 0 sample: \\nFirst Citizen:\\nBefore we proceed\\n [... 63 more lines; "
                     "the whole text is in metrics.jsonl]")
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": 0, "sample": sample}]


def test_log_text_caps_lines_and_characters():
  from tfjax.training.loop.metrics import log_text  # pylint: disable=import-outside-toplevel
  assert log_text("To be, or not") == "To be, or not"  # one line: as it is
  assert log_text("a\r\nb", max_lines=2) == "a\\r\\nb"
  assert log_text("\n" * 3, max_lines=2) == ("\\n [... 2 more lines; the whole text is in "
                                             "metrics.jsonl]")
  assert log_text("x" * 30, max_chars=10) == ("x" * 10 + " [... 20 more characters; the whole "
                                              "text is in metrics.jsonl]")


_PROGRESS = """
import logging, sys
from tfjax.training.loop import metrics
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


def read_events(path):
  """[(step, tag or None, value or None, is a purge marker)] of one TensorBoard event file, read
  with the TFRecord framing (8-byte length, 4-byte CRC, data, 4-byte CRC) and the Event proto."""
  import struct  # pylint: disable=import-outside-toplevel
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out = []
  with open(path, "rb") as f:
    while header := f.read(12):
      (length,) = struct.unpack("<Q", header[:8])
      event = event_pb2.Event.FromString(f.read(length))
      f.read(4)
      if event.HasField("summary"):
        out += [(event.step, v.tag, v.simple_value, False) for v in event.summary.value]
      elif event.HasField("session_log"):
        out.append((event.step, None, None, True))
  return out


def tensorboard_history(workdir):
  """{(tag, step): value} as TensorBoard shows it: files in order, each purge marker dropping the
  earlier events at or past its step."""
  shown = {}
  event_dir = os.path.join(workdir, "tensorboard")
  for name in sorted(os.listdir(event_dir), key=lambda n: (n.split(".")[3], n)):
    for step, tag, value, purge in read_events(os.path.join(event_dir, name)):
      if purge:
        shown = {k: v for k, v in shown.items() if k[1] < step}
      else:
        shown[(tag, step)] = value
  return shown


def test_a_resume_supersedes_the_killed_segment_in_metrics_and_tensorboard(tmp_path):
  from tfjax.training.loop import metrics  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path)
  first = metrics.MetricsWriter(workdir, total_steps=8, progress=False)
  for step in range(1, 7):  # the checkpoint was at step 4; then a kill -9 after step 6 ...
    first.write(step, {"train/loss": 10.0 + step})
  # ... so nothing is closed: what a kill leaves is on disk within TB_FLUSH_S seconds
  event_dir = os.path.join(workdir, "tensorboard")
  (event_file,) = [os.path.join(event_dir, n) for n in os.listdir(event_dir)]
  deadline = time.time() + 10 * metrics.TB_FLUSH_S
  while time.time() < deadline and len(read_events(event_file)) < 6:
    time.sleep(0.05)
  assert [s for s, tag, _, _ in read_events(event_file) if tag == "train/loss"] == [1, 2, 3, 4, 5, 6]
  # A real resume is a new process, seconds later. Event files are named by the whole second
  # they were opened in, so a writer opened in the same second would reuse the killed one's
  # file name (a flake of this test on a fast machine): open it in the next second.
  time.sleep(1.0 - time.time() % 1.0 + 0.01)
  resumed = metrics.MetricsWriter(workdir, total_steps=8, initial_step=4, progress=False)
  for step in range(5, 9):
    resumed.write(step, {"train/loss": 20.0 + step})
  resumed.close()
  first.close()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [(r["step"], r["train/loss"]) for r in rows] == (
      [(s, 10.0 + s) for s in range(1, 5)] + [(s, 20.0 + s) for s in range(5, 9)])
  with open(os.path.join(workdir, metrics.SUPERSEDED_FILE)) as f:
    assert [json.loads(line)["step"] for line in f] == [5, 6]  # kept, not lost
  shown = tensorboard_history(workdir)
  assert shown == {("train/loss", s): 10.0 + s if s <= 4 else 20.0 + s for s in range(1, 9)}


@pytest.mark.slow  # five runs of the train command (~90 s on 2 cores)
def test_three_kill_9_and_a_resume_give_the_uninterrupted_runs_history(tmp_path):
  import signal  # pylint: disable=import-outside-toplevel
  from run_helpers import run_cli  # pylint: disable=import-outside-toplevel
  flags = ["--config.train.num_steps=60", "--config.train.checkpoint_every=10",
           "--config.train.log_every=2", "--config.train.eval_every=10",
           "--config.model.num_layers=1", "--config.model.d_model=32",
           "--config.train.steps_per_call=1", "--config.mesh.cpu_devices=1"]
  reference = tmp_path / "reference"
  done = run_cli([f"--workdir={reference}", *flags], tmp_path, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  killed = tmp_path / "killed"
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(tmp_path / "cache"))
  for past_step in (14, 30, 46):  # each kill lands after a checkpoint, mid-segment
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "experiments", "train.py"),
                             f"--workdir={killed}", *flags], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    try:
      while time.time() < deadline:
        rows = _rows(killed / "metrics.jsonl")
        if rows and rows[-1]["step"] >= past_step:
          break
        time.sleep(0.05)
      proc.send_signal(signal.SIGKILL)
      proc.wait()
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  resumed = run_cli([f"--workdir={killed}", *flags], tmp_path, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  want, got = _rows(reference / "metrics.jsonl"), _rows(killed / "metrics.jsonl")
  assert [(r["step"], sorted(r)) for r in got] == [(r["step"], sorted(r)) for r in want]
  for a, b in zip(got, want):  # the same numbers, timings aside
    assert {k: v for k, v in a.items() if "per_sec" not in k} == {
        k: v for k, v in b.items() if "per_sec" not in k}
  shown = tensorboard_history(str(killed))
  # TensorBoard tags keep [-/\w.] only (tensorboardX writes eval/loss@8 as eval/loss_8)
  logged = {(re.sub(r"[^-/\w\.]", "_", k), r["step"]) for r in want for k in r if k != "step"}
  assert {key for key in shown if key in logged} == logged


def _rows(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


_BAR_AND_LOG = """
import logging, sys
from tfjax.training.loop import metrics
metrics.setup_logging()
log = logging.getLogger("tfjax.test")
writer = metrics.MetricsWriter(sys.argv[1], total_steps=10)  # stderr is a terminal: a bar
for step in range(1, 4):
  writer.progress(step, 2.5 / step, 1e-3, 1000.0)
  log.info("eval at step %d", step)
writer.close()
"""


def _rendered(raw: str) -> list:
  """The lines a terminal shows for `raw`: a carriage return goes back to column 0, later text
  writes over earlier text, a line feed starts the next line; escape sequences dropped."""
  raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
  lines, line, col = [], [], 0
  for ch in raw:
    if ch == "\n":
      lines.append("".join(line))
      line, col = [], 0
    elif ch == "\r":
      col = 0
    else:
      line[col:col + 1] = [ch]
      col += 1
  return lines + ["".join(line)]


def test_log_lines_keep_their_time_stamps_beside_the_progress_bar(tmp_path):
  """On a terminal the tqdm bar and the log share stderr: each log line starts at column 0 with
  its time stamp, the bar is drawn below it. (A plain write landed after the bar's text, and the
  bar's next carriage-return redraw wrote over the time stamp.)"""
  import pty  # pylint: disable=import-outside-toplevel
  import fcntl, struct, termios  # pylint: disable=import-outside-toplevel,multiple-imports
  controller, terminal = pty.openpty()
  fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100
  child = subprocess.Popen([sys.executable, "-c", _BAR_AND_LOG, str(tmp_path)], cwd=REPO,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal,
                           env=dict(os.environ, PYTHONPATH=REPO))
  os.close(terminal)
  chunks = []
  while True:
    try:
      chunk = os.read(controller, 4096)
    except OSError:  # the child closed the terminal
      break
    if not chunk:
      break
    chunks.append(chunk)
  os.close(controller)
  assert child.wait(timeout=60) == 0
  shown = _rendered(b"".join(chunks).decode("utf-8", "replace"))
  logged = [line for line in shown if "eval at step" in line]
  assert len(logged) == 3, shown
  for step, line in enumerate(logged, 1):
    assert re.fullmatch(rf"\d\d:\d\d:\d\d eval at step {step}\s*", line), shown
  assert any("it/s" in line or "/10" in line for line in shown), shown  # the bar was drawn
