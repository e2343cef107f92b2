"""tfjax/training/checkpointing/checkpoint_manifest.py and the Checkpointer's use of it: a step with
a missing, cut-short or corrupted file is never restored; the run falls back to the newest good
step, and refuses to start from scratch when none is left. Also a save that fails (a full disk)."""

import errno
import os

import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.training.checkpointing import checkpoint, checkpoint_manifest
from tfjax.training.loop import divergence


def state(value):
  return {"params": {"w": jnp.full((64,), value, jnp.float32)}, "step": jnp.int32(value)}


ABSTRACT = {"params": {"w": jnp.zeros((64,), jnp.float32)}, "step": jnp.int32(0)}


def saved_steps(workdir, values=(1, 2)):
  ckpt = checkpoint.Checkpointer(str(workdir), keep=5)
  for v in values:
    ckpt.save(v, state(float(v)), {"position": v}, {})
  ckpt.wait()
  return ckpt


def flip_bytes(path, count=64):
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(max(0, size // 2 - count // 2))
    chunk = f.read(count)
    f.seek(-len(chunk), 1)
    f.write(bytes(b ^ 0xFF for b in chunk))


def largest_file(step_dir):
  paths = [os.path.join(r, n) for r, _, names in os.walk(step_dir) for n in names
           if n != checkpoint_manifest.MANIFEST]
  return max(paths, key=os.path.getsize)


def test_every_saved_step_has_a_manifest_that_verifies(tmp_path):
  ckpt = saved_steps(tmp_path)
  try:
    for step in (1, 2):
      step_dir = ckpt.step_dir(step)
      assert checkpoint_manifest.has_manifest(step_dir)
      assert checkpoint_manifest.verify(step_dir) == ""
      listed = checkpoint_manifest.read_entries(step_dir)
      assert "state/_METADATA" in listed and all(
          os.path.getsize(os.path.join(step_dir, rel)) == e["size"] for rel, e in listed.items())
  finally:
    ckpt.close()


@pytest.mark.parametrize("fault", ["flipped bytes", "no _METADATA", "truncated", "no manifest"])
def test_a_corrupt_newest_step_is_moved_aside_and_the_previous_one_restored(tmp_path, fault,
                                                                            caplog):
  ckpt = saved_steps(tmp_path)
  step_dir = ckpt.step_dir(2)
  if fault == "flipped bytes":
    flip_bytes(largest_file(os.path.join(step_dir, "state")))
    expected = "fails its checksum"
  elif fault == "no _METADATA":
    os.remove(os.path.join(step_dir, "state", "_METADATA"))
    expected = "state/_METADATA is missing"
  elif fault == "truncated":
    path = largest_file(step_dir)
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
    expected = "bytes, the manifest says"
  else:  # written by an older tfjax (or killed before the manifest): unverified but restorable
    os.remove(os.path.join(step_dir, checkpoint_manifest.MANIFEST))
    expected = None
  try:
    with caplog.at_level("WARNING"):
      step, restored, data_state = ckpt.restore_latest(ABSTRACT)
  finally:
    ckpt.close()
  if expected is None:
    assert step == 2 and int(restored["step"]) == 2
    return
  assert step == 1 and data_state == {"position": 1}
  np.testing.assert_array_equal(restored["params"]["w"], np.ones(64))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1 and "checkpoint step 2 is corrupt" in warnings[0] and (
      expected in warnings[0]), warnings
  assert os.listdir(tmp_path / "checkpoints") == ["1"]
  assert [n.split("-")[0] for n in os.listdir(tmp_path / "checkpoints_unreadable")] == ["2"]


def test_no_good_step_left_is_an_error_not_a_fresh_start(tmp_path):
  ckpt = saved_steps(tmp_path)
  try:
    for step in (1, 2):
      flip_bytes(largest_file(os.path.join(ckpt.step_dir(step), "state")))
    with pytest.raises(checkpoint.NoGoodCheckpoint, match=r"no good checkpoint left .*1, 2"):
      ckpt.restore_latest(ABSTRACT)
  finally:
    ckpt.close()


def test_a_failed_save_stops_with_one_error_removes_the_partial_step_and_keeps_the_rest(
    tmp_path, monkeypatch):
  ckpt = saved_steps(tmp_path, values=(1,))
  manager = ckpt._manager  # pylint: disable=protected-access

  def full_disk(step, args=None, force=False):  # what orbax leaves when a write hits ENOSPC
    partial = os.path.join(ckpt.directory, f"{step}.orbax-checkpoint-tmp-1234", "state")
    os.makedirs(partial)
    with open(os.path.join(partial, "d"), "wb") as f:
      f.write(b"x" * 100)
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(manager, "save", full_disk)
  try:
    with pytest.raises(checkpoint.SaveFailed) as raised:
      ckpt.save(2, state(2.0), {"position": 2}, {})
    message = str(raised.value)
    assert "saving checkpoint step 2" in message and "No space left on device" in message
    assert "ENOSPC" in message and "(1) are intact" in message
    assert raised.value.status == checkpoint.EXIT_SAVE_FAILED
    assert sorted(os.listdir(ckpt.directory)) == ["1"]  # the partial step is gone
    assert checkpoint_manifest.verify(ckpt.step_dir(1)) == ""
  finally:
    monkeypatch.undo()
    ckpt.close()


def test_a_leftover_partial_save_is_removed_at_the_next_start(tmp_path):
  ckpt = saved_steps(tmp_path, values=(1,))
  try:
    os.makedirs(os.path.join(ckpt.directory, "2.orbax-checkpoint-tmp-99", "state"))
    assert ckpt.remove_partial_saves() == ["2.orbax-checkpoint-tmp-99"]
    assert sorted(os.listdir(ckpt.directory)) == ["1"]
  finally:
    ckpt.close()


def test_a_non_finite_loss_right_after_a_restore_names_the_restored_step():
  suspect = str(divergence.Diverged(11, 10, 1e-3, restored_step=10))
  assert "first step after restoring checkpoint step 10" in suspect and "suspect" in suspect
  assert "Lower optimizer.lr" not in suspect
  assert "Lower optimizer.lr" in str(divergence.Diverged(12, 10, 1e-3))


def test_a_disk_without_room_for_the_next_step_stops_before_writing_it(tmp_path, monkeypatch):
  ckpt = saved_steps(tmp_path, values=(1,))
  need = sum(e["size"] for e in checkpoint_manifest.read_entries(ckpt.step_dir(1)).values())
  monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                      lambda path: shutil_usage(free=need // 2))
  try:
    with pytest.raises(checkpoint.SaveFailed, match=r"not enough disk space .* step 2 .*\(1\) "
                                                    r"are intact"):
      ckpt.save(2, state(2.0), {"position": 2}, {})
    assert sorted(os.listdir(ckpt.directory)) == ["1"]  # nothing of step 2 was written
  finally:
    monkeypatch.undo()
    ckpt.close()


def shutil_usage(free):
  import collections  # pylint: disable=import-outside-toplevel
  return collections.namedtuple("usage", "total used free")(10 * free, 9 * free, free)


def test_a_finished_save_is_sealed_at_the_next_step_boundary_not_the_next_save(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5)
  try:
    ckpt.save(1, state(1.0), {"position": 1}, {})
    ckpt._manager.wait_until_finished()  # pylint: disable=protected-access  (the save finishes)
    assert not checkpoint_manifest.has_manifest(ckpt.step_dir(1))
    ckpt.check_for_errors()  # what the loop calls after every step
    assert checkpoint_manifest.verify(ckpt.step_dir(1)) == "" and (
        checkpoint_manifest.has_manifest(ckpt.step_dir(1)))
  finally:
    ckpt.close()
