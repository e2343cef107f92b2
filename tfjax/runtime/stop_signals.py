"""Stop signals before the training loop: how a run started and stopped at once leaves nothing.

The training loop notes SIGTERM / SIGINT itself and stops at a step boundary after a checkpoint
(train._StopRequested). Before it runs (imports, flag parsing, validation, compiling, restoring)
the train command installs `install()`'s handler:

* while Python imports and parses flags, it raises StoppedBeforeTraining at once (nothing has
  been written yet);
* from `defer()` on (train_and_evaluate calls it before it touches the workdir), it only notes
  the signal, and the start-up calls `raise_if_pending()` at its safe points. Why: raising inside
  a compile or a checkpoint read, on whatever thread state it holds, can hang the process; at a
  safe point the start-up unwinds normally and removes a workdir it created.

The loop takes over a noted signal (`pending()`), so a signal in the last moments of start-up
still stops the run.
"""

from __future__ import annotations

import signal
from typing import Optional

EARLY_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state = {"installed": False, "deferred": False, "pending": None}


class StoppedBeforeTraining(BaseException):
  """A stop signal that arrived before the training loop began. A BaseException, like
  KeyboardInterrupt: no `except Exception` on the way swallows it."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _handle(signum, frame):
  del frame
  if _state["deferred"]:
    _state["pending"] = signum
    return
  raise StoppedBeforeTraining(signum)


def install() -> None:
  """Installs the handler for EARLY_SIGNALS (main thread only); signals raise at once."""
  for sig in EARLY_SIGNALS:
    signal.signal(sig, _handle)
  _state.update(installed=True, deferred=False, pending=None)


def defer() -> None:
  """From now on a signal is only noted (raise_if_pending, pending). No effect unless
  `install()` ran: library callers (tests, the sweep) keep their own handlers."""
  if _state["installed"]:
    _state["deferred"] = True


def pending() -> Optional[int]:
  """The stop signal noted since `defer()`, if any."""
  return _state["pending"]


def raise_if_pending() -> None:
  """Raises StoppedBeforeTraining if a stop signal was noted: call at a start-up safe point."""
  if _state["pending"] is not None:
    raise StoppedBeforeTraining(_state["pending"])
