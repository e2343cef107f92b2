"""The training loop's run object and its hooks: what train.py's `_loop` does besides stepping.

The loop (train._loop) steps `Run.runner` and, after each jitted call, calls every hook of
`Run.hooks` in order as `hook(run, step_metrics)`; a hook returning True ends the loop. `start`
runs once before the first step and `end` once after the last; a hook is also a context manager
around the whole loop (Evaluate's sampler thread). Nothing is read back from the devices except
at a sync point (a log, eval or checkpoint step, the end): tests/training/test_loop_sync.py.

The hooks, in the loop's order: CheckpointErrors, HostLead, CountSteps, Divergence, Log,
Evaluate, DecideStop, Checkpoint, StopAfterCheckpoint (`default_hooks`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Optional, Sequence

import jax

from tfjax.runtime import stop_signals, workarounds
from tfjax.training.loop import cadence, steps
from tfjax.training.loop.divergence import NonfiniteWatch

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class Run:
  """What the loop works on (`experiment` ... `stop_after_step`), and what it leaves behind:
  `last` (the latest value of each logged metric), `diverged_at` (the first step whose loss or
  gradient norm is not finite) and `stopped` (the stop_signals.Stop of a signal that ended it)."""
  experiment: Any            # experiment.Experiment
  placement: Any             # sharding.BatchPlacement
  runner: Any                # experiment.StepRunner
  iterator: Any              # datasets.DataIterator
  ckpt: Any                  # checkpoint.Checkpointer
  writer: Any                # metrics.MetricsWriter
  state: Any                 # steps.TrainState
  step: int
  stop_after_step: Optional[int] = None
  hooks: Sequence[Hook] = ()
  stop: stop_signals.StopRequest = dataclasses.field(default_factory=stop_signals.StopRequest)
  call_steps: int = 0        # the steps of the latest call
  last: dict = dataclasses.field(default_factory=dict)
  diverged_at: Optional[int] = None
  stopped: Optional[stop_signals.Stop] = None

  @property
  def train_cfg(self):
    return self.experiment.config.train


class Hook:
  """A unit of the loop: `__call__` after each call (True ends the loop), `start` and `end`."""

  def start(self, run: Run) -> None:
    del run

  def __call__(self, run: Run, step_metrics: dict) -> bool:
    raise NotImplementedError

  def end(self, run: Run) -> None:
    del run

  def __enter__(self) -> Hook:
    return self

  def __exit__(self, *exc) -> None:
    pass


class CheckpointErrors(Hook):
  """A background save that failed (e.g. a full disk) stops the run now (checkpoint.SaveFailed)."""

  def __call__(self, run, step_metrics):
    run.ckpt.check_for_errors()
    return False


class HostLead(Hook):
  """Keeps the host a few calls ahead of the devices at most (workarounds.HostLeadLimiter)."""

  def __init__(self, limiter: workarounds.HostLeadLimiter | None = None):
    self.limiter = limiter or workarounds.HostLeadLimiter()

  def __call__(self, run, step_metrics):
    self.limiter.wait_if_ahead(step_metrics)
    return False


class CountSteps(Hook):
  """Counts each call's steps into `throughput` (tokens/s and MFU of the next log)."""

  def __init__(self, throughput: cadence.Throughput):
    self.throughput = throughput

  def __call__(self, run, step_metrics):
    self.throughput.add_steps(run.call_steps)
    return False


class Divergence(Hook):
  """Takes each call's non-finite flags out of its metrics and keeps them on the device
  (NonfiniteWatch). At a log or eval step, and before a checkpoint (`stops_run`), reads the
  first bad step back and ends the loop there (run.diverged_at), unless train.skip_nonfinite;
  `end` checks the last steps and writes `train/diverged` at the first bad one."""

  def __init__(self, watch: NonfiniteWatch | None = None):
    self.watch = watch or NonfiniteWatch()

  def __call__(self, run, step_metrics):
    self.watch.add(step_metrics.pop(steps.NONFINITE), step_metrics.pop(steps.FIRST_NONFINITE))
    cfg = run.train_cfg
    sync = (cadence.due(run.step, cfg.log_every, cfg)
            or cadence.due(run.step, cfg.eval_every, cfg))
    return sync and self.stops_run(run)

  def stops_run(self, run: Run) -> bool:
    if run.train_cfg.skip_nonfinite:
      return False
    run.diverged_at = self.watch.first_bad()
    return run.diverged_at is not None

  def end(self, run):
    if run.diverged_at is None and not run.train_cfg.skip_nonfinite:
      run.diverged_at = self.watch.first_bad()  # the last steps, when the end is no sync point
    if run.diverged_at is not None:
      run.writer.write(run.diverged_at, {"train/diverged": 1})


class Log(Hook):
  """Every train.log_every steps: the call's last-step metrics, train/skipped_steps (with
  train.skip_nonfinite, from `divergence`), tokens/s and MFU, to metrics.jsonl and the
  progress bar."""

  def __init__(self, throughput: cadence.Throughput, divergence: Divergence):
    self.throughput, self.divergence = throughput, divergence

  def __call__(self, run, step_metrics):
    cfg = run.train_cfg
    if not cadence.due(run.step, cfg.log_every, cfg):
      return False
    if cfg.skip_nonfinite:
      step_metrics["train/skipped_steps"] = self.divergence.watch.count
    logged = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
    logged.update(self.throughput.metrics())
    run.writer.write(run.step, logged)
    run.writer.progress(run.step, logged["train/loss"], logged["train/lr"],
                        logged["train/tokens_per_sec"])
    self.throughput.reset()
    run.last.update(logged)
    return False


class Evaluate(Hook):
  """Every train.eval_every steps (and at step 0 with train.eval_at_start): steps.evaluate on
  the placed eval batches, then the sampler's text; eval time is left out of `throughput`.
  Synthetic tasks: the headline eval/loss covers `trained_lengths` only (steps.evaluate)."""

  def __init__(self, eval_step, eval_batches: list, throughput: cadence.Throughput,
               sampler=None, trained_lengths=None, ratios: tuple = ()):
    self.eval_step, self.eval_batches, self.throughput = eval_step, eval_batches, throughput
    self.sampler, self.trained_lengths, self.ratios = sampler, trained_lengths, ratios

  def evaluate(self, run: Run) -> None:
    out = steps.evaluate(self.eval_step, run.state.params, self.eval_batches,
                         self.trained_lengths, self.ratios)
    run.writer.write(run.step, out)
    if self.sampler is not None:
      run.writer.text(run.step, "sample", self.sampler.sample(run.state.params))
    run.last.update(out)

  def start(self, run):
    if run.step == 0 and run.train_cfg.eval_at_start:
      self.evaluate(run)

  def __call__(self, run, step_metrics):
    if cadence.due(run.step, run.train_cfg.eval_every, run.train_cfg):
      self.evaluate(run)
      self.throughput.reset()
    return False

  def __enter__(self):
    if self.sampler is not None:
      self.sampler.__enter__()
    return self

  def __exit__(self, *exc):
    if self.sampler is not None:
      self.sampler.__exit__(*exc)


class DecideStop(Hook):
  """At each step boundary, whether a stop signal (or stop_after_step) ends the loop here: every
  process decides the same (stop_signals.StopRequest.decide)."""

  def __call__(self, run, step_metrics):
    run.stop.decide(at_stop_after_step=run.stop_after_step is not None
                    and run.step >= run.stop_after_step)
    return False


class Checkpoint(Hook):
  """Every train.checkpoint_every steps, at the last step and when the loop stops: saves the
  state and the data position (forced when stopping). Never after a non-finite step: `divergence`
  ends the loop first."""

  def __init__(self, config, divergence: Divergence):
    self.config_json = json.loads(config.to_json_best_effort())
    self.divergence = divergence

  def __call__(self, run, step_metrics):
    stopping = run.stop.signum is not None
    if not (cadence.due(run.step, run.train_cfg.checkpoint_every, run.train_cfg) or stopping):
      return False
    if self.divergence.stops_run(run):
      return True
    data_state = run.runner.data_state() if run.runner.data_state else run.iterator.state()
    run.ckpt.save(run.step, run.state, data_state, self.config_json, force=stopping)
    return False


class StopAfterCheckpoint(Hook):
  """Ends the loop once DecideStop chose to stop and Checkpoint saved: run.stopped records the
  signal (None for stop_after_step)."""

  def __call__(self, run, step_metrics):
    if run.stop.signum is None:
      return False
    _log.warning("signal %d: checkpoint saved at step %d, exiting", run.stop.signum, run.step)
    run.stopped = run.stop.stop(run.step)
    return True


def default_hooks(experiment, throughput: cadence.Throughput, evaluate: Evaluate) -> list:
  """train.py's hooks, in the loop's order."""
  divergence = Divergence()
  return [CheckpointErrors(), HostLead(), CountSteps(throughput), divergence,
          Log(throughput, divergence), evaluate, DecideStop(),
          Checkpoint(experiment.config, divergence), StopAfterCheckpoint()]
