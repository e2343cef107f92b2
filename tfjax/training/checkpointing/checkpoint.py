"""Orbax checkpoints: train state (params, optimizer state, step, rng), data position and config.

Each checkpoint is one orbax step directory (written to a temporary name and renamed when complete,
so a crash never leaves a half-written step under a final name), sealed by a manifest of its
files' sizes and checksums (tfjax/training/checkpointing/checkpoint_manifest.py) once orbax has
finalized it. Restore verifies the newest step against its manifest before reading it; a step with a
missing, cut-short or corrupted file is moved aside to `checkpoints_unreadable/` with one warning
and the previous step is tried. A failed save (a full disk) raises SaveFailed: the run stops at
once, the partial `*-tmp` directory is removed, and the earlier steps stay as they were. Nothing is
ever deleted here except by `keep` (orbax's max_to_keep) after a successful save, and leftover
`*-tmp` directories of a killed save (`remove_partial_saves`).
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import shutil
import time
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from tfjax.training.checkpointing import checkpoint_manifest
from tfjax.training.entry import cli
from tfjax.training.loop import divergence
from tfjax.training.checkpointing.trees import path_names

_log = logging.getLogger(__name__)

EXIT_SAVE_FAILED = 5  # exit status of a run stopped because a checkpoint could not be written
_PARTIAL_MARK = "-tmp"  # orbax writes a step to "<step>.orbax-checkpoint-tmp[-N]" first


class _NoOcdbtMergeNotice(logging.Filter):
  """Drops orbax's "Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint subdirs
  found in DIR" WARNING for the directories of Checkpointers made with use_ocdbt=False.

  Why: orbax's save finalizer always tries to merge per-process OCDBT files, also when the
  handler writes none (use_ocdbt=False, the HF import's format), and warns each time; for those
  directories the warning is expected and says nothing. Other directories keep it (there it
  would mean lost OCDBT files)."""

  def __init__(self):
    super().__init__()
    self.directories: set[str] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if "Skipping merge of OCDBT checkpoints" not in str(record.msg):
      return True
    args = record.args if isinstance(record.args, tuple) else ()
    where = str(args[-1]) if args else ""
    return not any(where.startswith(d + os.sep) for d in self.directories)


_NO_OCDBT_NOTICE = _NoOcdbtMergeNotice()
logging.getLogger("absl").addFilter(_NO_OCDBT_NOTICE)  # orbax logs through absl.logging


class SaveFailed(cli.UserFacing):
  """A checkpoint could not be written (e.g. the disk is full): the run stops at once."""
  status = EXIT_SAVE_FAILED


class NoGoodCheckpoint(ValueError):
  """Every checkpoint step of a run failed verification: the run refuses to start from scratch."""


class Checkpointer:
  """`use_ocdbt=False` writes each array as its own TensorStore array instead of one OCDBT
  database: TensorStore then holds one array's write buffers at a time rather than every
  array's until the database commits (the peak memory with and without it:
  docs/benchmarks/hf_import.md), which is what a one-off write of a large state
  (tfjax/hf/importer.py) needs. Restore reads either format."""

  def __init__(self, workdir: str, keep: int = 3, use_ocdbt: bool = True):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self._keep = keep
    self._use_ocdbt = use_ocdbt
    if not use_ocdbt:
      _NO_OCDBT_NOTICE.directories.add(self.directory)
    self._manager = self._open()
    self._unsealed: list[int] = []  # steps saved by this process whose manifest is not written

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

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def remove_partial_saves(self) -> list[str]:
    """Removes the `*-tmp` directories a killed or failed save left in the checkpoint directory
    (never a finished step); returns their names. Call only while holding the workdir lock."""
    if jax.process_index() != 0 or not os.path.isdir(self.directory):
      return []
    partial = sorted(n for n in os.listdir(self.directory) if _PARTIAL_MARK in n)
    for name in partial:
      shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    if partial:
      _log.warning("removed %d partial checkpoint save(s) in %s: %s", len(partial),
                   self.directory, ", ".join(partial))
    return partial

  def save(self, step: int, state: Any, data_state: dict, config_dict: dict,
           force: bool = False) -> None:
    """Starts saving `step` (orbax writes it in the background); the previous save is finished
    and sealed with its manifest first. Raises SaveFailed if a write fails."""
    self.wait()
    if step in self._manager.all_steps():
      return  # already saved (e.g. the final step coincides with a periodic one)
    bad = divergence.nonfinite_leaves(state)
    if bad:  # the newest checkpoint must stay one a run can resume from
      raise ValueError(
          f"refusing to save checkpoint step {step} in {self.directory}: {', '.join(bad)} hold "
          "NaN/inf values; the earlier checkpoints are kept "
          "(see tfjax/training/loop/divergence.py)")
    self._check_free_space(step, state)
    with self._save_errors(step):
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(_one_replica(state)), data=ocp.args.JsonSave(data_state),
          config=ocp.args.JsonSave(config_dict)), force=force)
    self._unsealed.append(step)

  def wait(self) -> None:
    """Waits for the save in flight and seals each finished step with its manifest."""
    with self._save_errors(self._unsealed[-1] if self._unsealed else None):
      self._manager.wait_until_finished()
      if jax.process_index() == 0:  # one writer; the manifest lists every process's files
        for step in self._unsealed:
          if os.path.isdir(self.step_dir(step)):  # (max_to_keep may have removed it already)
            checkpoint_manifest.write(self.step_dir(step))
    self._unsealed = []

  def _save_errors(self, step: Optional[int]):
    return _SaveErrors(self, step)

  def check_for_errors(self) -> None:
    """Raises SaveFailed if the save running in the background has failed, and seals a save
    that has finished. The loop calls it at every step boundary, so a failed save stops
    training at once and a finished step gets its manifest then, not at the next save (a kill
    in between would leave it unverified). Multi-process runs seal at the next save: finishing
    a save there is a collective step that every process must take together."""
    with self._save_errors(self._unsealed[-1] if self._unsealed else None):
      self._manager.check_for_errors()
    if self._unsealed and jax.process_count() == 1 and (
        not self._manager.is_saving_in_progress()):
      self.wait()

  def _check_free_space(self, step: int, state: Any) -> None:
    """Raises SaveFailed, before anything is written, when the disk has less room than the
    step needs (the newest step's files, else the state's bytes, plus 10%).

    Why: a write that runs out of space mid-way fails inside orbax's background threads, which
    log a traceback per pending write; checking first makes the common full disk one clean
    error and no partial directory."""
    steps = self.steps()
    try:
      need = sum(e["size"] for e in checkpoint_manifest.read_entries(
          self.step_dir(steps[-1])).values()) if steps else None
    except (OSError, ValueError, KeyError):
      need = None
    if need is None:
      need = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
    need = int(need * 1.1)
    free = shutil.disk_usage(self.directory).free
    if free < need:
      raise SaveFailed(
          f"not enough disk space to save checkpoint step {step} in {self.directory}: "
          f"{free / 2**20:.1f} MiB free, a step needs about {need / 2**20:.1f} MiB; training "
          f"stopped there. The earlier checkpoints ({', '.join(map(str, steps)) or 'none'}) are "
          "intact: free space (or lower train.keep_checkpoints) and run the same command to "
          "resume from the newest")

  def restore_latest(self, abstract_state: Any) -> Optional[tuple[int, Any, dict]]:
    """(step, state, data_state) of the newest readable checkpoint, or None if there is none.

    `abstract_state` is a tree of jax.ShapeDtypeStruct (with .sharding) giving the layout to
    restore into, so a checkpoint written on one mesh restores onto another.
    """
    steps = self.steps()
    moved_aside = []
    for step in reversed(steps):
      # Presence and sizes first (instant); the checksums read every file, on a thread beside
      # orbax's own read of them, and the restored state is used only if they all match.
      fault = checkpoint_manifest.verify(self.step_dir(step), checksums=False)
      restored = None
      if not fault:
        # Another model's checkpoint is refused from its metadata, before orbax reads an array:
        # a restore that fails on one array's shape leaves the reads of the others suspended,
        # and each raises out of its close when collected (an unraisable exception, later).
        self._refuse_another_model(step, abstract_state, dtypes=False)  # orbax casts dtypes
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
          checksums = pool.submit(checkpoint_manifest.verify_checksums, self.step_dir(step))
          try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
            error = None
          except Exception as e:  # pylint: disable=broad-except
            error = e
          fault = checksums.result()
      if fault:
        moved = self._quarantine(step)
        moved_aside.append(step)
        earlier = [s for s in steps if s < step]
        _log.warning("checkpoint step %d is corrupt: %s; moved it to %s%s", step, fault, moved,
                     f" and falling back to step {earlier[-1]}" if earlier else "")
        continue
      try:
        if error is not None:
          raise error
        return step, restored["state"], dict(restored["data"])
      except Exception as e:  # pylint: disable=broad-except
        self._refuse_another_model(step, abstract_state, e)
        earlier = [s for s in steps if s < step]
        if not earlier:
          raise NoGoodCheckpoint(
              f"checkpoint step {step} in {self.directory} is unreadable ({type(e).__name__}: "
              f"{e}) and there is no earlier one; move the workdir aside to start fresh") from e
        moved = self._quarantine(step)
        _log.warning("checkpoint step %d is corrupt or partial (%s: %s); moved it to %s and "
                     "falling back to step %d", step, type(e).__name__, e, moved, earlier[-1])
    if moved_aside:  # never start from scratch over a run's progress without being told to
      raise NoGoodCheckpoint(
          f"no good checkpoint left in {self.directory}: step(s) "
          f"{', '.join(map(str, sorted(moved_aside)))} failed verification and were moved to "
          f"{os.path.join(os.path.dirname(self.directory), 'checkpoints_unreadable')}; the run "
          "will not restart from scratch by itself: move the workdir aside (or use a new "
          "--workdir) to start fresh")
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
        fault = checkpoint_manifest.verify(self.step_dir(step))
        if fault:
          _log.warning("checkpoint step %d is corrupt (%s); trying an earlier step", step, fault)
          continue
        try:
          restored = reader.restore(step, args=ocp.args.Composite(state=args))
          return step, restored["state"]["params"]
        except Exception as e:  # pylint: disable=broad-except
          _log.warning("checkpoint step %d: params unreadable (%s: %s); trying an earlier step",
                       step, type(e).__name__, e)
      return None
    finally:
      reader.close()

  def _refuse_another_model(self, step: int, abstract_state: Any,
                            cause: Optional[BaseException] = None, dtypes: bool = True) -> None:
    """Raises ValueError if step's metadata lists other arrays (paths, shapes and, with
    `dtypes`, dtypes) than `abstract_state`: a readable checkpoint of another model, not ours to
    move aside."""
    different = self._layout_difference(step, abstract_state, dtypes)
    if different:
      raise ValueError(
          f"checkpoint step {step} in {self.directory} holds a different model or optimizer "
          f"state than this config builds ({different}); it is left untouched. Resume with "
          "the config the run was written with (its config.json), or use a new --workdir"
      ) from cause

  def _layout_difference(self, step: int, abstract_state: Any, dtypes: bool = True) -> str:
    """'' if the step's metadata is unreadable (corrupt) or lists the same arrays (path, shape,
    dtype) as `abstract_state`; else a short description of what differs."""
    try:
      saved = _signature(self._manager.item_metadata(step)["state"], dtypes)
    except Exception:  # pylint: disable=broad-except
      return ""
    wanted = _signature(abstract_state, dtypes)
    if saved == wanted:
      return ""
    only_saved, only_wanted = sorted(saved - wanted), sorted(wanted - saved)
    return (f"only in the checkpoint: {only_saved[:2]}{' ...' if len(only_saved) > 2 else ''}; "
            f"only in this config: {only_wanted[:2]}{' ...' if len(only_wanted) > 2 else ''}")

  def close(self) -> None:
    self._manager.close()


class _SaveErrors:
  """Turns an OSError (a full disk, a lost mount) raised by a save into SaveFailed, after
  removing the save's partial directory; the earlier, sealed steps are left as they were."""

  def __init__(self, checkpointer: Checkpointer, step: Optional[int]):
    self._ckpt, self._step = checkpointer, step

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    cause = exc
    while cause is not None and not isinstance(cause, OSError):
      cause = cause.__cause__ or cause.__context__
    if cause is None:
      return False
    self._ckpt._unsealed = []  # pylint: disable=protected-access
    self._ckpt.remove_partial_saves()
    kept = [s for s in self._ckpt.steps() if s != self._step]
    what = errno.errorcode.get(cause.errno, "") if cause.errno else ""
    reason = f"{cause.strerror or cause}" + (f" [{what}]" if what else "")
    raise SaveFailed(
        f"saving checkpoint step {self._step} in {self._ckpt.directory} failed: {reason}; "
        f"training stopped there. The earlier checkpoints ({', '.join(map(str, kept)) or 'none'}) "
        "are intact: free space (or lower train.keep_checkpoints) and run the same command to "
        "resume from the newest") from exc


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
  program per array shape for that (a cost on a run's first save;
  docs/benchmarks/cpu_training.md), but one process
  writes every slice anyway. The values written are the same, and restoring places
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


def _signature(tree: Any, dtypes: bool = True) -> set:
  """{(path, shape, dtype)} (dtype left out without `dtypes`) of a state tree or of its
  checkpoint metadata. Paths are normalized (a dataclass field or namedtuple attribute is saved
  as a dict key) so the two compare."""
  return {(path_names(path), tuple(leaf.shape)) + ((str(leaf.dtype),) if dtypes else ())
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
