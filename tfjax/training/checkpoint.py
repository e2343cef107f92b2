"""Orbax checkpoints: train state (params, optimizer state, step, rng), data position and config.

Each checkpoint is one orbax step directory (written to a temporary name and renamed when complete,
so a crash never leaves a half-written step under a final name). Restore tries the newest step
first; if it is corrupt or partial it warns and falls back to the previous one. Nothing is ever
deleted here except by `keep` (orbax's max_to_keep) after a successful save.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from tfjax.training import divergence
from tfjax.training.trees import path_names

_log = logging.getLogger(__name__)


class Checkpointer:
  """`use_ocdbt=False` writes each array as its own TensorStore array instead of one OCDBT
  database: TensorStore then holds one array's write buffers at a time rather than every
  array's until the database commits (about 0.6x the state on top of it), which is what a
  one-off write of a large state (tfjax/hf/importer.py) needs. Restore reads either format."""

  def __init__(self, workdir: str, keep: int = 3, use_ocdbt: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self._keep = keep
    self._use_ocdbt = use_ocdbt
    self._manager = self._open()

  def _open(self):
    return ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True),
        item_handlers={"state": ocp.StandardCheckpointHandler(use_ocdbt=self._use_ocdbt),
                       "data": ocp.JsonCheckpointHandler(),
                       "config": ocp.JsonCheckpointHandler()})

  def _quarantine(self, step: int) -> str:
    """Moves an unreadable step out of the way (kept for inspection, never deleted), so the run
    can write that step number again."""
    target = os.path.join(os.path.dirname(self.directory), "checkpoints_unreadable",
                          f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if jax.process_index() == 0:
      shutil.move(os.path.join(self.directory, str(step)), target)
    self._manager.close()
    self._manager = self._open()
    return target

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict, config_dict: dict,
           force: bool = False) -> None:
    if step in self._manager.all_steps():
      return  # already saved (e.g. the final step coincides with a periodic one)
    bad = divergence.nonfinite_leaves(state)
    if bad:  # the newest checkpoint must stay one a run can resume from
      raise ValueError(
          f"refusing to save checkpoint step {step} in {self.directory}: {', '.join(bad)} hold "
          "NaN/inf values; the earlier checkpoints are kept (see tfjax/training/divergence.py)")
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_one_replica(state)), data=ocp.args.JsonSave(data_state),
        config=ocp.args.JsonSave(config_dict)), force=force)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def restore_latest(self, abstract_state: Any) -> Optional[tuple[int, Any, dict]]:
    """(step, state, data_state) of the newest readable checkpoint, or None if there is none.

    `abstract_state` is a tree of jax.ShapeDtypeStruct (with .sharding) giving the layout to
    restore into, so a checkpoint written on one mesh restores onto another.
    """
    steps = self.steps()
    for step in reversed(steps):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return step, restored["state"], dict(restored["data"])
      except Exception as e:  # pylint: disable=broad-except
        different = self._layout_difference(step, abstract_state)
        if different:  # a readable checkpoint of another model: not ours to move aside
          raise ValueError(
              f"checkpoint step {step} in {self.directory} holds a different model or optimizer "
              f"state than this config builds ({different}); it is left untouched. Resume with "
              "the config the run was written with (its config.json), or use a new --workdir"
          ) from e
        earlier = [s for s in steps if s < step]
        if not earlier:
          raise ValueError(
              f"checkpoint step {step} in {self.directory} is unreadable ({type(e).__name__}: "
              f"{e}) and there is no earlier one; move the workdir aside to start fresh") from e
        moved = self._quarantine(step)
        _log.warning("checkpoint step %d is corrupt or partial (%s: %s); moved it to %s and "
                     "falling back to step %d", step, type(e).__name__, e, moved, earlier[-1])
    return None

  def restore_params(self, abstract_params: Any) -> Optional[tuple[int, Any]]:
    """(step, params) of the newest checkpoint whose params read back, or None if there is none;
    only the params are read (no optimizer state, no data position), into the layout of
    `abstract_params` (ShapeDtypeStructs with shardings). Read-only: an unreadable step is
    skipped with a warning, never moved (the run may still be writing)."""
    reader = ocp.CheckpointManager(self.directory,
                                   item_handlers={"state": ocp.PyTreeCheckpointHandler()})
    try:
      item = {"params": abstract_params}
      args = ocp.args.PyTreeRestore(
          item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
          partial_restore=True)
      for step in reversed(self.steps()):
        try:
          restored = reader.restore(step, args=ocp.args.Composite(state=args))
          return step, restored["state"]["params"]
        except Exception as e:  # pylint: disable=broad-except
          _log.warning("checkpoint step %d: params unreadable (%s: %s); trying an earlier step",
                       step, type(e).__name__, e)
      return None
    finally:
      reader.close()

  def _layout_difference(self, step: int, abstract_state: Any) -> str:
    """'' if the step's metadata is unreadable (corrupt) or lists the same arrays (path, shape,
    dtype) as `abstract_state`; else a short description of what differs."""
    try:
      saved = _signature(self._manager.item_metadata(step)["state"])
    except Exception:  # pylint: disable=broad-except
      return ""
    wanted = _signature(abstract_state)
    if saved == wanted:
      return ""
    only_saved, only_wanted = sorted(saved - wanted), sorted(wanted - saved)
    return (f"only in the checkpoint: {only_saved[:2]}{' ...' if len(only_saved) > 2 else ''}; "
            f"only in this config: {only_wanted[:2]}{' ...' if len(only_wanted) > 2 else ''}")

  def close(self) -> None:
    self._manager.close()


def newest_params(workdir: str, abstract_params: Any) -> Optional[tuple[int, Any]]:
  """`Checkpointer.restore_params` of run `workdir` for a one-off read (the checkpointer is closed
  after): (step, params) of its newest readable checkpoint, or None."""
  ckpt = Checkpointer(workdir)
  try:
    return ckpt.restore_params(abstract_params)
  finally:
    ckpt.close()


def _one_replica(state: Any) -> Any:
  """In a single-process run, each array replicated over several devices as its copy on one.

  Why: orbax splits the write of a replicated array among its replicas and compiles a slicing
  program per array shape for that (a cost on a run's first save; docs/benchmarks.md), but one
  process writes every slice anyway. The values written are the same, and restoring places
  them by the target's shardings, not the saved ones. Multi-process runs keep orbax's split
  across hosts."""
  if jax.process_count() > 1:
    return state

  def one(x):
    if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 and (
        x.sharding.is_fully_replicated):
      return x.addressable_data(0)
    return x
  return jax.tree.map(one, state)


def _signature(tree: Any) -> set:
  """{(path, shape, dtype)} of a state tree or of its checkpoint metadata. Paths are normalized
  (a dataclass field or namedtuple attribute is saved as a dict key) so the two compare."""
  return {(path_names(path), tuple(leaf.shape), str(leaf.dtype))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
