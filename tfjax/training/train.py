"""The training loop: `train_and_evaluate(config, workdir)`.

The step math is tfjax/training/steps.py, the setup (validation, sharded state, jitted steps) is
tfjax/training/experiment.py, batch placement is tfjax.training.sharding.BatchPlacement and the startup workarounds
are tfjax/runtime/workarounds.py; this module only runs them in order. Resuming is exact: batch k is a pure
function of (seed, k), dropout keys are fold_in(rng, step), and checkpoints hold params,
optimizer state, step, rng and the data position.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

from tfjax.training import checkpoint, divergence, flops, init_from, metrics, runs, steps, tasks
from tfjax.data import datasets
from tfjax.runtime import workarounds, stop_signals, workdir_lock
from tfjax.inference import sampling
from tfjax.training.experiment import (Experiment, StateLayout, execution_summary, jit_eval_step,
                                      make_step_runner, prepare, state_layout)
from tfjax.training.sharding import BatchPlacement

_log = logging.getLogger(__name__)
# The signal that ended this process's latest training loop early, and the step it saved.
_last_stop = {"signal": None, "step": None}
_progress = {"loop": False}  # whether the latest train_and_evaluate reached its training loop


def stop_signal() -> int | None:
  """The signal (one of STOP_SIGNALS) that stopped the latest train_and_evaluate of this process
  after a checkpoint, or None if it ran to the end (or stop_after_step stopped it). Launchers use
  it to tell a time-limit warning (requeue the job) from a cancellation (let it end)."""
  return _last_stop["signal"]


def stop_message() -> str | None:
  """`stopped at step N by SIGTERM; resume with the same command` for a run a signal stopped
  (stop_signal), else None: what the train command prints instead of `done:`, and what the
  sweep launchers record for such a point."""
  if _last_stop["signal"] is None:
    return None
  return (f"stopped at step {_last_stop['step']} by {signal.Signals(_last_stop['signal']).name}; "
          "resume with the same command")


def reached_loop() -> bool:
  """Whether the latest train_and_evaluate of this process got as far as its training loop."""
  return _progress["loop"]


def train_and_evaluate(config, workdir: str, *, stop_after_step: int | None = None) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns the last metrics.

  `stop_after_step` behaves like a SIGTERM arriving during that step (checkpoint, then return): it
  is how tests and the sweep launcher interrupt a run deterministically.

  A NaN/inf loss or gradient norm raises divergence.Diverged naming the first such step, at the
  next log, eval or checkpoint step (after closing the run's files; nothing is checkpointed
  after it), or with train.skip_nonfinite=True skips that
  update and counts it in train/skipped_steps (tfjax/training/divergence.py). One process
  trains a workdir at a time: a second one raises ValueError (tfjax/runtime/workdir_lock.py).
  """
  stop_signals.defer()  # a signal from here on is acted on at the start-up's safe points
  experiment = prepare(config, workdir)  # everything validated before anything is written
  runs.check_same_run(workdir, experiment.config)
  stop_signals.raise_if_pending()
  created = not os.path.exists(workdir)
  _progress["loop"] = False
  try:
    # Multi-process runs share the workdir by design: process 0 holds the lock for all of them.
    lock = (workdir_lock.WorkdirLock(workdir) if jax.process_index() == 0
            else contextlib.nullcontext())
    with lock:
      return _train_locked(experiment, workdir, stop_after_step)
  except BaseException:
    if created and not _progress["loop"] and jax.process_index() == 0:
      # A start that failed (or was stopped) before its first step leaves no half-made workdir
      # behind to be mistaken for a run.
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def _train_locked(experiment: Experiment, workdir: str, stop_after_step: int | None) -> dict:
  config = experiment.config
  train_cfg = config.train
  placement = BatchPlacement.for_config(config)
  _log.info("mesh %s over %d %s devices", dict(placement.mesh.shape), placement.mesh.size,
            jax.default_backend())
  _log.info("%s", execution_summary(experiment))
  layout = state_layout(experiment, placement)  # traces the model: shape errors surface here
  eval_step = jit_eval_step(experiment, placement, layout.shardings)
  eval_batches = _placed_eval_batches(experiment, placement)
  changes = runs.config_changes(workdir, config)  # before config.json takes the new values
  _prepare_workdir(workdir, experiment)  # the first write, after every check above
  row_start, row_count = placement.process_rows(train_cfg.batch_size)
  iterator = datasets.DataIterator(experiment.dataset, train_cfg.batch_size, row_start=row_start,
                               row_count=row_count)
  runner = make_step_runner(experiment, placement, layout, iterator)
  ckpt = checkpoint.Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  ckpt.remove_partial_saves()  # a save killed or failed in an earlier run
  try:
    return _train_with(experiment, workdir, stop_after_step, placement, layout, eval_step,
                       eval_batches, iterator, runner, ckpt, changes)
  finally:
    try:
      ckpt.close()
    except OSError:  # the failed save's error was already raised (SaveFailed)
      pass


def _train_with(experiment, workdir, stop_after_step, placement, layout, eval_step, eval_batches,
                iterator, runner, ckpt, changes) -> dict:
  train_cfg = experiment.config.train
  compile_jobs = [(runner.program, runner.abstract_args)] + _eval_compile_jobs(
      eval_step, layout, eval_batches)
  with workarounds.compiling_in_background(compile_jobs, placement.axis_rules) as (
      compiling_train, *compiling_eval):
    stop_signals.raise_if_pending()
    state = _restored_or_initial_state(ckpt, layout, iterator, workdir, experiment)
    stop_signals.raise_if_pending()
    step = restored_step = int(jax.device_get(state.step))
    runs.record_config_changes(workdir, changes, step)
    writer = metrics.MetricsWriter(workdir, train_cfg.num_steps, step)
    try:
      last, diverged_at = _loop(experiment, stop_after_step, placement, eval_step, eval_batches,
                                iterator, runner, ckpt, compiling_train, compiling_eval, state,
                                step, writer)
      ckpt.wait()
    finally:
      writer.close()
    saved = ckpt.steps()
  if diverged_at is not None:
    raise divergence.Diverged(
        diverged_at, saved[-1] if saved else None, float(experiment.schedule(diverged_at - 1)),
        restored_step=restored_step if restored_step and diverged_at == restored_step + 1
        else None)
  return last


def _loop(experiment, stop_after_step, placement, eval_step, eval_batches, iterator, runner,
          ckpt, compiling_train, compiling_eval, state, step, writer):
  """Runs the steps from `step` on; returns (the last metrics, the diverged step or None)."""
  config, train_cfg = experiment.config, experiment.config.train
  throughput = _Throughput(experiment)
  sampler = (sampling.GreedySampler(experiment, placement)
             if sampling.GreedySampler.wanted(experiment) else None)
  # synthetic tasks: the headline eval/loss covers the trained lengths only (steps.evaluate)
  trained_lengths = getattr(experiment.dataset, "train_lengths", None)
  evaluate = functools.partial(_evaluate_and_sample, eval_step, eval_batches, trained_lengths,
                               writer, sampler)
  config_json = json.loads(config.to_json_best_effort())
  host_lead, last = workarounds.HostLeadLimiter(), {}
  _last_stop["signal"] = _last_stop["step"] = None
  diverged_at = None
  watch = NonfiniteWatch()  # the non-finite flags stay on the device until a sync point reads them
  with placement.axis_rules(), _StopRequested() as stop, sampler or contextlib.nullcontext():
    for future in compiling_eval:  # each is done before its function is first called (a call
      future.result()               # meanwhile would compile again); re-raises compile errors
    if step == 0 and train_cfg.eval_at_start:
      last.update(evaluate(state, 0))
    compiling_train.result()
    stop_signals.raise_if_pending()
    _progress["loop"] = True
    num_steps = _steps_this_call(step, train_cfg, stop_after_step)
    while step < train_cfg.num_steps:
      done = num_steps
      state, step_metrics = runner.run(state, done)
      step += done
      if step < train_cfg.num_steps:  # the next call's batches go to the devices while this runs
        num_steps = _steps_this_call(step, train_cfg, stop_after_step)
        runner.prefetch(num_steps)
      watch.add(step_metrics.pop(steps.NONFINITE), step_metrics.pop(steps.FIRST_NONFINITE))
      host_lead.wait_if_ahead(step_metrics)
      throughput.add_steps(done)
      ckpt.check_for_errors()  # a background save that failed (e.g. a full disk) stops the run now
      log_now, eval_now = (_due(step, train_cfg.log_every, train_cfg),
                           _due(step, train_cfg.eval_every, train_cfg))
      # Nothing is read back from the devices on other steps: a sync point (log, eval,
      # checkpoint, the end) first reads the first non-finite step so far, and stops there.
      if (log_now or eval_now) and not train_cfg.skip_nonfinite:
        diverged_at = watch.first_bad()
        if diverged_at is not None:
          break
      if log_now:
        if train_cfg.skip_nonfinite:
          step_metrics["train/skipped_steps"] = watch.count
        last.update(_log_train_metrics(writer, step, step_metrics, throughput))
      if eval_now:
        last.update(evaluate(state, step))
        throughput.reset()
      stop.decide(at_stop_after_step=stop_after_step is not None and step >= stop_after_step)
      if _due(step, train_cfg.checkpoint_every, train_cfg) or stop.signum is not None:
        if not train_cfg.skip_nonfinite:  # never a checkpoint after a non-finite step
          diverged_at = watch.first_bad()
          if diverged_at is not None:
            break
        data_state = runner.data_state() if runner.data_state else iterator.state()
        ckpt.save(step, state, data_state, config_json, force=stop.signum is not None)
      if stop.signum is not None:
        _log.warning("signal %d: checkpoint saved at step %d, exiting", stop.signum, step)
        _last_stop["signal"], _last_stop["step"] = stop.signal, step
        break
    if diverged_at is None and not train_cfg.skip_nonfinite:
      diverged_at = watch.first_bad()  # the last steps, when the end is no sync point
    if diverged_at is not None:
      writer.write(diverged_at, {"train/diverged": 1})
  return last, diverged_at


def _prepare_workdir(workdir: str, experiment: Experiment) -> None:
  """Writes (or checks) the run's config.json, and saves its tokenizer: generate.py and resumed
  runs read it back."""
  runs.prepare_workdir(workdir, experiment.config)
  tokenizer = getattr(experiment.dataset, "tokenizer", None)
  if tokenizer is not None and jax.process_index() == 0:
    tokenizer.save(workdir)


def _placed_eval_batches(experiment: Experiment, placement: BatchPlacement) -> list:
  """[(group name, batch on the devices)]: the eval set is fixed, so it is placed once per run."""
  train_cfg = experiment.config.train
  row_start, row_count = placement.process_rows(train_cfg.eval_batch_size)
  return [(name, placement.put(batch)) for name, batch in experiment.dataset.eval_batches(
      train_cfg.eval_batch_size, train_cfg.eval_batches, row_start=row_start,
      row_count=row_count)]


def _eval_compile_jobs(eval_step, layout: StateLayout, eval_batches) -> list:
  """One (eval_step, abstract args) per distinct batch shape (synthetic tasks have one per test
  length)."""
  by_shape = {tuple((k, v.shape, v.dtype) for k, v in b.items()): b for _, b in eval_batches}
  return [(eval_step, (layout.abstract.params, b)) for b in by_shape.values()]


def _restored_or_initial_state(ckpt: checkpoint.Checkpointer, layout: StateLayout,
                               iterator: datasets.DataIterator, workdir: str,
                               experiment: Experiment) -> steps.TrainState:
  """The newest checkpoint's state (and data position), else the seeded initial state (with the
  params of config.init_from's run when set)."""
  restored = ckpt.restore_latest(layout.abstract)
  if restored is None:
    state = layout.init()
    source = init_from.source(experiment.config)
    if source is None:
      return state
    params = init_from.load_params(source, layout.abstract.params)
    opt_state = jax.jit(experiment.optimizer.init,
                        out_shardings=layout.shardings.opt_state)(params)
    _log.info("initialized params from %s", source)
    return state.replace(params=params, opt_state=opt_state)
  step, state, data_state = restored
  iterator.restore(data_state)
  _log.info("resumed from step %d in %s", step, workdir)
  return state


def _due(step: int, every: int, train_cfg) -> bool:
  """Whether an event happening every `every` steps (and at the last step) happens at `step`."""
  return step % every == 0 or step == train_cfg.num_steps


def _steps_this_call(step: int, train_cfg, stop_after_step: int | None) -> int:
  """Steps the next call runs: up to train.steps_per_call, ending at the next step that logs,
  evaluates, checkpoints or stops, so those happen at the same steps whatever steps_per_call is."""
  ends = [train_cfg.num_steps] + [step + every - step % every for every in (
      train_cfg.log_every, train_cfg.eval_every, train_cfg.checkpoint_every)]
  if stop_after_step is not None:
    ends.append(max(stop_after_step, step + 1))
  return max(1, min(min(ends) - step, train_cfg.steps_per_call))


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


class _Throughput:
  """Tokens per second of the steps since the last reset, and MFU when the peak is known."""

  def __init__(self, experiment: Experiment):
    train_cfg = experiment.config.train
    seq_len, _ = tasks.row_lengths(experiment.dataset.train_batch(0, 1), experiment.config.task)
    self._tokens_per_step = train_cfg.batch_size * seq_len
    self._flops_per_token = flops.flops_per_token(experiment.model_config, seq_len)
    self._peak = flops.peak_flops(train_cfg.peak_flops)
    self._timer = metrics.Timer()

  def add_steps(self, num_steps: int) -> None:
    self._timer.steps += num_steps

  def reset(self) -> None:
    self._timer.reset()

  def metrics(self) -> dict:
    rate = self._timer.rate(self._tokens_per_step)
    out = {"train/tokens_per_sec": rate}
    if self._peak:
      out["train/mfu"] = rate * self._flops_per_token / (self._peak * jax.device_count())
    return out


def _log_train_metrics(writer: metrics.MetricsWriter, step: int, step_metrics,
                       throughput: _Throughput) -> dict:
  logged = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
  logged.update(throughput.metrics())
  writer.write(step, logged)
  writer.progress(step, logged["train/loss"], logged["train/lr"], logged["train/tokens_per_sec"])
  throughput.reset()
  return logged


def _evaluate_and_sample(eval_step, eval_batches, trained_lengths, writer: metrics.MetricsWriter,
                         sampler: sampling.GreedySampler | None, state: steps.TrainState,
                         step: int) -> dict:
  out = steps.evaluate(eval_step, state.params, eval_batches, trained_lengths)
  writer.write(step, out)
  if sampler is not None:
    writer.text(step, "sample", sampler.sample(state.params))
  return out


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


class _StopRequested:
  """STOP_SIGNALS are noted; the loop saves a checkpoint at the next step boundary and exits.

  SIGTERM and SIGINT are how a run is stopped by hand or by a scheduler; SIGUSR1 / SIGUSR2 are the
  warnings a SLURM job asks for before its time limit (`sbatch --signal=USR1@90`; submitit uses
  USR2), so a job checkpoints before it is killed and can be requeued.
  """

  def __init__(self):
    # the latest signal that arrived in this process (set by the handler; or noted at start-up)
    self.received = stop_signals.pending()
    self.signal = None    # the signal the run stops for, agreed at a step boundary by decide()
    self.signum = None    # why the loop stops: that signal, or SIGTERM standing in for stop_after_step
    self._previous = {}

  def decide(self, at_stop_after_step: bool) -> None:
    """Sets `signum` for this step boundary. In a multi-process run every process decides the
    same: to stop if any of them received a signal (the lowest signal number among them).

    Why: a scheduler signals each host on its own clock, so without agreeing one process would
    save and leave while the others wait for it in the next step's collectives until the job is
    killed. One int per process is gathered per call; single-process runs gather nothing. The
    handler only sets `received`, so a signal arriving after the gather waits for the next
    boundary in every process alike.
    """
    received = self.received
    if jax.process_count() > 1:
      gathered = np.asarray(multihost_utils.process_allgather(np.int32(received or 0))).ravel()
      received = min((int(s) for s in gathered if s), default=None)
    self.signal = received
    self.signum = received or (signal.SIGTERM if at_stop_after_step else None)

  def __enter__(self):
    for sig in STOP_SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. tests running the loop in a thread)
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.received = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
