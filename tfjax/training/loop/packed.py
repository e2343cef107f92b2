"""Packed seeds: K runs of one config that differ only in their seeds, trained as one program.

`train_packed(configs, workdirs, group_dir)` trains K configs that are equal except `seed` and
`data.seed`: the train state (params, optimizer state, step, dropout rng) gets a leading seed
axis and one jitted call steps every seed (`jax.vmap` of steps.make_train_step). Each seed is
initialized by its own config's StateLayout.init and reads its own DataIterator, so it starts,
draws its data and drops out exactly as its separate run would: the losses equal the separate
runs' to float32 rounding (tests/training/test_packed.py).

Why: the ablation models use a sliver of a GPU, and on a few CPU cores per-op overhead
dominates; one program of K seeds amortizes both (experiments/bench_packed.py).

Records: every seed writes its own workdir as a separate run would (config.json, tokenizer,
metrics.jsonl rows, TensorBoard events) and, at the end, its own final checkpoint there, so
readers (runs.restore_run, the sweep's evaluate_point and reports) cannot tell it was packed.
While training, checkpoints hold the stacked state in `group_dir/checkpoints` (its data item
records every seed's data position and divergence), so a killed group resumes exactly.

Faults stay per seed: a seed whose loss or gradient norm stops being finite is frozen from that
step on (its updates are masked out), `train/diverged` is written at its step in its
metrics.jsonl, and the others go on; its outcome is a divergence.Diverged. With
train.skip_nonfinite=True such updates are skipped and counted instead, as in train.py.
Limits (each refused with a ValueError): a mesh of one device, no init_from, no samples.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.data import datasets
from tfjax.runtime import files, stop_signals, workdir_lock
# cadence: the loop's cadence, shared so a packed group logs, evaluates, checkpoints and stops at
# the same steps as train.py
from tfjax.training.checkpointing import checkpoint, runs
from tfjax.training.loop import cadence, divergence, metrics, steps
from tfjax.training.parallel import cpu_fusion
from tfjax.training.loop.experiment import (Experiment, build_task_model, prepare, stack_batches,
                                            state_layout)
from tfjax.training.parallel.sharding import BatchPlacement

_log = logging.getLogger(__name__)
SEED_KEYS = ("seed", "data.seed")  # what the packed configs may differ in
GROUP_FILE = "packed_group.json"   # group_dir/: the member workdirs, in stacking order


def check_packable(configs: Sequence[Any]) -> None:
  """ValueError unless the configs differ only in SEED_KEYS and the packer supports them."""
  if not configs:
    raise ValueError("train_packed needs at least one config")

  def without_seeds(config):
    flat = json.loads(config.to_json_best_effort())
    flat.pop("seed", None)
    flat.get("data", {}).pop("seed", None)
    return flat
  first = without_seeds(configs[0])
  for index, config in enumerate(configs[1:], 1):
    if without_seeds(config) != first:
      # pylint: disable-next=protected-access
      a, b = runs._flat(first), runs._flat(without_seeds(config))
      diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
      raise ValueError(f"packed configs 0 and {index} differ in more than {SEED_KEYS} "
                       f"({diff[:4]}); only seeds may differ within a packed group")
  config = configs[0]
  if config.init_from:
    raise ValueError("init_from is not supported with packed seeds; train these points "
                     "without --pack_seeds")
  if config.train.sample_tokens:
    raise ValueError("train.sample_tokens > 0 is not supported with packed seeds; set it to 0 "
                     "or train without --pack_seeds")


def make_packed_step(experiment: Experiment, stop_on_nonfinite: bool):
  """(state [K..], alive [K] bool, batches [S, K, B, ...], num_steps) -> (state, alive, metrics
  [K] of the last step; NONFINITE / FIRST_NONFINITE cover all the call's steps), jitted.

  A seed not alive keeps its state (step, params, optimizer state) as it was: a diverged seed is
  frozen at its last finite values. With `stop_on_nonfinite` a non-finite step ends the seed's
  life at once, also inside a call of several steps."""
  config = experiment.config
  model = build_task_model(experiment, deterministic=False)
  one_step = jax.vmap(steps.make_train_step(
      model, experiment.optimizer, experiment.schedule, config.task,
      config.train.label_smoothing, config.optimizer.grad_accum_steps))

  def packed(state, alive_K, batches, num_steps):
    def body(i, carry):
      state, alive_K, last = carry
      batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), batches)
      # The CPU fusion boundary's predicate from outside the vmap (num_steps, a run-time value,
      # is never negative), so it stays a cond, not a select of both branches (cpu_fusion.py).
      with cpu_fusion.unbatched_predicate(num_steps < 0):
        new_state, out = one_step(state, batch)
      keep = lambda new, old: jnp.where(  # noqa: E731  (alive_K broadcast over the leaf's dims)
          alive_K.reshape(alive_K.shape + (1,) * (new.ndim - 1)), new, old)
      state = jax.tree.map(keep, new_state, state)
      bad_K = out[steps.NONFINITE] > 0
      out[steps.NONFINITE] = last[steps.NONFINITE] + jnp.where(alive_K, out[steps.NONFINITE], 0)
      first_K = last[steps.FIRST_NONFINITE]
      out[steps.FIRST_NONFINITE] = jnp.where(
          first_K >= 0, first_K, jnp.where(alive_K, out[steps.FIRST_NONFINITE], -1))
      if stop_on_nonfinite:
        alive_K = alive_K & ~bad_K
      return state, alive_K, out

    first_batch = jax.tree.map(lambda x: x[0], batches)
    shapes = jax.eval_shape(one_step, state, first_batch)[1]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    zeros[steps.FIRST_NONFINITE] = jnp.full(shapes[steps.FIRST_NONFINITE].shape, -1, jnp.int32)
    return jax.lax.fori_loop(0, num_steps, body, (state, alive_K, zeros))

  return jax.jit(packed, donate_argnums=(0,))


def stack_seeds(trees: Sequence[Any]) -> Any:
  """K trees of equal structure -> one tree of [K, ...] leaves."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, k: int) -> Any:
  return jax.tree.map(lambda x: x[k], tree)


def train_packed(configs: Sequence[Any], workdirs: Sequence[str], group_dir: str, *,
                 stop_after_step: int | None = None) -> list:
  """Trains the K `configs` as one program (see the module docstring), resuming the group from
  `group_dir`'s newest checkpoint. Returns one outcome per seed, in order: the last metrics
  (dict) of a seed that trained to the end or was stopped, or the divergence.Diverged of a seed
  that diverged (only when the group ran to its end: a stopped group resumes its diverged seeds
  frozen, from the checkpoint's record of them). `stop_after_step` stops the group as a SIGTERM
  during that step would (checkpoint, then return)."""
  if len(configs) != len(workdirs):
    raise ValueError(f"{len(configs)} configs but {len(workdirs)} workdirs")
  check_packable(configs)
  exps = [prepare(c, w) for c, w in zip(configs, workdirs)]  # all validated before any write
  placement = BatchPlacement.for_config(configs[0])
  if placement.mesh.size != 1:
    raise ValueError(
        f"packed seeds train on one device, but config.mesh gives {placement.mesh.size} "
        f"({dict(placement.mesh.shape)}); set mesh.cpu_devices=0 on CPU (or mesh.data=1), or "
        "train without --pack_seeds")
  for exp, workdir in zip(exps, workdirs):
    runs.check_same_run(workdir, exp.config)  # the resolved config, as config.json holds it
  with contextlib.ExitStack() as locks:
    for path in [group_dir, *workdirs]:
      os.makedirs(path, exist_ok=True)
      locks.enter_context(workdir_lock.WorkdirLock(path))
    return _train_locked(exps, list(workdirs), group_dir, placement, stop_after_step)


def _train_locked(exps, workdirs, group_dir, placement, stop_after_step) -> list:
  num_seeds, train_cfg = len(exps), exps[0].config.train
  _write_group_file(group_dir, workdirs)  # refuses another group's checkpoints first
  changes = [runs.config_changes(w, e.config) for w, e in zip(workdirs, exps)]
  for workdir, exp in zip(workdirs, exps):
    runs.prepare_workdir(workdir, exp.config)
    tokenizer = getattr(exp.dataset, "tokenizer", None)
    if tokenizer is not None:
      tokenizer.save(workdir)
  layouts = [state_layout(e, placement) for e in exps]
  iterators = [datasets.DataIterator(e.dataset, train_cfg.batch_size) for e in exps]
  stacked_abstract = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct((num_seeds,) + s.shape, s.dtype,
                                     sharding=placement.replicated()), layouts[0].abstract)
  ckpt = checkpoint.Checkpointer(group_dir, keep=train_cfg.keep_checkpoints)
  ckpt.remove_partial_saves()
  try:
    restored = ckpt.restore_latest(stacked_abstract)
    if restored is None:
      state, diverged_at = stack_seeds([layout.init() for layout in layouts]), [None] * num_seeds
    else:
      _, state, data_state = restored
      for iterator, seed_state in zip(iterators, data_state["seeds"]):
        iterator.restore(seed_state)
      diverged_at = list(data_state["diverged_at"])
      _log.info("packed group resumed from step %d in %s", int(state.step.max()), group_dir)
    step = int(jax.device_get(state.step).max())
    for workdir, change in zip(workdirs, changes):
      runs.record_config_changes(workdir, change, step)
    # One log for every seed: each line says whose it is.
    writers = [metrics.MetricsWriter(w, train_cfg.num_steps, step, progress=False,
                                     label=f"seed {exp.config.seed}")
               for w, exp in zip(workdirs, exps)]
    try:
      loop = _Loop(exps, iterators, ckpt, writers, diverged_at)
      state, step, stopped = loop.run(state, step, stop_after_step)
      ckpt.wait()
    finally:
      for writer in writers:
        writer.close()
  finally:
    try:
      ckpt.close()
    except OSError:
      pass
  if stopped:
    return [dict(last) for last in loop.last]
  _save_final_checkpoints(exps, workdirs, state, iterators, diverged_at, step)
  # A diverged seed's workdir holds no checkpoint (its stacked ones are the group's): None.
  return [dict(last) if d is None else _diverged(exps[k], d)
          for k, (last, d) in enumerate(zip(loop.last, diverged_at))]


def _diverged(exp: Experiment, step: int) -> divergence.Diverged:
  """A seed's divergence at `step`: its configured learning rate and the schedule's at that step."""
  lr_key, lr = divergence.lr_setting(exp.config.optimizer)
  return divergence.Diverged(step, None, lr, lr_key=lr_key,
                             scheduled_lr=float(exp.schedule(step - 1)))


def _write_group_file(group_dir: str, workdirs: Sequence[str]) -> None:
  path = os.path.join(group_dir, GROUP_FILE)
  members = [os.path.abspath(w) for w in workdirs]
  if os.path.exists(path):
    before = files.read_json(path)["workdirs"]
    if before != members:
      raise ValueError(f"{group_dir} is the packed group of {before}, not of {members}: its "
                       "checkpoints hold those seeds; use another group directory")
    return
  files.write_json_atomic(path, {"workdirs": members}, indent=2)


def _save_final_checkpoints(exps, workdirs, state, iterators, diverged_at, step) -> None:
  """Each finished seed's state in its own workdir, as its separate run's last checkpoint."""
  for k, (exp, workdir) in enumerate(zip(exps, workdirs)):
    if diverged_at[k] is not None:
      continue
    own = checkpoint.Checkpointer(workdir, keep=exp.config.train.keep_checkpoints)
    try:
      own.save(step, seed_slice(state, k), iterators[k].state(),
               json.loads(exp.config.to_json_best_effort()), force=True)
      own.wait()
    finally:
      own.close()


class _Loop:
  """train.py's loop for a packed group: the same cadence, one writer per seed."""

  def __init__(self, exps, iterators, ckpt, writers, diverged_at):
    self.exps, self.iterators, self.ckpt, self.writers = exps, iterators, ckpt, writers
    self.diverged_at = diverged_at
    self.train_cfg = exps[0].config.train
    self.eval_step = jax.jit(steps.make_eval_step(build_task_model(exps[0]),
                                                  exps[0].config.task))
    cfg = self.train_cfg
    self.eval_batches = [[(name, jax.device_put(b)) for name, b in e.dataset.eval_batches(
        cfg.eval_batch_size, cfg.eval_batches)] for e in exps]
    self.trained_lengths = getattr(exps[0].dataset, "train_lengths", None)
    self.packed_step = make_packed_step(exps[0], stop_on_nonfinite=not cfg.skip_nonfinite)
    self.throughput = cadence.Throughput.for_experiment(exps[0])
    self.last = [{} for _ in exps]
    self.skipped = np.zeros(len(exps), np.int64)

  def alive(self) -> np.ndarray:
    return np.array([d is None for d in self.diverged_at])

  def evaluate(self, state, step) -> None:
    for k in np.flatnonzero(self.alive()):
      out = steps.evaluate(self.eval_step, seed_slice(state.params, k), self.eval_batches[k],
                           self.trained_lengths, self.exps[0].task.eval_ratios)
      self.writers[k].write(step, out)
      self.last[k].update(out)

  def run(self, state, step, stop_after_step):
    cfg = self.train_cfg
    configs = [json.loads(e.config.to_json_best_effort()) for e in self.exps]
    with stop_signals.StopRequest() as stop:
      if step == 0 and cfg.eval_at_start:
        self.evaluate(state, 0)
      while step < cfg.num_steps and self.alive().any():
        num_steps = cadence.steps_this_call(step, cfg, stop_after_step)
        batches = stack_batches([stack_batches([it.next() for it in self.iterators],
                                               len(self.iterators))
                                 for _ in range(num_steps)], cfg.steps_per_call)
        alive = self.alive()
        state, _, out = self.packed_step(state, jnp.asarray(alive), batches,
                                         np.int32(num_steps))
        out = jax.device_get(out)
        nonfinite, first = out.pop(steps.NONFINITE), out.pop(steps.FIRST_NONFINITE)
        for k in np.flatnonzero(alive & (nonfinite > 0)):
          if cfg.skip_nonfinite:
            self.skipped[k] += int(nonfinite[k])
          else:
            self.diverged_at[k] = int(first[k])
            self.writers[k].write(int(first[k]), {"train/diverged": 1})
            _log.warning("packed seed %d diverged at step %d; the others go on", k,
                         int(first[k]))
        step += num_steps
        self.throughput.add_steps(num_steps)
        self.ckpt.check_for_errors()
        if cadence.due(step, cfg.log_every, cfg):
          self._log_train(step, out, alive)
        if cadence.due(step, cfg.eval_every, cfg):
          self.evaluate(state, step)
          self.throughput.reset()
        stop.decide(at_stop_after_step=stop_after_step is not None and step >= stop_after_step)
        if cadence.due(step, cfg.checkpoint_every, cfg) or stop.signum is not None:
          data = {"seeds": [it.state() for it in self.iterators],
                  "diverged_at": list(self.diverged_at)}
          self.ckpt.save(step, state, data, {"packed": configs},
                         force=stop.signum is not None)
        if stop.signum is not None:
          _log.warning("packed group stopped at step %d; run again to resume", step)
          return state, step, True
    return state, step, False

  def _log_train(self, step, out, alive) -> None:
    rates = self.throughput.metrics()
    for k in np.flatnonzero(alive & self.alive()):
      logged = {key: float(value[k]) for key, value in out.items()}
      if self.train_cfg.skip_nonfinite:
        logged["train/skipped_steps"] = int(self.skipped[k])
      logged.update(rates)
      self.writers[k].write(step, logged)
      self.last[k].update(logged)
    self.throughput.reset()
