"""A sweep's points as child processes: up to `parallel` at once, each
`python -m tfjax.research.sweep_children --config=... --workdir=... --point=NAME`, logging to
ROOT/<name>/sweep.log (tfjax.research.sweep.run_sweep with parallel > 1)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.research.sweep import (EXIT_INTERRUPTED, FAILED_FILE, LOG_FILE, Point, Sweep,
                                  is_done, write_json)
from tfjax.runtime import compile_cache

_log = sweep_lib._log  # pylint: disable=protected-access  (one logger for the sweep's messages)


def _child_command(sweep: Sweep, root: str, point: Point, cache: Optional[str]) -> list[str]:
  cmd = [sys.executable, "-m", "tfjax.research.sweep_children", "--config", sweep.config_path,
         "--workdir", root, "--point", point.name]
  if sweep.scale is not None:
    cmd += ["--scale", sweep.scale]
  if cache:
    cmd += ["--compilation_cache", cache]
  return cmd


def run_in_children(sweep, root, points, parallel, cache) -> dict[str, str]:
  """Up to `parallel` child processes at once, each logging to ROOT/<name>/sweep.log."""
  statuses = {p.name: "skipped" for p in points if is_done(os.path.join(root, p.name))}
  queue = sweep_lib.seeds_last([p for p in points if p.name not in statuses])
  running: dict[str, tuple[subprocess.Popen, Any]] = {}
  try:
    while queue or running:
      while queue and len(running) < parallel:
        point = queue.pop(0)
        workdir = os.path.join(root, point.name)
        os.makedirs(workdir, exist_ok=True)
        log = open(os.path.join(workdir, LOG_FILE), "a", encoding="utf-8")
        _log.info("start %s (%d waiting)", point.name, len(queue))
        running[point.name] = (subprocess.Popen(_child_command(sweep, root, point, cache),
                                                stdout=log, stderr=subprocess.STDOUT), log)
      time.sleep(0.2)
      for name, (proc, log) in list(running.items()):
        if proc.poll() is None:
          continue
        log.close()
        del running[name]
        statuses[name] = _child_status(root, name, proc.returncode)
  except KeyboardInterrupt:
    # Children got the SIGINT too (same process group): they checkpoint and exit; wait for that.
    _log.warning("interrupted: waiting for %d running point(s) to checkpoint", len(running))
    for name, (proc, log) in running.items():
      proc.wait()
      log.close()
      statuses[name] = "interrupted"
    raise
  return statuses


def _child_status(root: str, name: str, returncode: int) -> str:
  workdir = os.path.join(root, name)
  if returncode == 0:
    _log.info("done %s", name)
    return "done"
  if returncode == EXIT_INTERRUPTED:
    return "interrupted"
  if not os.path.exists(os.path.join(workdir, FAILED_FILE)):  # died without writing it
    write_json(os.path.join(workdir, FAILED_FILE), {
        "error": f"child process exited with status {returncode}",
        "log_tail": _tail(os.path.join(workdir, LOG_FILE))})
  _log.error("point %s failed (exit %d); see %s", name, returncode,
             os.path.join(workdir, LOG_FILE))
  return "failed"


def _tail(path: str, lines: int = 30) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


# ---------------------------------------------------------------------------------------------
# Child process entry point: python -m tfjax.research.sweep_children --config=... --workdir=... --point=NAME
# ---------------------------------------------------------------------------------------------
def _child_main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(description="Runs one sweep point (started by the sweep).")
  parser.add_argument("--config", required=True)
  parser.add_argument("--scale", default=None)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--point", required=True)
  parser.add_argument("--compilation_cache", default=None)
  args = parser.parse_args(argv)
  from tfjax.training import metrics  # pylint: disable=import-outside-toplevel
  metrics.setup_logging()
  sweep = sweep_lib.load_sweep(args.config, args.scale)
  sweep_lib._configure_cpu_devices(sweep.config_for(sweep.point(args.point)))
  if args.compilation_cache:
    compile_cache.enable(args.compilation_cache)
  try:
    status = sweep_lib.run_point(sweep, sweep.point(args.point), args.workdir)
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1
  return EXIT_INTERRUPTED if status == "interrupted" else 0


if __name__ == "__main__":
  sys.exit(_child_main(sys.argv[1:]))
