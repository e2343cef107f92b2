"""Runs the 8-device scale-out checks in ONE process and prints one JSON line (last on stdout).

  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python tests/scaleout_helper.py WORKDIR

Started as a subprocess by tests/training/test_sharding.py so the rest of the suite keeps one device.
Reports, for tests/scaleout_config.py:
  losses[mesh]   5 training-step losses on each mesh (data, fsdp, tensor), on one device ('1'), and
                 on (2,2,2) with 2 micro-batches ('2,2,2/accum2');
  shards[mesh]   per-device shard shapes of a few parameters and their Adam moments;
  resumed        losses of steps 4, 5 after saving at step 3 on (8,1,1) and resuming on (2,2,2).
"""

import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tfjax.training.checkpointing import checkpoint  # pylint: disable=wrong-import-position
from tfjax.training.loop import experiment, train  # pylint: disable=wrong-import-position
from tfjax.training.parallel import sharding  # pylint: disable=wrong-import-position
import scaleout_config  # pylint: disable=wrong-import-position

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 2, 4))
# Less XLA:CPU compile effort (about half the compile time); the tests compile ~a dozen programs.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
_T0 = time.time()


def _tick(what):
  print(f"[{time.time() - _T0:6.1f}s] {what}", file=sys.stderr, flush=True)


def config_for(mesh):
  config = scaleout_config.get_config()
  config.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  return config


def run_steps(config, mesh, num_steps):
  """The loop's own pieces (state_layout, jit_train_step, BatchPlacement) for `num_steps` steps
  on `mesh`; returns the losses and the final state."""
  exp = experiment.prepare(config)
  placement = sharding.BatchPlacement.create(mesh, sharding.rules(config))
  layout = experiment.state_layout(exp, placement)
  state = layout.init()
  train_step = experiment.jit_train_step(exp, placement, layout.shardings)
  batch_size = config.train.batch_size
  rows = placement.process_rows(batch_size)
  losses = []
  with placement.axis_rules():
    for index in range(num_steps):
      batch = placement.put(exp.dataset.train_batch(index, batch_size, *rows))
      if index == 0:
        hlo = train_step.lower(state, batch).compile().as_text()
        ALL_REDUCES.setdefault(",".join(map(str, list(mesh.shape.values())[:3])), [
            line.split("=")[1].split("all-reduce(")[0].strip()
            for line in hlo.splitlines() if " all-reduce(" in line])
      state, metrics = train_step(state, batch)
      losses.append(float(metrics["train/loss"]))
  return losses, state


ALL_REDUCES = {}  # mesh -> result shapes of the compiled train step's all-reduce ops


def shard_shapes(state):
  """{path: [global shape, [shard shapes of every device]]} of params and Adam moments."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    out[name] = [list(leaf.shape), [list(s.data.shape) for s in leaf.addressable_shards]]
  return out


def read_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["train/loss"] for r in map(json.loads, f) if "train/loss" in r}


def replicated_checkpoint_round_trip(workdir):
  """Saves a state replicated over the 8 devices (written from one replica) and restores it."""
  config = config_for((8, 1, 1))
  exp = experiment.prepare(config)
  layout = experiment.state_layout(exp, sharding.BatchPlacement.for_config(config))
  state, abstract = layout.init(), layout.abstract
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "replicated"))
  ckpt.save(1, state, {"position": 7}, {})
  ckpt.wait()
  step, restored, data_state = ckpt.restore_latest(abstract)
  ckpt.close()
  pairs = list(zip(jax.tree.leaves(state), jax.tree.leaves(restored), jax.tree.leaves(abstract)))
  return {"step": step, "data": data_state,
          "equal": all(np.array_equal(s, r) for s, r, _ in pairs),
          "target_shardings": all(r.sharding == a.sharding for _, r, a in pairs),
          "devices": sorted({len(r.sharding.device_set) for _, r, _ in pairs})}


def main(workdir):
  assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
  # Identical computations compiled twice (run_steps, then the same mesh in train_and_evaluate)
  # compile once.
  jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  report = {"losses": {}, "shards": {}}
  single = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  config = config_for((8, 1, 1))
  report["losses"]["1"], _ = run_steps(config, single, config.train.num_steps)
  _tick("one device")
  for mesh in MESHES:
    config = config_for(mesh)
    name = ",".join(map(str, mesh))
    report["losses"][name], state = run_steps(config, sharding.make_mesh(config.mesh),
                                              config.train.num_steps)
    report["shards"][name] = shard_shapes(state)
    _tick(name)
  report["all_reduces"] = dict(ALL_REDUCES)
  config = config_for((2, 2, 2))  # 2 micro-batches of 4 rows, each split over the 4 batch shards
  config.optimizer.grad_accum_steps = 2
  report["losses"]["2,2,2/accum2"], _ = run_steps(config, sharding.make_mesh(config.mesh),
                                                  config.train.num_steps)
  _tick("2,2,2 grad accumulation")
  config = config_for((1, 8, 1))  # pure FSDP: where the parameters and moments live
  exp = experiment.prepare(config)
  state = experiment.state_layout(exp, sharding.BatchPlacement.for_config(config)).init()
  report["shards"]["1,8,1"] = shard_shapes(state)
  _tick("1,8,1 init")
  # Checkpoint written on (8,1,1), restored onto (2,2,2), training continues.
  run = os.path.join(workdir, "resume")
  train.train_and_evaluate(config_for((8, 1, 1)), run, stop_after_step=3)
  report["saved_steps"] = sorted(os.listdir(os.path.join(run, "checkpoints")))
  _tick("saved on 8,1,1")
  train.train_and_evaluate(config_for((2, 2, 2)), run)
  report["resumed"] = read_losses(run)
  _tick("resumed on 2,2,2")
  report["replicated_checkpoint"] = replicated_checkpoint_round_trip(workdir)
  _tick("replicated checkpoint")
  print(json.dumps(report))


if __name__ == "__main__":
  main(sys.argv[1])
