"""A run whose loss or gradient norm stops being finite: named exactly, never checkpointed.

The train step (steps.make_train_step) never applies a non-finite update: when the loss or the
global gradient norm is NaN/inf, params and optimizer state stay as they were and the step
reports `train/nonfinite_steps` = 1. The loop (train.py) then either

* stops (default): writes `{"step": N, "train/diverged": 1}` to metrics.jsonl and raises
  `Diverged` naming step N; no checkpoint is written after it, so the newest checkpoint is the
  last one written before, with finite values. The flags stay on the device between the loop's
  sync points (a log, eval or checkpoint step, the end: NonfiniteWatch), so the host never
  waits on a step to check it; the stop comes at the first sync point after step N; or
* with `train.skip_nonfinite=True`, goes on with the next batch (the update was skipped) and
  counts the skipped steps in `train/skipped_steps`.

`Checkpointer.save` also refuses a state holding a non-finite value (`nonfinite_leaves`), so no
path writes one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training.entry import cli
from tfjax.training.checkpointing.trees import path_names

EXIT_DIVERGED = 4  # exit status of a diverged run (2: a user's mistake, 3: an interrupted sweep
# point, 5: a checkpoint that could not be written, 128 + N: stopped by signal N)


class Diverged(cli.UserFacing):
  """Training stopped because the loss or gradient norm of step `step` is not finite."""
  status = EXIT_DIVERGED

  def __init__(self, step: int, last_checkpoint: int | None, lr: float | None = None,
               restored_step: int | None = None, *, lr_key: str = "optimizer.lr",
               scheduled_lr: float | None = None):
    """`lr`: the configured value of `lr_key` (the key the user lowers: `lr_setting`), not the
    warmup- or decay-scaled rate of the step, which is `scheduled_lr`."""
    self.step = step
    kept = (f"the newest checkpoint (step {last_checkpoint}) is from before it and is kept"
            if last_checkpoint is not None else "no checkpoint was written")
    if restored_step is not None:
      # The first step after a restore: the restored values, not the learning rate, are suspect.
      super().__init__(
          f"training diverged at step {step}, the first step after restoring checkpoint step "
          f"{restored_step}: the loss or gradient norm is NaN/inf, so that checkpoint is "
          "suspect (its values may be corrupt although its files verify). Move "
          f"checkpoints/{restored_step} out of the workdir to resume from the step before it")
      return
    notes = ([f"set to {lr:g}"] if lr is not None else []) + (
        [f"the schedule's rate at step {step} was {scheduled_lr:g}"]
        if scheduled_lr is not None else [])
    lr_text = f" ({'; '.join(notes)})" if notes else ""
    super().__init__(
        f"training diverged at step {step}: the loss or gradient norm is NaN/inf; {kept}. Lower "
        f"{lr_key}{lr_text} or raise optimizer.warmup_steps, or set "
        "train.skip_nonfinite=True to skip such updates")


def lr_setting(optimizer_cfg) -> tuple[str, float]:
  """(key, configured value) of the learning rate a diverged run lowers: optimizer.lr, or
  optimizer.lr_scale for the rsqrt schedule (which ignores optimizer.lr)."""
  if optimizer_cfg.get("schedule") == "rsqrt":
    return "optimizer.lr_scale", float(optimizer_cfg.lr_scale)
  return "optimizer.lr", float(optimizer_cfg.lr)


def nonfinite_leaves(tree: Any, limit: int = 3) -> list[str]:
  """Names of (up to `limit`) floating-point leaves of `tree` holding a NaN or inf, read from this
  process's shards (each process checks what it writes)."""
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not hasattr(leaf, "dtype") or not np.issubdtype(np.dtype(leaf.dtype), np.inexact):
      continue
    shards = ([s.data for s in leaf.addressable_shards] if isinstance(leaf, jax.Array)
              else [leaf])
    if not all(np.isfinite(np.asarray(s)).all() for s in shards):
      bad.append(".".join(path_names(path)) if path else "<root>")
      if len(bad) >= limit:
        break
  return bad


@jax.jit
def _note_nonfinite(count, first, call_count, call_first):
  """(steps so far with a non-finite loss or grad norm, the first such step or -1), updated with
  one call's flags: one small device program per call, nothing read back."""
  return count + call_count, jnp.where(first >= 0, first, call_first)


class NonfiniteWatch:
  """The non-finite steps of a run, kept on the device: `add` each call's flags (steps.NONFINITE,
  steps.FIRST_NONFINITE) without waiting; `first_bad()` reads the first bad step back (one host
  read, at a sync point: it waits for the calls added so far); `count` is the device scalar of
  how many there were (train/skipped_steps)."""

  def __init__(self):
    self.count = None
    self._first = None

  def add(self, call_count, call_first) -> None:
    if self.count is None:
      self.count, self._first = call_count, call_first
    else:
      self.count, self._first = _note_nonfinite(self.count, self._first, call_count, call_first)

  def first_bad(self) -> int | None:
    if self._first is None:
      return None
    first = int(self._first)
    return first if first >= 0 else None
