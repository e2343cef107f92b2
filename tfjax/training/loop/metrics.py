"""Run output: WORKDIR/metrics.jsonl, TensorBoard events, and a progress bar or plain log lines.

Only process 0 writes (multi-host runs call every method on every process).

History survives a killed run: every row is flushed to metrics.jsonl as it is written, and to
the event file within TB_FLUSH_S seconds. A run resumed from checkpoint step S logs the steps
after S again, so the rows a killed run wrote past S are superseded: they move from metrics.jsonl to
metrics_superseded.jsonl (kept, never deleted), leaving one row per (step, key), and the new
event file starts with TensorBoard's purge_step = S + 1, so TensorBoard drops the old events
past S and shows the whole history once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

import jax

from tfjax.runtime import files, workarounds

METRICS_FILE = "metrics.jsonl"
SUPERSEDED_FILE = "metrics_superseded.jsonl"
LOG_TEXT_LINES, LOG_TEXT_CHARS = 4, 400  # of a text (the run's sample) shown in the log
TB_FLUSH_S = 1  # at most this many seconds of TensorBoard events are lost to a kill -9

_log = logging.getLogger(__name__)


def setup_logging() -> None:
  """tfjax's own INFO lines on stderr; other libraries' (orbax logs every file it renames) only
  from WARNING up. Every entry point (train, sweep, benchmarks) calls this first."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)
  logger = logging.getLogger("tfjax")
  if not logger.handlers:
    handler = BarAwareHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False


class BarAwareHandler(logging.StreamHandler):
  """A StreamHandler that writes through tqdm while a progress bar is shown (MetricsWriter's, on a
  terminal): the bar is cleared, the line written from column 0, the bar drawn again below it. A
  plain write would land after the bar's text and the next redraw (a carriage return) would
  write over the line's time stamp."""

  def emit(self, record: logging.LogRecord) -> None:
    tqdm = sys.modules.get("tqdm")  # imported only where a bar was made
    if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
      super().emit(record)
      return
    try:
      tqdm.tqdm.write(self.format(record), file=self.stream)
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


class MetricsWriter:
  def __init__(self, workdir: str, total_steps: int, initial_step: int = 0,
               progress: bool | None = None, label: str = ""):
    """label: put before each of the writer's log lines (`seed 3: step 5 ...`), for writers that
    share one log (a packed group's seeds, tfjax/training/loop/packed.py)."""
    self.enabled = jax.process_index() == 0
    self._prefix = f"{label}: " if label else ""
    self._jsonl = self._tb = self._bar = None
    if not self.enabled:
      return
    path = os.path.join(workdir, METRICS_FILE)
    superseded = supersede_rows_after(path, initial_step)
    self._jsonl = open(path, "a", encoding="utf-8")
    try:
      # purge_step: TensorBoard drops the earlier files' events from this step on (the killed
      # segment past the restored step). A fresh run (no earlier events) needs none.
      purge = initial_step + 1 if initial_step > 0 or superseded else None
      # flush_secs: tensorboardX writes events from a queue on its own thread, and its flush()
      # does not wait for the queue, so the thread's periodic flush is what bounds a kill's loss.
      self._tb = workarounds.summary_writer_class()(os.path.join(workdir, "tensorboard"),
                                                    purge_step=purge, flush_secs=TB_FLUSH_S)
    except ImportError:  # pragma: no cover - tensorboardX is a dependency
      _log.warning("tensorboardX missing: no TensorBoard events")
    use_bar = sys.stderr.isatty() if progress is None else progress
    if use_bar:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True)

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    clean = {k: _to_python(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), **clean}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for key, value in clean.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
          self._tb.add_scalar(key, value, step)
      self._tb.flush()  # what the writer thread has taken from its queue (see TB_FLUSH_S)
    if self._bar is None:
      shown = " ".join(f"{k}={_fmt(v)}" for k, v in clean.items())
      _log.info("%sstep %d %s", self._prefix, step, shown)

  def progress(self, step: int, loss: float, lr: float, tokens_per_sec: float) -> None:
    if self._bar is not None:
      self._bar.n = step
      self._bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}",
                            refresh=False)
      self._bar.refresh()

  def text(self, step: int, tag: str, text: str) -> None:
    """A text (the run's sample): whole in metrics.jsonl and TensorBoard, one short line in the
    log (log_text)."""
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": int(step), tag: text}) + "\n")
    self._jsonl.flush()
    _log.info("%sstep %d %s: %s", self._prefix, step, tag, log_text(text))
    if self._tb is not None:
      self._tb.add_text(tag, text, step)
      self._tb.flush()

  def close(self) -> None:
    for handle in (self._bar, self._tb, self._jsonl):
      if handle is not None:
        handle.close()


def log_text(text: str, max_lines: int = LOG_TEXT_LINES,
             max_chars: int = LOG_TEXT_CHARS) -> str:
  """`text` as one log line: line breaks shown as \\n (an untrained model's sample can be dozens
  of blank lines), at most `max_lines` lines and `max_chars` characters, then how much was left
  out (the whole text is in metrics.jsonl)."""
  lines = text.replace("\r", "\\r").split("\n")
  shown = "\\n".join(lines[:max_lines])
  cut_lines = max(len(lines) - max_lines, 0)
  cut_chars = max(len(shown) - max_chars, 0)
  shown = shown[:max_chars]
  if cut_lines or cut_chars:
    left = f"{cut_lines} more lines" if cut_lines else f"{cut_chars} more characters"
    shown += f" [... {left}; the whole text is in {METRICS_FILE}]"
  return shown


def supersede_rows_after(path: str, step: int) -> int:
  """Moves the rows of metrics.jsonl `path` that a resumed run will write again (step > `step`;
  every row when `step` is 0, a fresh start) to metrics_superseded.jsonl beside it, so each
  (step, key) has one row. Returns how many rows moved. A row cut short by a kill is dropped."""
  if not os.path.exists(path):
    return 0
  kept, moved = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:  # the last line of a killed run, half written
        continue
      (kept if step > 0 and row.get("step", 0) <= step else moved).append(line.rstrip("\n"))
  if moved:
    with open(os.path.join(os.path.dirname(path), SUPERSEDED_FILE), "a", encoding="utf-8") as f:
      f.write("".join(line + "\n" for line in moved))
      f.flush()
      os.fsync(f.fileno())
    with files.replaced_atomically(path) as f:
      f.write("".join(line + "\n" for line in kept))
  return len(moved)


class Timer:
  """Wall-clock throughput between log events."""

  def __init__(self):
    self.reset()

  def reset(self):
    self.start, self.steps = time.perf_counter(), 0

  def rate(self, tokens_per_step: int) -> float:
    elapsed = max(time.perf_counter() - self.start, 1e-9)
    return self.steps * tokens_per_step / elapsed


def _to_python(value):
  if hasattr(value, "item"):
    value = value.item()
  return value


def _fmt(value):
  return f"{value:.4g}" if isinstance(value, float) else str(value)
