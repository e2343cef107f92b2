"""One training process per workdir: a lock file naming its owner (pid, host).

Two runs writing one checkpoint directory would interleave their checkpoints and metrics. The
training loop holds `WORKDIR/train.lock` while it runs: created atomically (O_EXCL) with the
owner's pid, host and process start time, refreshed every HEARTBEAT_S seconds by a daemon thread,
removed when the run ends (also on an error or a signal). A second process finding the lock:

* stops at once with a ValueError naming the owner, when the owner is alive;
* takes the lock over (with a warning), when the owner is dead: on the same host, its pid is gone
  or belongs to a later process (another start time); on another host, the lock has not been
  refreshed for STALE_S seconds (its machine or job is gone, e.g. a preempted node).

In a multi-process (multi-host) run only process 0 takes the lock: the run's processes share the
workdir by design.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Optional

_log = logging.getLogger(__name__)

LOCK_FILE = "train.lock"
HEARTBEAT_S = 30.0
STALE_S = 300.0  # a lock from another host unrefreshed this long belongs to a dead process


def _start_time(pid: int) -> Optional[str]:
  """The process's start time in clock ticks since boot (Linux /proc), None if unknown."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, start_time: Optional[str]) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    pass
  now = _start_time(pid)
  return start_time is None or now is None or now == start_time


class WorkdirLock:
  """Context manager holding WORKDIR/train.lock (module docstring)."""

  def __init__(self, workdir: str, *, heartbeat_s: float = HEARTBEAT_S,
               stale_s: float = STALE_S):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._heartbeat_s, self._stale_s = heartbeat_s, stale_s
    self._owner = {"pid": os.getpid(), "host": socket.gethostname(),
                   "start_time": _start_time(os.getpid()),
                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()

  def acquire(self) -> None:
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    for _ in range(3):  # a lock taken over by another process meanwhile: look again
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        owner = self._read()
        if owner is not None and self._is_live(owner):
          raise ValueError(self._busy_message(owner)) from None
        _log.warning("%s: taking over the lock of a process that is gone (%s)", self.path,
                     _describe(owner))
        try:
          os.remove(self.path)
        except FileNotFoundError:
          pass
        continue
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(self._owner, f)
      self._thread = threading.Thread(target=self._beat, name="tfjax-workdir-lock", daemon=True)
      self._thread.start()
      return
    raise ValueError(f"{self.path}: could not take the lock (other processes keep taking it)")

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._read() == self._owner:
      os.remove(self.path)

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_s):
      try:
        os.utime(self.path)
      except OSError:
        return

  def _read(self) -> Optional[dict]:
    try:
      with open(self.path, encoding="utf-8") as f:
        return json.load(f)
    except FileNotFoundError:
      return None
    except ValueError:  # being written right now (or cut short): treat as live unless old
      return {"pid": -1, "host": "?", "unreadable": True}

  def _is_live(self, owner: dict) -> bool:
    try:
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return False
    if owner.get("unreadable"):
      return age < self._stale_s
    if owner.get("host") == self._owner["host"]:
      return _alive(int(owner["pid"]), owner.get("start_time"))
    return age < self._stale_s

  def _busy_message(self, owner: dict) -> str:
    return (f"{os.path.dirname(self.path)} is being trained by {_describe(owner)}: two runs must "
            "not write one checkpoint directory. Wait for it to end or stop it, or use another "
            f"--workdir (if that process is gone, e.g. its machine crashed, delete {self.path})")


def _describe(owner: Optional[dict]) -> str:
  if not owner or owner.get("unreadable"):
    return "another process (lock file being written)"
  return f"process {owner.get('pid')} on host {owner.get('host')} (since {owner.get('since')})"
