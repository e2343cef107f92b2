"""Sweeps: many training runs of one config that differ in a few overridden keys.

A config module (configs/ablations/*.py) defines, next to `get_config(scale)`:
  get_sweep(scale) -> [overrides, ...]   each a flat dict of dotted keys, e.g.
                                          {'model.position': 'rope', 'seed': 1}; `product` builds
                                          the usual grid
  evaluate_point(config, workdir) -> {}  optional: extra metrics of a finished run (e.g.
                                          tfjax.research.length_eval.perplexity_vs_length), saved to
                                          point_metrics.json
  REPORT = dict(metrics=[...], plots=[...])  optional: what results.md and the plots show (see
                                          tfjax/research/sweep_report.py); or a function
                                          REPORT(scale) -> dict when it depends on the scale
  SLURM = dict(partition=..., gpus_per_node=..., time=...)  optional: each point's job resources
                                          with --launcher=slurm (tfjax/research/sweep_slurm.py);
                                          --slurm.* flags override them

Each point trains into ROOT/<point name>/, named from its overrides ('position=rope,seed=1'). A
point is finished when ROOT/<name>/SWEEP_DONE.json exists, written only after training and
evaluate_point succeeded; finished points are skipped, others are (re)started, and
train_and_evaluate resumes them from their latest checkpoint. A failing point writes
SWEEP_FAILED.json (error and traceback) and the sweep goes on with the others.

While a point trains, ROOT/<name>/SWEEP_RUNNING.json says where (host, pid, job id); a launcher that
submits jobs writes SWEEP_JOB.json (job id, log files). tfjax/research/sweep_status.py reads these
files into each point's state.

Points run in this process one after another (parallel=1), as child processes (parallel > 1,
tfjax/research/sweep_children.py), or as SLURM / submitit jobs (tfjax/research/sweep_slurm.py).
The CLI is experiments/sweep.py.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import importlib.util
import inspect
import itertools
import json
import logging
import math
import os
import re
import socket
import time
import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

from ml_collections import config_dict

from tfjax.research import sweep_results
from tfjax.runtime import compile_cache, files

_log = logging.getLogger(__name__)

SEED_KEYS = ("seed", "data.seed")  # points differing only in these are repeats of one variant
DONE_FILE = "SWEEP_DONE.json"
FAILED_FILE = "SWEEP_FAILED.json"
POINT_METRICS_FILE = "point_metrics.json"
LOG_FILE = "sweep.log"
SWEEP_FILE = "sweep.json"
RUNNING_FILE = "SWEEP_RUNNING.json"  # an attempt in progress (host, pid, job): removed when it ends
JOB_FILE = "SWEEP_JOB.json"          # a cluster launcher submitted the point (job id, logs)
EXIT_INTERRUPTED = 3  # a child stopped by a signal: checkpointed, to be resumed, not failed
_MAX_NAME = 200       # directory names stay well under the usual 255-byte limit


# ---------------------------------------------------------------------------------------------
# Defining points
# ---------------------------------------------------------------------------------------------
def product(axes: Mapping[str, Sequence[Any]]) -> list[dict]:
  """Every combination of the axes' values, the last axis varying fastest.

  product({'model.position': ['rope', 'alibi'], 'seed': [0, 1]}) ->
    [{'model.position': 'rope', 'seed': 0}, {... 'rope', 'seed': 1}, {... 'alibi', 0}, ...]
  """
  keys = list(axes)
  return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def format_value(value) -> str:
  if isinstance(value, bool) or value is None:
    return str(value).lower()
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (tuple, list)):
    return "-".join(format_value(v) for v in value)
  return str(value)


def point_names(points: Sequence[Mapping[str, Any]]) -> list[str]:
  """Readable, filesystem-safe, unique directory names: 'key=value,key=value' in each point's key
  order. Keys are shortened to their last component ('model.position' -> 'position') unless two
  different keys of the sweep share it."""
  all_keys = {k for p in points for k in p}
  last = {}
  for key in all_keys:
    last.setdefault(key.split(".")[-1], set()).add(key)
  short = {k: k.split(".")[-1] if len(last[k.split(".")[-1]]) == 1 else k for k in all_keys}
  names, seen = [], {}
  for index, point in enumerate(points):
    raw = ",".join(f"{short[k]}={format_value(v)}" for k, v in point.items()) or "base"
    name = re.sub(r"[^A-Za-z0-9._+=,-]", "_", raw)
    if len(name) > _MAX_NAME:  # keep it readable, make it unique
      digest = hashlib.sha1(raw.encode()).hexdigest()[:10]
      name = f"{name[:_MAX_NAME - 11]}-{digest}"
    if name in seen:
      raise ValueError(f"sweep points {seen[name]} and {index} both get the directory name "
                       f"{name!r} (duplicate overrides?): {points[seen[name]]} / {point}")
    seen[name] = index
    names.append(name)
  return names


def apply_overrides(config, overrides: Mapping[str, Any]):
  """A copy of `config` with each dotted key set; unknown keys and wrong types are ValueErrors."""
  config = copy.deepcopy(config)  # keeps typed placeholders (model.window etc.)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node.get(part) if isinstance(node, config_dict.ConfigDict) else None
    if not isinstance(node, config_dict.ConfigDict) or leaf not in node:
      raise ValueError(f"unknown override key {key!r}{_did_you_mean(config, key)}")
    try:
      node[leaf] = tuple(value) if isinstance(value, list) else value
    except TypeError as e:
      raise ValueError(f"override {key}={value!r}: {e}") from None
  return config


def _flat_keys(config, prefix="") -> list[str]:
  keys = []
  for key, value in config.items():
    if isinstance(value, config_dict.ConfigDict):
      keys += _flat_keys(value, f"{prefix}{key}.")
    else:
      keys.append(f"{prefix}{key}")
  return keys


def _did_you_mean(config, key: str) -> str:
  from tfjax.runtime import imports  # pylint: disable=import-outside-toplevel
  close = difflib.get_close_matches(key, _flat_keys(config), n=3, cutoff=0.6)
  return (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close
          else f" ({imports.UNKNOWN_KEY_HINT})")


# ---------------------------------------------------------------------------------------------
# A sweep loaded from its config module
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Point:
  name: str
  overrides: dict


@dataclasses.dataclass
class Sweep:
  config_path: str
  scale: Optional[str]
  base_config: Any
  points: list[Point]
  evaluate_point: Optional[Callable[[Any, str], dict]] = None
  report: dict = dataclasses.field(default_factory=dict)
  slurm: dict = dataclasses.field(default_factory=dict)  # the module's SLURM resources

  def config_for(self, point: Point):
    return apply_overrides(self.base_config, point.overrides)

  def select(self, names: str) -> list[str]:
    """Point names from a comma-separated list of them, as `--only` gives it.

    Names contain commas themselves ('position=rope,seed=1'), so the list is read left to right,
    each time taking the longest run of comma-separated parts that is a point's name.
    """
    known = {p.name for p in self.points}
    parts = [p for p in names.split(",") if p]
    selected = []
    while parts:
      for end in range(len(parts), 0, -1):
        if ",".join(parts[:end]) in known:
          selected.append(",".join(parts[:end]))
          parts = parts[end:]
          break
      else:
        raise ValueError(f"no point named {parts[0]!r} (or starting with it) in "
                         f"{self.config_path}; `--list` prints the names")
    return selected

  def point(self, name: str) -> Point:
    for point in self.points:
      if point.name == name:
        return point
    raise ValueError(f"no point named {name!r} in {self.config_path}; points: "
                     f"{[p.name for p in self.points]}")


def load_module(path: str):
  """Imports a Python file by path (config modules are not a package)."""
  if not os.path.exists(path):
    raise ValueError(f"no such file: {path}")
  name = "_tfjax_loaded_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _call_with_scale(fn, scale):
  return fn(scale) if inspect.signature(fn).parameters else fn()


def load_sweep(config_path: str, scale: Optional[str] = None) -> Sweep:
  """Loads get_config / get_sweep / evaluate_point / REPORT and checks every point's overrides
  (unknown keys, wrong types, invalid model settings) before anything runs."""
  module = load_module(config_path)
  for required in ("get_config", "get_sweep"):
    if not hasattr(module, required):
      raise ValueError(f"{config_path} defines no {required}(); a sweep config needs get_config "
                       "and get_sweep (see tfjax/research/sweep.py)")
  base = _call_with_scale(module.get_config, scale)
  overrides = [dict(p) for p in _call_with_scale(module.get_sweep, scale)]
  if not overrides:
    raise ValueError(f"{config_path}: get_sweep returned no points")
  points = [Point(n, o) for n, o in zip(point_names(overrides), overrides)]
  report = getattr(module, "REPORT", {})
  report = _call_with_scale(report, scale) if callable(report) else report
  sweep = Sweep(config_path, scale, base, points, getattr(module, "evaluate_point", None),
                dict(report), dict(getattr(module, "SLURM", {})))
  check_points(sweep)
  return sweep


def check_points(sweep: Sweep) -> None:
  """Every point's config must build: all problems reported at once, nothing run."""
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  problems = []
  for point in sweep.points:
    try:
      config = sweep.config_for(point)
      from tfjax.training import tasks  # pylint: disable=import-outside-toplevel
      task = tasks.get_task(config.task)
      if task.own_model:  # ViT, CLIP, Whisper, Funnel: their own model config and checks
        task.check(config, task.model_config(config))
        continue
      model = dict(config.model)
      model["vocab_size"] = model["vocab_size"] or 1  # 0 = from the data, known only at run time
      # 'auto' values resolved for a CPU only to validate: asking JAX for its platform would
      # start its backends before a point's mesh.cpu_devices could still apply.
      ModelConfig.from_config(model, platform="cpu")
    except (ValueError, TypeError) as e:
      problems.append(f"  {point.name}: {e}")
  if problems:
    raise ValueError(f"{sweep.config_path}: {len(problems)} of {len(sweep.points)} sweep points "
                     "are invalid, nothing was run:\n" + "\n".join(problems))


# ---------------------------------------------------------------------------------------------
# Point state on disk
# ---------------------------------------------------------------------------------------------
def write_json(path: str, obj) -> None:
  """Atomically (a reader never sees half a file; a crash leaves no marker)."""
  files.write_json_atomic(path, obj, indent=2, sort_keys=True, default=str)


read_json = files.read_json


def is_done(workdir: str) -> bool:
  return os.path.exists(os.path.join(workdir, DONE_FILE))


def last_step(workdir: str) -> int:
  """Highest step in metrics.jsonl (0 if none): the run finished when it reaches num_steps."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  steps = [0]
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        steps.append(int(json.loads(line)["step"]))
      except (ValueError, KeyError):
        continue  # a line cut short by a crash
  return max(steps)


def job_id() -> Optional[str]:
  """The scheduler's id of the job this process runs in (SLURM array task or job, submitit's
  local job), or None."""
  env = os.environ
  if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
    return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
  return env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or None


def log_path(workdir: str) -> Optional[str]:
  """Where this point's output goes: the submitted job's log (SWEEP_JOB.json), else the child
  process's sweep.log, else None (points trained in the sweep's own process log to its stderr)."""
  job_file = os.path.join(workdir, JOB_FILE)
  if os.path.exists(job_file):
    return read_json(job_file).get("stderr")
  log = os.path.join(workdir, LOG_FILE)
  return log if os.path.exists(log) else None


# ---------------------------------------------------------------------------------------------
# Running points
# ---------------------------------------------------------------------------------------------
def _default_train(config, workdir):
  # jax only when training
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  return train.train_and_evaluate(config, workdir)


def run_point(sweep: Sweep, point: Point, root: str,
              train_fn: Callable[[Any, str], dict] = _default_train,
              done_extra: Mapping[str, Any] = ()) -> str:
  """Trains one point (resuming) and evaluates it; 'done' | 'skipped' | 'interrupted' |
  'diverged' (training stopped at a NaN/inf loss: a result, recorded in SWEEP_DONE.json with
  `diverged_at_step`, not retried). `done_extra` adds to (or replaces) SWEEP_DONE.json's keys:
  a packed group's share of its time (tfjax/research/sweep_packed.py).

  Other exceptions propagate after SWEEP_FAILED.json is written.
  """
  workdir = os.path.join(root, point.name)
  if is_done(workdir):
    return "skipped"
  os.makedirs(workdir, exist_ok=True)
  failed = os.path.join(workdir, FAILED_FILE)
  if os.path.exists(failed):
    os.remove(failed)
  start = time.time()
  job_file = os.path.join(workdir, JOB_FILE)
  if os.path.exists(job_file) and read_json(job_file).get("job_id") != job_id():
    os.remove(job_file)  # an earlier submission's: this attempt runs elsewhere
  running = os.path.join(workdir, RUNNING_FILE)
  write_json(running, {"host": socket.gethostname(), "pid": os.getpid(), "job": job_id(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S")})
  try:
    config = sweep.config_for(point)
    try:
      final = train_fn(config, workdir)
    except Exception as e:  # pylint: disable=broad-except
      from tfjax.training.loop import divergence  # pylint: disable=import-outside-toplevel
      if not isinstance(e, divergence.Diverged):
        raise
      write_json(os.path.join(workdir, DONE_FILE), {
          "overrides": point.overrides, "diverged_at_step": e.step, "error": str(e),
          **sweep_results.provenance(config), "seconds": round(time.time() - start, 1),
          "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **dict(done_extra)})
      _log.warning("point %s: %s", point.name, e)
      return "diverged"
    if last_step(workdir) < config.train.num_steps:
      return "interrupted"  # a signal stopped training after a checkpoint
    extra = sweep.evaluate_point(config, workdir) if sweep.evaluate_point else {}
    write_json(os.path.join(workdir, POINT_METRICS_FILE), extra)
  except Exception as e:
    write_json(failed, {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                        "overrides": point.overrides, "log": log_path(workdir)})
    raise
  finally:
    if os.path.exists(running):
      os.remove(running)
  write_json(os.path.join(workdir, DONE_FILE), {
      "overrides": point.overrides, "final": final, "point_metrics": extra,
      **sweep_results.provenance(config),
      "seconds": round(time.time() - start, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
      **dict(done_extra)})
  return "done"


def write_sweep_file(sweep: Sweep, root: str) -> None:
  """ROOT/sweep.json: the config, scale and every point's overrides (what --status lists)."""
  os.makedirs(root, exist_ok=True)
  write_json(os.path.join(root, SWEEP_FILE), {
      "config": os.path.abspath(sweep.config_path), "scale": sweep.scale,
      "points": {p.name: p.overrides for p in sweep.points},
      "order": [p.name for p in sweep.points]})  # the keys above get sorted


def run_sweep(sweep: Sweep, root: str, *, only: Sequence[str] = (),
              train_fn: Callable[[Any, str], dict] = _default_train,
              compilation_cache: Optional[str] = None) -> dict[str, str]:
  """Runs the sweep's points (or the named ones) one after another in this process; returns
  {name: status}. Status 'failed' means that point raised; the others still run. Several points
  at once, each in a child process: tfjax.research.sweep_children.run_in_children."""
  write_sweep_file(sweep, root)
  points = [sweep.point(n) for n in only] if only else list(sweep.points)
  if points:
    _configure_cpu_devices(sweep.config_for(points[0]))
  if compilation_cache:
    compile_cache.enable(compilation_cache)
  statuses = {}
  for i, point in enumerate(points, 1):
    _log.info("[%d/%d] %s", i, len(points), point.name)
    try:
      statuses[point.name] = run_point(sweep, point, root, train_fn)
    except Exception as e:  # pylint: disable=broad-except
      statuses[point.name] = "failed"
      _log.error("point %s failed: %s: %s (details: %s)", point.name, type(e).__name__, e,
                 os.path.join(root, point.name, FAILED_FILE))
    if statuses[point.name] == "interrupted":
      _log.warning("interrupted during %s; run the same command again to resume", point.name)
      break
  return statuses


def _configure_cpu_devices(config) -> None:
  """Applies config.mesh.cpu_devices of the points this process trains before JAX starts, as the
  train command does: once JAX runs, the device count is fixed (a point would then warn that
  it asks for more CPU devices than JAX has, and train slower)."""
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  sharding.configure_cpu_devices(config)


def seeds_last(points: Sequence[Point]) -> list[Point]:
  """Every variant's first seed before any variant's second (stable otherwise): concurrent
  children then compile different models, and later seeds find them in the compilation cache."""
  repeats: dict[tuple, int] = {}
  ranked = []
  for point in points:
    variant = tuple(sorted((k, repr(v)) for k, v in point.overrides.items()
                           if k not in SEED_KEYS))
    ranked.append((repeats.get(variant, 0), point))
    repeats[variant] = repeats.get(variant, 0) + 1
  return [p for _, p in sorted(ranked, key=lambda item: item[0])]


# ---------------------------------------------------------------------------------------------
# Finished runs
# ---------------------------------------------------------------------------------------------
def restore_run(workdir: str):
  """(config, experiment, params) of a finished point (see
  tfjax.training.checkpointing.runs.restore_run)."""
  # pylint: disable-next=import-outside-toplevel  (jax only when needed)
  from tfjax.training.checkpointing import runs
  run = runs.restore_run(workdir)  # has the experiment's model_config and dataset
  return run.config, run, run.params


def finite(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
