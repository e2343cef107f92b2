"""A sweep's points as child processes: up to `parallel` at once, each
`python -m tfjax.research.sweep_children --config=... --workdir=... --point=NAME`, logging to
ROOT/<name>/sweep.log (tfjax.research.sweep.run_sweep with parallel > 1), with the sweep's
--import modules. With `pack` (a group
size, experiments/sweep.py --pack_seeds=K) each child trains one packed group of seeds
(tfjax/research/sweep_packed.py), `--point` repeated per member, logging to its first member's
sweep.log."""

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
from tfjax.runtime import compile_cache, imports

_log = sweep_lib._log  # pylint: disable=protected-access  (one logger for the sweep's messages)


def _child_command(sweep: Sweep, root: str, members: Sequence[Point],
                   cache: Optional[str]) -> list[str]:
  cmd = [sys.executable, "-m", "tfjax.research.sweep_children", "--config", sweep.config_path,
         "--workdir", root]
  if imports.loaded():  # the sweep's --import modules (a kind its points use)
    cmd += ["--import", ",".join(imports.loaded())]
  for point in members:
    cmd += ["--point", point.name]
  if sweep.scale is not None:
    cmd += ["--scale", sweep.scale]
  if cache:
    cmd += ["--compilation_cache", cache]
  return cmd


def run_in_children(sweep, root, points, parallel, cache,
                    pack: Optional[int] = None) -> dict[str, str]:
  """Up to `parallel` child processes at once, each logging to ROOT/<name>/sweep.log; with
  `pack`, each child trains a packed group of up to `pack` seeds of one variant."""
  statuses = {p.name: "skipped" for p in points if is_done(os.path.join(root, p.name))}
  todo = [p for p in points if p.name not in statuses]
  if pack:
    from tfjax.research import sweep_packed  # pylint: disable=import-outside-toplevel
    queue = sweep_packed.groups(todo, pack)
  else:
    queue = [[p] for p in sweep_lib.seeds_last(todo)]
  running: dict[str, tuple[subprocess.Popen, Any, list]] = {}
  try:
    while queue or running:
      while queue and len(running) < parallel:
        members = queue.pop(0)
        workdir = os.path.join(root, members[0].name)
        os.makedirs(workdir, exist_ok=True)
        log = open(os.path.join(workdir, LOG_FILE), "a", encoding="utf-8")
        _log.info("start %s (%d waiting)", " | ".join(p.name for p in members), len(queue))
        running[members[0].name] = (subprocess.Popen(
            _child_command(sweep, root, members, cache), stdout=log,
            stderr=subprocess.STDOUT), log, members)
      time.sleep(0.2)
      for name, (proc, log, members) in list(running.items()):
        if proc.poll() is None:
          continue
        log.close()
        del running[name]
        for point in members:  # a group's child: each member as its own files say
          finished = len(members) > 1 and is_done(os.path.join(root, point.name))
          statuses[point.name] = ("done" if finished else
                                  _child_status(root, point.name, proc.returncode))
  except KeyboardInterrupt:
    # Children got the SIGINT too (same process group): they checkpoint and exit; wait for that.
    _log.warning("interrupted: waiting for %d running point(s) to checkpoint", len(running))
    for proc, log, members in running.values():
      proc.wait()
      log.close()
      statuses.update({p.name: "interrupted" for p in members})
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
# Child process entry point:
#   python -m tfjax.research.sweep_children --config=... --workdir=... --point=NAME
# ---------------------------------------------------------------------------------------------
def _child_main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(description="Runs one sweep point (started by the sweep).")
  parser.add_argument("--config", required=True)
  parser.add_argument("--scale", default=None)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--point", required=True, action="append",
                      help="repeated: the members of one packed group")
  parser.add_argument("--compilation_cache", default=None)
  parser.add_argument("--import", dest="imports", action="append", default=[])
  args = parser.parse_args(argv)
  from tfjax.training.loop import metrics  # pylint: disable=import-outside-toplevel
  metrics.setup_logging()
  imports.load(args.imports)  # before the sweep config names their kinds
  sweep = sweep_lib.load_sweep(args.config, args.scale)
  points = [sweep.point(name) for name in args.point]
  sweep_lib._configure_cpu_devices(sweep.config_for(points[0]))
  if args.compilation_cache:
    compile_cache.enable(args.compilation_cache)
  if len(points) > 1:
    from tfjax.research import sweep_packed  # pylint: disable=import-outside-toplevel
    statuses = set(sweep_packed.run_group(sweep, args.workdir, points).values())
    if "failed" in statuses:
      return 1
    return EXIT_INTERRUPTED if "interrupted" in statuses else 0
  try:
    status = sweep_lib.run_point(sweep, points[0], args.workdir)
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1
  return EXIT_INTERRUPTED if status == "interrupted" else 0


if __name__ == "__main__":
  sys.exit(_child_main(sys.argv[1:]))
