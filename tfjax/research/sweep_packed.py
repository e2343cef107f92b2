"""A sweep's seeds packed: the points of one variant (equal overrides but for SEED_KEYS) train
together as one program (tfjax/training/loop/packed.py), `--pack_seeds=K` (or `auto`) of
experiments/sweep.py.

Groups are formed from the points still to run: finished points (SWEEP_DONE.json, packed or not)
are skipped as always, and each variant's remaining points, in sweep order, are cut into groups
of at most K. A group checkpoints its stacked state in ROOT/packed/<group>/ (named from its
members), so a group stopped or killed mid-run resumes exactly when the same command runs again.
Every member then gets the records a separate run of it writes (its workdir, metrics.jsonl,
final checkpoint, SWEEP_DONE.json through sweep.run_point, with `seconds` its share of the group's
time and `packed` naming the group), so reports and results files treat it like any point.
`auto` sizes K from the memory plan (tfjax/training/parallel/memory_plan.py): as many of the
variant's seeds as fit in half the device's memory (the host's available memory on CPU).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.research.sweep import Point, Sweep

_log = sweep_lib._log  # pylint: disable=protected-access  (one logger for the sweep's messages)
PACKED_DIR = "packed"  # ROOT/packed/<group>/: the stacked checkpoints of each group
AUTO = "auto"


def parse_pack(value) -> Optional[int | str]:
  """--pack_seeds: '' / '0' -> None (off), 'auto', or a group size >= 2. A group of 1 packs
  nothing, so '1' is refused rather than read as off (ValueError)."""
  text = str(value or "").strip().lower()
  if text in ("", "0"):
    return None
  if text == "1":
    raise ValueError("--pack_seeds=1: a group of one seed packs nothing; give a group size "
                     "(an integer >= 2), 'auto', or 0 (the default) to train each point alone")
  if text == AUTO:
    return AUTO
  try:
    size = int(text)
  except ValueError:
    size = -1
  if size < 2:
    raise ValueError(f"--pack_seeds={value!r}: give a group size (an integer >= 2), 'auto', or "
                     "0 to train each point alone")
  return size


def variant(point: Point) -> tuple:
  return tuple(sorted((k, repr(v)) for k, v in point.overrides.items()
                      if k not in sweep_lib.SEED_KEYS))


def groups(points: Sequence[Point], size: int) -> list[list[Point]]:
  """Each variant's points (first-seen variant first, sweep order within) in chunks of `size`."""
  by_variant: dict[tuple, list[Point]] = {}
  for point in points:
    by_variant.setdefault(variant(point), []).append(point)
  return [members[i:i + size] for members in by_variant.values()
          for i in range(0, len(members), size)]


def group_dir(root: str, members: Sequence[Point]) -> str:
  names = ",".join(p.name for p in members)
  digest = hashlib.sha1(names.encode()).hexdigest()[:10]
  return os.path.join(root, PACKED_DIR, f"{members[0].name[:80]}+{len(members) - 1}-{digest}")


def per_seed_bytes(config) -> int:
  """The memory plan's bytes of one seed on one device (params, gradients, optimizer state,
  activations) with 20% headroom for what it does not count."""
  # pylint: disable=import-outside-toplevel  (jax only when packing)
  import flax.linen as nn
  import jax
  from tfjax.training import tasks
  from tfjax.training.loop import experiment
  from tfjax.training.parallel import memory_plan, sharding
  from tfjax.training.tasks import own_model
  exp = experiment.prepare(config)
  config = exp.config  # optimizer.grad_accum_steps -1 resolved
  if exp.task.own_model:  # no memory plan for these models: params, gradients, Adam's moments
    return int(1.2 * 4 * sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(
        nn.meta.unbox(own_model.boxed_param_shapes(exp.task, config, exp.model_config,
                                                   exp.dataset)))))
  seq_len, enc_len = tasks.row_lengths(exp.dataset.train_batch(0, 1), config.task)
  plan = memory_plan.memory_plan(
      exp.model_config, (1, 1, 1), batch_size=config.train.batch_size, seq_len=seq_len,
      optimizer=exp.optimizer, rules=sharding.rules(config),
      grad_accum_steps=config.optimizer.grad_accum_steps, enc_len=enc_len)
  return int(1.2 * sum(plan[k] for k in ("params", "gradients", "optimizer state",
                                         "activations")))


def device_memory_bytes() -> int:
  """The accelerator's memory limit, or on CPU the host's available memory."""
  import jax  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  with open("/proc/meminfo", encoding="utf-8") as f:
    info = dict(line.split(":", 1) for line in f)
  return int(info["MemAvailable"].split()[0]) * 1024


def auto_size(sweep: Sweep, points: Sequence[Point]) -> tuple[int, dict]:
  """(group size, the plan behind it): the most seeds of one variant that fit in half of
  device_memory_bytes, by the largest per-seed plan among the variants."""
  seeds = max(len(g) for g in groups(points, len(points) or 1)) if points else 1
  firsts = {variant(p): p for p in reversed(points)}.values()
  need = max((per_seed_bytes(sweep.config_for(p)) for p in firsts), default=1)
  budget = device_memory_bytes() // 2
  size = max(1, min(seeds, budget // max(need, 1)))
  return size, {"per_seed_bytes": need, "budget_bytes": budget, "group_size": size,
                "group_bytes": need * size}


def run_packed(sweep: Sweep, root: str, points: Sequence[Point], pack, *,
               compilation_cache: Optional[str] = None,
               stop_after_step: Optional[int] = None) -> dict[str, str]:
  """Runs `points` in packed groups (pack: a size or 'auto'); returns {name: status} as
  sweep.run_sweep does. A group of one point trains as a separate run."""
  from tfjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel
  sweep_lib.write_sweep_file(sweep, root)
  if compilation_cache:
    compile_cache.enable(compilation_cache)
  statuses = {p.name: "skipped" for p in points if sweep_lib.is_done(os.path.join(root, p.name))}
  todo = [p for p in points if p.name not in statuses]
  if todo:
    sweep_lib._configure_cpu_devices(sweep.config_for(todo[0]))  # pylint: disable=protected-access
  size = pack
  if pack == AUTO:
    size, plan = auto_size(sweep, todo)
    _log.info(
        "--pack_seeds=auto: %d seed(s) per group (%.1f MiB each by the memory plan, %.1f MiB "
        "budget)", size, plan["per_seed_bytes"] / 2**20, plan["budget_bytes"] / 2**20)
  for members in groups(todo, max(int(size), 1)):
    if len(members) == 1:
      statuses.update(sweep_lib.run_sweep(sweep, root, only=[members[0].name]))
    else:
      statuses.update(run_group(sweep, root, members, stop_after_step))
    if "interrupted" in statuses.values():
      break
  return statuses


def run_group(sweep: Sweep, root: str, members: Sequence[Point],
              stop_after_step: Optional[int] = None) -> dict[str, str]:
  """Trains `members` (unfinished points of one variant) as one packed group; {name: status}."""
  from tfjax.training.loop import packed  # pylint: disable=import-outside-toplevel
  names = [p.name for p in members]
  workdirs = [os.path.join(root, n) for n in names]
  _log.info("packed group of %d: %s", len(members), " | ".join(names))
  running = {"host": socket.gethostname(), "pid": os.getpid(), "job": sweep_lib.job_id(),
             "started": time.strftime("%Y-%m-%d %H:%M:%S"), "packed": names}
  for workdir in workdirs:
    os.makedirs(workdir, exist_ok=True)
    sweep_lib.write_json(os.path.join(workdir, sweep_lib.RUNNING_FILE), running)
  start = time.time()
  try:
    outcomes = packed.train_packed([sweep.config_for(p) for p in members], workdirs,
                                   group_dir(root, members), stop_after_step=stop_after_step)
  except Exception as e:  # pylint: disable=broad-except
    outcomes = [e] * len(members)  # each member records the group's error as its failure
  share = round((time.time() - start) / len(members), 1)
  done_extra = {"seconds": share, "packed": {"group": names,
                                             "group_seconds": round(time.time() - start, 1)}}
  statuses = {}
  for point, outcome in zip(members, outcomes):
    def outcome_of(config, workdir, outcome=outcome):
      del config, workdir
      if isinstance(outcome, BaseException):
        raise outcome
      return outcome
    try:
      statuses[point.name] = sweep_lib.run_point(sweep, point, root, outcome_of,
                                                 done_extra=done_extra)
    except Exception as e:  # pylint: disable=broad-except
      statuses[point.name] = "failed"
      _log.error("point %s failed: %s: %s", point.name, type(e).__name__, e)
  return statuses
