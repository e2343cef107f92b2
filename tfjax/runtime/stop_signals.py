"""Every stop signal a run handles, in every phase of the train command, and what it ends in.

* Imports and flag parsing (`install()`, the train command's first line): a SIGTERM / SIGINT
  raises StoppedBeforeTraining at once (nothing has been written yet); `exits_on_stop()` turns
  it into one line and exit 128 + N.
* Start-up (`defer()`, train_and_evaluate's first line): a signal is only noted, and the start-up
  calls `raise_if_pending()` at its safe points. Why: raising inside a compile or a checkpoint
  read, on whatever thread state it holds, can hang the process; at a safe point the start-up
  unwinds normally and removes a workdir it created.
* The training loop (`StopRequest`): STOP_SIGNALS are noted; the loop saves a checkpoint at the
  next step boundary and ends with a `Stop`: `stopped at step N by SIGTERM; resume with the same
  command`, exit 128 + N. A signal noted in the last moments of start-up still stops the run.

SIGTERM and SIGINT are how a run is stopped by hand or by a scheduler; SIGUSR1 / SIGUSR2 are the
warnings a SLURM job asks for before its time limit (`sbatch --signal=USR1@90`; submitit uses
USR2), so a job checkpoints before it is killed and can be requeued. Imports nothing but the
standard library until a multi-process loop gathers the signals: the train command installs
the handler before it imports JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
from typing import Iterator, Optional

EARLY_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# Signals reach a process, not a call: this is the process's phase and its latest loop's stop.
_state = {"installed": False, "deferred": False, "pending": None, "began": False, "stop": None}


class StoppedBeforeTraining(BaseException):
  """A stop signal that arrived before the training loop began. A BaseException, like
  KeyboardInterrupt: no `except Exception` on the way swallows it."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


@dataclasses.dataclass(frozen=True)
class Stop:
  """A training loop that a signal stopped after saving the checkpoint of `step`."""
  signum: int
  step: int

  @property
  def message(self) -> str:
    return (f"stopped at step {self.step} by {signal.Signals(self.signum).name}; resume with "
            "the same command")

  @property
  def exit_status(self) -> int:
    return 128 + self.signum


def _handle(signum, frame):
  del frame
  if _state["deferred"]:
    _state["pending"] = signum
    return
  raise StoppedBeforeTraining(signum)


def install() -> None:
  """Installs the handler for EARLY_SIGNALS (main thread only); signals raise at once. A command
  starts here, so no run of it has begun (an earlier run in this process, e.g. a test's, does not
  count)."""
  # The state first: a signal may arrive as soon as the first handler is in place.
  _state.update(installed=True, deferred=False, pending=None, began=False, stop=None)
  for sig in EARLY_SIGNALS:
    signal.signal(sig, _handle)


@contextlib.contextmanager
def exits_on_stop() -> Iterator[None]:
  """Installs the handler; a stop signal before the loop (StoppedBeforeTraining, or Ctrl-C where
  no handler was installed) ends the process with one line and exit 128 + N, no traceback."""
  try:
    install()  # inside: a signal between two handlers' installs raises here
    yield
  except (StoppedBeforeTraining, KeyboardInterrupt) as e:
    signum = e.signum if isinstance(e, StoppedBeforeTraining) else signal.SIGINT
    name = signal.Signals(signum).name
    if _state["began"]:  # e.g. while the last save finishes
      print(f"stopped by {name} after training began; resume with the same command",
            file=sys.stderr, flush=True)
    else:
      print(f"stopped by {name} before the first step; nothing was written", file=sys.stderr,
            flush=True)
    sys.exit(128 + signum)


def defer() -> None:
  """A run starts: from now on a signal is only noted (raise_if_pending, pending). Only notes
  after `install()`: library callers (tests, the sweep) keep their own handlers."""
  _state.update(began=False, stop=None)
  if _state["installed"]:
    _state["deferred"] = True


def pending() -> Optional[int]:
  """The stop signal noted since `defer()`, if any."""
  return _state["pending"]


def raise_if_pending() -> None:
  """Raises StoppedBeforeTraining if a stop signal was noted: call at a start-up safe point."""
  if _state["pending"] is not None:
    raise StoppedBeforeTraining(_state["pending"])


def loop_began() -> bool:
  """Whether the latest run of this process got as far as its training loop."""
  return _state["began"]


def last_stop() -> Optional[Stop]:
  """The Stop of this process's latest run, or None if it ran to its end (or has not stopped).
  For launchers that only see the run's metrics (tfjax/research/sweep_slurm.py)."""
  return _state["stop"]


class StopRequest:
  """The training loop's stop signals: `with StopRequest() as stop:` notes STOP_SIGNALS; `begin()`
  takes over from the start-up; `decide()` at each step boundary; `stop(step)` once the loop's
  checkpoint of `step` is saved."""

  def __init__(self):
    self.received = None  # the latest signal that arrived (set by the handler, or at start-up)
    self.signal = None    # the signal the run stops for, agreed at a step boundary by decide()
    self.signum = None    # why the loop stops: that signal, or SIGTERM standing in for
    #                       stop_after_step
    self._previous = {}

  def __enter__(self) -> StopRequest:
    self.received = pending()
    for sig in STOP_SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. tests running the loop in a thread)
        pass
    return self

  def begin(self) -> None:
    """The last start-up safe point (a signal noted before __enter__ stops the start-up); from
    here on a signal stops the loop at a step boundary, after a checkpoint."""
    raise_if_pending()
    _state["began"] = True

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
    import jax  # pylint: disable=import-outside-toplevel  (not while the command imports)
    if jax.process_count() > 1:
      import numpy as np  # pylint: disable=import-outside-toplevel
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      gathered = np.asarray(multihost_utils.process_allgather(np.int32(received or 0))).ravel()
      received = min((int(s) for s in gathered if s), default=None)
    self.signal = received
    self.signum = received or (signal.SIGTERM if at_stop_after_step else None)

  def stop(self, step: int) -> Optional[Stop]:
    """The Stop of a loop a signal ended at `step` (also this process's last_stop()); None when
    stop_after_step ended it."""
    _state["stop"] = Stop(self.signal, step) if self.signal is not None else None
    return _state["stop"]

  def _handle(self, signum, frame):
    del frame
    self.received = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
