"""One training process per workdir (tfjax/runtime/workdir_lock.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tfjax.runtime import workdir_lock
from tfjax.runtime.workdir_lock import LOCK_FILE, WorkdirLock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hold_lock_in_child(workdir):
  """A live process holding the lock of `workdir` (no jax: starts in a fraction of a second)."""
  code = textwrap.dedent(f"""
      import sys, time
      from tfjax.runtime.workdir_lock import WorkdirLock
      with WorkdirLock({str(workdir)!r}):
        print("locked", flush=True)
        sys.stdin.read()  # until the test closes stdin
  """)
  child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": REPO})
  assert child.stdout.readline().strip() == "locked"
  return child


def test_lock_names_its_owner_and_is_removed_on_exit(tmp_path):
  with WorkdirLock(str(tmp_path)) as lock:
    owner = json.loads((tmp_path / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner["host"]
    assert lock.path == str(tmp_path / LOCK_FILE)
  assert not (tmp_path / LOCK_FILE).exists()


def test_second_process_refuses_a_live_owner_and_takes_over_once_it_is_gone(tmp_path):
  child = hold_lock_in_child(tmp_path)
  try:
    with pytest.raises(ValueError, match=f"being trained by process {child.pid} on host"):
      WorkdirLock(str(tmp_path)).acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == child.pid  # untouched
  finally:
    child.kill()  # dies without releasing: a stale lock stays behind
    child.wait()
  assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == child.pid
  with WorkdirLock(str(tmp_path)):
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_locks_from_other_hosts_are_stale_only_when_not_refreshed(tmp_path):
  path = tmp_path / LOCK_FILE
  path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "then"}))
  with pytest.raises(ValueError, match="process 1 on host elsewhere"):
    WorkdirLock(str(tmp_path), stale_s=60).acquire()
  old = os.path.getmtime(path) - 120
  os.utime(path, (old, old))
  with WorkdirLock(str(tmp_path), stale_s=60):
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_reused_pid_is_not_the_owner(tmp_path):
  """Same host and pid but another start time: the pid now belongs to a later process."""
  (tmp_path / LOCK_FILE).write_text(json.dumps({
      "pid": os.getpid(), "host": WorkdirLock(str(tmp_path))._owner["host"],
      "start_time": "1"}))
  if workdir_lock._start_time(os.getpid()) is None:
    pytest.skip("no /proc start times here")
  with WorkdirLock(str(tmp_path)):
    pass


def test_heartbeat_refreshes_the_lock(tmp_path):
  lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05)
  with lock:
    path = tmp_path / LOCK_FILE
    old = os.path.getmtime(path) - 100
    os.utime(path, (old, old))
    for _ in range(100):
      if os.path.getmtime(path) > old + 50:
        break
      lock._stop.wait(0.05)
    assert os.path.getmtime(path) > old + 50
