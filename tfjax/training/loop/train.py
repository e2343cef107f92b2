"""The training loop: `train_and_evaluate(config, workdir)`.

The step math is tfjax/training/loop/steps.py, the setup (validation, sharded state, jitted steps)
is tfjax/training/loop/experiment.py, batch placement is
tfjax.training.parallel.sharding.BatchPlacement, the startup workarounds are
tfjax/runtime/workarounds.py and what happens between steps (logs, evals, checkpoints, divergence,
signals, throughput) is tfjax/training/loop/hooks.py; this module only runs them in order. Resuming
is exact: batch k is a pure function of (seed, k), dropout keys are fold_in(rng, step), and
checkpoints hold params, optimizer state, step, rng and the data position.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

import jax

from tfjax.training.checkpointing import checkpoint, init_from, runs
from tfjax.training.loop import cadence, divergence, hooks, metrics, steps
from tfjax.data import datasets
from tfjax.runtime import workarounds, stop_signals, workdir_lock
from tfjax.inference import sampling
from tfjax.training.loop.experiment import (Experiment, StateLayout, execution_summary,
                                            jit_eval_step, make_step_runner, prepare, state_layout)
from tfjax.training.parallel.sharding import BatchPlacement

_log = logging.getLogger(__name__)
STOP_SIGNALS = stop_signals.STOP_SIGNALS  # the signals the loop stops at (checkpoint, then stop)


class TrainResult(dict):
  """The last value of each metric the run logged; `stopped` is the stop_signals.Stop of a run a
  signal stopped after its checkpoint (None when it ran to its end or stop_after_step stopped
  it): the train command prints its `message` instead of `done:` and exits `exit_status`."""

  def __init__(self, last: dict, stopped: stop_signals.Stop | None = None):
    super().__init__(last)
    self.stopped = stopped


def stop_signal() -> int | None:
  """The signal (one of STOP_SIGNALS) that stopped this process's latest train_and_evaluate
  after a checkpoint, or None: for launchers that only see the sweep's status (sweep_slurm), which
  tell a time-limit warning (requeue the job) from a cancellation (let it end)."""
  stop = stop_signals.last_stop()
  return stop.signum if stop else None


def stop_message() -> str | None:
  """`stopped at step N by SIGTERM; resume with the same command` for a run a signal stopped
  (stop_signal), else None."""
  stop = stop_signals.last_stop()
  return stop.message if stop else None


def reached_loop() -> bool:
  """Whether the latest train_and_evaluate of this process got as far as its training loop."""
  return stop_signals.loop_began()


def train_and_evaluate(config, workdir: str, *, stop_after_step: int | None = None
                       ) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns the last metrics
  (a TrainResult: also whether a signal stopped it).

  `stop_after_step` behaves like a SIGTERM arriving during that step (checkpoint, then return): it
  is how tests and the sweep launcher interrupt a run deterministically.

  A NaN/inf loss or gradient norm raises divergence.Diverged naming the first such step, at the
  next log, eval or checkpoint step (after closing the run's files; nothing is checkpointed
  after it), or with train.skip_nonfinite=True skips that update and counts it in
  train/skipped_steps (tfjax/training/loop/divergence.py). One process trains a workdir at a time: a
  second one raises ValueError (tfjax/runtime/workdir_lock.py).
  """
  stop_signals.defer()  # a signal from here on is acted on at the start-up's safe points
  experiment = prepare(config, workdir)  # everything validated before anything is written
  runs.check_same_run(workdir, experiment.config)
  stop_signals.raise_if_pending()
  created = not os.path.exists(workdir)
  try:
    # Multi-process runs share the workdir by design: process 0 holds the lock for all of them.
    lock = (workdir_lock.WorkdirLock(workdir) if jax.process_index() == 0
            else contextlib.nullcontext())
    with lock:
      return _train_locked(experiment, workdir, stop_after_step)
  except BaseException:
    if created and not stop_signals.loop_began() and jax.process_index() == 0:
      # A start that failed (or was stopped) before its first step leaves no half-made workdir
      # behind to be mistaken for a run.
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def _train_locked(experiment: Experiment, workdir: str,
                  stop_after_step: int | None) -> TrainResult:
  config = experiment.config
  train_cfg = config.train
  placement = BatchPlacement.for_config(config)
  layout = state_layout(experiment, placement)  # traces the model: shape errors surface here
  eval_step = jit_eval_step(experiment, placement, layout.shardings)
  eval_batches = _placed_eval_batches(experiment, placement)
  changes = runs.config_changes(workdir, config)  # before config.json takes the new values
  _prepare_workdir(workdir, experiment)  # the first write, after every check above
  # Said once the workdir exists: a check that fails above prints its one error line only.
  _log.info("workdir: %s", workdir)
  _log.info("mesh %s over %d %s devices", dict(placement.mesh.shape), placement.mesh.size,
            jax.default_backend())
  _log.info("%s", execution_summary(experiment))
  row_start, row_count = placement.process_rows(train_cfg.batch_size)
  iterator = datasets.DataIterator(experiment.dataset, train_cfg.batch_size, row_start=row_start,
                                   row_count=row_count)
  runner = make_step_runner(experiment, placement, layout, iterator)
  ckpt = checkpoint.Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  ckpt.remove_partial_saves()  # a save killed or failed in an earlier run
  compile_jobs = [(runner.program, runner.abstract_args)] + _eval_compile_jobs(
      eval_step, layout, eval_batches)
  try:
    with workarounds.compiling_in_background(compile_jobs, placement.axis_rules) as (
        compiling_train, *compiling_eval):
      stop_signals.raise_if_pending()
      state = _restored_or_initial_state(ckpt, layout, iterator, workdir, experiment)
      stop_signals.raise_if_pending()
      step = int(jax.device_get(state.step))
      runs.record_config_changes(workdir, changes, step)
      writer = metrics.MetricsWriter(workdir, train_cfg.num_steps, step)
      try:
        run = hooks.Run(experiment, placement, runner, iterator, ckpt, writer, state, step,
                        stop_after_step)
        run.hooks = _hooks(experiment, placement, eval_step, eval_batches)
        _loop(run, compiling_train, compiling_eval)
        ckpt.wait()
      finally:
        writer.close()
      saved = ckpt.steps()
  finally:
    try:
      ckpt.close()
    except OSError:  # the failed save's error was already raised (SaveFailed)
      pass
  if run.diverged_at is not None:
    lr_key, lr = divergence.lr_setting(experiment.config.optimizer)
    raise divergence.Diverged(
        run.diverged_at, saved[-1] if saved else None, lr,
        restored_step=step if step and run.diverged_at == step + 1 else None, lr_key=lr_key,
        scheduled_lr=float(experiment.schedule(run.diverged_at - 1)))
  return TrainResult(run.last, run.stopped)


def _hooks(experiment: Experiment, placement: BatchPlacement, eval_step, eval_batches) -> list:
  throughput = cadence.Throughput.for_experiment(experiment)
  sampler = (sampling.GreedySampler(experiment, placement)
             if sampling.GreedySampler.wanted(experiment) else None)
  evaluate = hooks.Evaluate(eval_step, eval_batches, throughput, sampler,
                            getattr(experiment.dataset, "train_lengths", None),
                            experiment.task.eval_ratios)
  return hooks.default_hooks(experiment, throughput, evaluate)


def _loop(run: hooks.Run, compiling_train, compiling_eval) -> None:
  """Runs the steps from run.step on, calling run.hooks after each jitted call (hooks.py); leaves
  the outcome in run.last, run.diverged_at and run.stopped."""
  train_cfg = run.train_cfg
  with contextlib.ExitStack() as around_loop:
    for context in (run.placement.axis_rules(), run.stop, *run.hooks):
      around_loop.enter_context(context)
    for future in compiling_eval:  # each is done before its function is first called (a call
      future.result()               # meanwhile would compile again); re-raises compile errors
    for hook in run.hooks:
      hook.start(run)  # the step-0 evaluation and sample
    compiling_train.result()
    run.stop.begin()  # the start-up's last safe point: from here on a signal stops at a step
    num_steps = cadence.steps_this_call(run.step, train_cfg, run.stop_after_step)
    while run.step < train_cfg.num_steps:
      run.call_steps = num_steps
      run.state, step_metrics = run.runner.run(run.state, num_steps)
      run.step += num_steps
      if run.step < train_cfg.num_steps:  # the next call's batches go to the devices meanwhile
        num_steps = cadence.steps_this_call(run.step, train_cfg, run.stop_after_step)
        run.runner.prefetch(num_steps)
      if any(hook(run, step_metrics) for hook in run.hooks):  # in order; True ends the loop
        break
    for hook in run.hooks:
      hook.end(run)


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
