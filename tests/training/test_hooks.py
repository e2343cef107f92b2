"""tfjax/training/loop/hooks.py and cadence.py: each hook of the training loop on its own, with
fakes for the run's writer, checkpointer and step runner (no model, no training); and train._loop's
order of calls, on fake hooks."""

import concurrent.futures
import contextlib
import os
import signal
import types

import jax.numpy as jnp
import pytest

from tfjax.runtime import stop_signals
from tfjax.training.loop import cadence, hooks, steps, train
from tfjax.training.loop.divergence import NonfiniteWatch


class FakeWriter:
  def __init__(self):
    self.rows, self.progress_calls = [], []

  def write(self, step, metrics):
    self.rows.append({"step": step, **metrics})

  def text(self, step, tag, text):
    self.rows.append({"step": step, tag: text})

  def progress(self, step, loss, lr, tokens_per_sec):
    self.progress_calls.append((step, loss, lr, tokens_per_sec))


class FakeCheckpointer:
  def __init__(self, error=None):
    self.saves, self.error = [], error

  def check_for_errors(self):
    if self.error:
      raise self.error

  def save(self, step, state, data_state, config_json, force=False):
    self.saves.append((step, state, data_state, force))


class FakeTimer:
  """metrics.Timer's interface on a clock the test sets."""

  def __init__(self):
    self.now, self.start, self.steps = 0.0, 0.0, 0

  def reset(self):
    self.start, self.steps = self.now, 0

  def rate(self, tokens_per_step):
    return self.steps * tokens_per_step / (self.now - self.start)


def train_cfg(**overrides):
  cfg = dict(num_steps=10, log_every=4, eval_every=5, checkpoint_every=6, eval_at_start=False,
             skip_nonfinite=False)
  cfg.update(overrides)
  return types.SimpleNamespace(**cfg)


def fake_run(step=0, stop_after_step=None, **cfg):
  config = types.SimpleNamespace(train=train_cfg(**cfg), to_json_best_effort=lambda: "{}")
  runner = types.SimpleNamespace(data_state=lambda: {"index": step})
  return hooks.Run(experiment=types.SimpleNamespace(config=config), placement=None,
                   runner=runner, iterator=None, ckpt=FakeCheckpointer(), writer=FakeWriter(),
                   state=types.SimpleNamespace(params={"w": 1.0}), step=step,
                   stop_after_step=stop_after_step)


def flags(count, first):
  """One call's non-finite flags as the train step returns them (device scalars)."""
  return {steps.NONFINITE: jnp.int32(count), steps.FIRST_NONFINITE: jnp.int32(first)}


def test_due_and_steps_this_call_stop_at_every_event():
  cfg = types.SimpleNamespace(num_steps=10, log_every=4, eval_every=5, checkpoint_every=6,
                              steps_per_call=3)
  assert [s for s in range(1, 11) if cadence.due(s, 4, cfg)] == [4, 8, 10]  # and the last step
  # From each step, the next call ends at the next log (4, 8), eval (5, 10) or checkpoint (6),
  # or after 3 steps, whichever comes first.
  assert [cadence.steps_this_call(s, cfg, None) for s in range(10)] == [
      3, 3, 2, 1, 1, 1, 2, 1, 2, 1]
  assert cadence.steps_this_call(0, cfg, stop_after_step=2) == 2
  assert cadence.steps_this_call(7, cfg, stop_after_step=2) == 1  # past it: one step


def test_throughput_counts_steps_until_reset_and_gives_mfu_against_the_peak():
  timer = FakeTimer()
  throughput = cadence.Throughput(tokens_per_step=10, flops_per_token=6.0, peak=100.0,
                                  timer=timer)
  count = hooks.CountSteps(throughput)
  run = fake_run()
  for call_steps in (3, 2):
    run.call_steps = call_steps
    assert count(run, {}) is False
  timer.now = 2.0
  import jax  # pylint: disable=import-outside-toplevel
  # 5 steps of 10 tokens in 2 s; 6 FLOPs per token over a 100 FLOP/s peak per device
  assert throughput.metrics() == {"train/tokens_per_sec": 25.0,
                                  "train/mfu": 25.0 * 6.0 / (100.0 * jax.device_count())}
  throughput.reset()
  timer.now = 3.0
  run.call_steps = 1
  count(run, {})
  assert throughput.metrics()["train/tokens_per_sec"] == 10.0  # 1 step in the 1 s since
  no_peak = cadence.Throughput(10, 6.0, peak=0.0, timer=timer)
  assert "train/mfu" not in no_peak.metrics()  # an unknown peak gives no MFU


def test_checkpoint_errors_stops_the_run_with_the_failed_save():
  run = fake_run()
  assert hooks.CheckpointErrors()(run, {}) is False
  run.ckpt.error = OSError("disk full")
  with pytest.raises(OSError, match="disk full"):
    hooks.CheckpointErrors()(run, {})


def test_host_lead_hands_each_calls_outputs_to_the_limiter():
  waited = []
  limiter = types.SimpleNamespace(wait_if_ahead=waited.append)
  hook, run = hooks.HostLead(limiter), fake_run()
  assert hook(run, {"a": 1}) is False and hook(run, {"a": 2}) is False
  assert waited == [{"a": 1}, {"a": 2}]


def test_divergence_stops_at_the_first_sync_point_after_the_first_bad_step():
  run, hook = fake_run(), hooks.Divergence()
  run.step, metrics = 2, {"train/loss": 1.0, **flags(0, -1)}
  assert hook(run, metrics) is False and metrics == {"train/loss": 1.0}  # flags taken out
  run.step = 3  # step 3 is bad, but 3 is no log or eval step: nothing is read back yet
  assert hook(run, flags(1, 3)) is False and run.diverged_at is None
  run.step = 4  # a log step: the first bad step so far is read, and the loop ends
  assert hook(run, flags(0, -1)) is True and run.diverged_at == 3
  hook.end(run)
  assert run.writer.rows == [{"step": 3, "train/diverged": 1}]


def test_divergence_at_the_end_and_with_skip_nonfinite():
  run, hook = fake_run(), hooks.Divergence()
  run.step = 9  # no sync point: the end finds step 9
  assert hook(run, flags(1, 9)) is False
  hook.end(run)
  assert run.diverged_at == 9 and run.writer.rows == [{"step": 9, "train/diverged": 1}]
  skipping, hook = fake_run(skip_nonfinite=True), hooks.Divergence()
  for skipping.step in (3, 4):
    assert hook(skipping, flags(1, skipping.step)) is False  # skipped, counted
  hook.end(skipping)
  assert skipping.diverged_at is None and skipping.writer.rows == []
  assert int(hook.watch.count) == 2


def test_nonfinite_watch_keeps_the_first_bad_step_and_the_count():
  watch = NonfiniteWatch()
  assert watch.first_bad() is None
  for count, first in ((0, -1), (2, 5), (1, 7)):
    watch.add(jnp.int32(count), jnp.int32(first))
  assert watch.first_bad() == 5 and int(watch.count) == 3


def test_log_writes_the_calls_metrics_then_skipped_steps_then_throughput():
  timer = FakeTimer()
  throughput = cadence.Throughput(10, 6.0, peak=None, timer=timer)
  divergence = hooks.Divergence()
  hook = hooks.Log(throughput, divergence)
  run = fake_run(skip_nonfinite=True)
  run.step = 3  # not a log step
  assert hook(run, {"train/loss": jnp.float32(2.0)}) is False and run.writer.rows == []
  divergence(run, flags(2, 1))
  run.step, timer.now = 4, 2.0
  throughput.add_steps(4)
  assert hook(run, {"train/loss": jnp.float32(1.5), "train/lr": jnp.float32(0.25)}) is False
  row = {"step": 4, "train/loss": 1.5, "train/lr": 0.25, "train/skipped_steps": 2.0,
         "train/tokens_per_sec": 20.0}
  assert run.writer.rows == [row] and list(run.writer.rows[0]) == list(row)  # keys in order
  assert run.writer.progress_calls == [(4, 1.5, 0.25, 20.0)]
  assert run.last == {k: v for k, v in row.items() if k != "step"}
  assert timer.steps == 0 and timer.start == 2.0  # reset: the next rate starts here


def test_evaluate_at_start_at_its_steps_then_the_sample(monkeypatch):
  calls = []

  def fake_evaluate(eval_step, params, eval_batches, trained_lengths, ratios=()):
    del ratios  # the task's extra ratio metrics (none here)
    calls.append((eval_step, params, eval_batches, trained_lengths))
    return {"eval/loss": float(len(calls))}
  monkeypatch.setattr(steps, "evaluate", fake_evaluate)
  entered = []
  sampler = types.SimpleNamespace(sample=lambda params: f"text of {params['w']}",
                                  __enter__=lambda: entered.append("enter"),
                                  __exit__=lambda *exc: entered.append("exit"))
  timer = FakeTimer()
  throughput = cadence.Throughput(10, 6.0, None, timer=timer)
  hook = hooks.Evaluate("step_fn", [("len_4", "batch")], throughput, sampler, (1, 6))
  resumed = fake_run(step=4, eval_at_start=True)
  hook.start(resumed)  # only a fresh run evaluates at its start
  hook.start(fake_run(step=0, eval_at_start=False))
  assert calls == []
  run = fake_run(step=0, eval_at_start=True)
  with hook:
    hook.start(run)
    run.step, timer.now, timer.steps = 4, 1.0, 4
    assert hook(run, {}) is False  # 4 is no eval step
    run.step = 5
    assert hook(run, {}) is False
  assert entered == ["enter", "exit"]
  assert calls == [("step_fn", {"w": 1.0}, [("len_4", "batch")], (1, 6))] * 2
  assert run.writer.rows == [{"step": 0, "eval/loss": 1.0}, {"step": 0, "sample": "text of 1.0"},
                             {"step": 5, "eval/loss": 2.0}, {"step": 5, "sample": "text of 1.0"}]
  assert run.last == {"eval/loss": 2.0}
  assert timer.steps == 0 and timer.start == 1.0  # eval time is left out of the next rate


def test_checkpoint_saves_at_its_steps_the_last_step_and_a_stop_never_after_a_bad_step():
  divergence = hooks.Divergence()
  hook = hooks.Checkpoint(types.SimpleNamespace(to_json_best_effort=lambda: "{}"), divergence)
  run = fake_run()
  for run.step in range(1, 11):
    divergence(run, flags(0, -1))
    assert hook(run, {}) is False
  saved = [(s, d, f) for s, _, d, f in run.ckpt.saves]
  assert saved == [(6, {"index": 0}, False), (10, {"index": 0}, False)]
  run.step, run.stop.signum = 7, signal.SIGTERM  # stopping: saved now, forced
  assert hook(run, {}) is False and run.ckpt.saves[-1][0::3] == (7, True)
  bad = fake_run()
  bad.step = 6
  divergence = hooks.Divergence()
  hook = hooks.Checkpoint(types.SimpleNamespace(to_json_best_effort=lambda: "{}"), divergence)
  divergence(bad, flags(1, 5))
  assert hook(bad, {}) is True and bad.diverged_at == 5 and bad.ckpt.saves == []


@contextlib.contextmanager
def signal_handlers_kept():
  """Restores the process's handlers and stop_signals' state after a test that changes them."""
  before = {sig: signal.getsignal(sig) for sig in stop_signals.STOP_SIGNALS}
  state = dict(stop_signals._state)  # pylint: disable=protected-access
  try:
    yield
  finally:
    for sig, handler in before.items():
      signal.signal(sig, handler)
    stop_signals._state.update(state)  # pylint: disable=protected-access


def test_a_signal_stops_the_loop_at_the_boundary_after_its_checkpoint():
  with signal_handlers_kept():
    run = fake_run()
    decide, stop = hooks.DecideStop(), hooks.StopAfterCheckpoint()
    previous = signal.getsignal(signal.SIGUSR1)
    with run.stop:
      run.step = 2
      assert decide(run, {}) is False and stop(run, {}) is False
      os.kill(os.getpid(), signal.SIGUSR1)  # noted by the handler, acted on at the boundary
      run.step = 3
      assert decide(run, {}) is False and stop(run, {}) is True
    assert run.stopped == stop_signals.Stop(signal.SIGUSR1, 3)
    assert run.stopped.message == "stopped at step 3 by SIGUSR1; resume with the same command"
    assert run.stopped.exit_status == 138 and stop_signals.last_stop() == run.stopped
    assert signal.getsignal(signal.SIGUSR1) == previous  # the loop's handler is gone


def test_stop_after_step_stops_like_sigterm_but_records_no_signal():
  with signal_handlers_kept():
    run = fake_run(stop_after_step=3)
    decide, stop = hooks.DecideStop(), hooks.StopAfterCheckpoint()
    with run.stop:
      run.step = 2
      decide(run, {})
      assert run.stop.signum is None
      run.step = 3
      decide(run, {})
      assert run.stop.signum == signal.SIGTERM and stop(run, {}) is True
    assert run.stopped is None


def test_a_signal_before_the_loop_is_one_line_and_128_plus_it(capsys):
  with signal_handlers_kept():
    with pytest.raises(SystemExit) as info:
      with stop_signals.exits_on_stop():
        os.kill(os.getpid(), signal.SIGTERM)  # the installed handler raises at once
    assert info.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err == (
        "stopped by SIGTERM before the first step; nothing was written\n")
    # deferred (start-up): only noted, raised at the next safe point
    stop_signals.install()
    stop_signals.defer()
    os.kill(os.getpid(), signal.SIGINT)
    assert stop_signals.pending() == signal.SIGINT
    with pytest.raises(stop_signals.StoppedBeforeTraining):
      stop_signals.raise_if_pending()


class Recorder(hooks.Hook):
  """A hook that records every call and ends the loop at `end_at`."""

  def __init__(self, name, events, end_at=None):
    self.name, self.events, self.end_at = name, events, end_at

  def start(self, run):
    self.events.append((self.name, "start", run.step))

  def __call__(self, run, step_metrics):
    self.events.append((self.name, run.step, run.call_steps))
    return run.step == self.end_at

  def end(self, run):
    self.events.append((self.name, "end", run.step))


def loop_run(events, num_steps, steps_per_call, end_at=None):
  run = fake_run(num_steps=num_steps)
  run.train_cfg.steps_per_call = steps_per_call
  run.placement = types.SimpleNamespace(axis_rules=contextlib.nullcontext)

  def step(state, n):
    events.append(("run", n))
    return state, {}
  run.runner = types.SimpleNamespace(run=step, prefetch=lambda n: events.append(("prefetch", n)))
  run.hooks = [Recorder("a", events, end_at), Recorder("b", events)]
  done = concurrent.futures.Future()
  done.set_result(None)
  return run, done


def test_the_loop_calls_every_hook_in_order_after_each_call_until_one_ends_it():
  events = []
  run, done = loop_run(events, num_steps=5, steps_per_call=3)
  with signal_handlers_kept():
    train._loop(run, done, [done])  # pylint: disable=protected-access
  # log_every=4: calls of 3 and 1 steps end at the log step, then 1 to the end (step 5)
  assert events == [
      ("a", "start", 0), ("b", "start", 0),
      ("run", 3), ("prefetch", 1), ("a", 3, 3), ("b", 3, 3),
      ("run", 1), ("prefetch", 1), ("a", 4, 1), ("b", 4, 1),
      ("run", 1), ("a", 5, 1), ("b", 5, 1),
      ("a", "end", 5), ("b", "end", 5)]
  events.clear()
  run, done = loop_run(events, num_steps=5, steps_per_call=1, end_at=2)
  with signal_handlers_kept():
    train._loop(run, done, [done])  # pylint: disable=protected-access
  # hook a ends the loop at step 2: hook b is not called after it there; both `end`s run
  assert events == [("a", "start", 0), ("b", "start", 0),
                    ("run", 1), ("prefetch", 1), ("a", 1, 1), ("b", 1, 1),
                    ("run", 1), ("prefetch", 1), ("a", 2, 1), ("a", "end", 2), ("b", "end", 2)]
  assert run.step == 2
