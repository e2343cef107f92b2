"""tfjax/training/checkpointing/checkpoint.py: what Checkpointer.save refuses to write."""

import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.training.checkpointing import checkpoint
import gc
import os
import sys
import threading
from tfjax.training.loop import train
from run_helpers import read_metrics, tiny_config, train_losses



def state(value):
  return {"params": {"w": jnp.full((3,), value, jnp.float32), "step": jnp.int32(1)},
          "opt": {"mu": jnp.zeros((2,), jnp.float32)}}


def test_save_refuses_a_non_finite_state_and_keeps_the_last_good_one(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  try:
    ckpt.save(1, state(1.0), {"position": 1}, {})
    ckpt.wait()
    for bad in (np.nan, np.inf):
      with pytest.raises(ValueError, match=r"refusing to save checkpoint step 2 .*params\.w"):
        ckpt.save(2, state(bad), {"position": 2}, {})
    ckpt.wait()
    assert ckpt.steps() == [1]
    step, restored, data_state = ckpt.restore_latest(
        {"params": {"w": jnp.zeros((3,)), "step": jnp.int32(0)}, "opt": {"mu": jnp.zeros((2,))}})
    assert step == 1 and data_state == {"position": 1}
    np.testing.assert_array_equal(restored["params"]["w"], [1.0, 1.0, 1.0])
  finally:
    ckpt.close()


def test_corrupt_latest_checkpoint_falls_back_and_is_kept(tmp_path, caplog):
  config = tiny_config(num_steps=8)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir, stop_after_step=8)
  expected = train_losses(workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckpt_dir)) == ["4", "8"]
  # Corrupt step 8 as a bad disk would: flip 64 bytes inside its largest array file. orbax reads
  # such a file back without complaint; only the step's manifest (checksums) tells.
  data_dir = os.path.join(ckpt_dir, "8", "state", "ocdbt.process_0", "d")
  largest = max(os.listdir(data_dir), key=lambda n: os.path.getsize(os.path.join(data_dir, n)))
  with open(os.path.join(data_dir, largest), "r+b") as f:
    f.seek(os.path.getsize(os.path.join(data_dir, largest)) // 2)
    chunk = f.read(64)
    f.seek(-len(chunk), 1)
    f.write(bytes(b ^ 0xFF for b in chunk))
  with caplog.at_level("WARNING"):
    train.train_and_evaluate(config, workdir)  # same config: resumes from step 4
  assert "checkpoint step 8 is corrupt" in caplog.text and "checksum" in caplog.text
  quarantined = os.listdir(os.path.join(workdir, "checkpoints_unreadable"))
  assert len(quarantined) == 1 and quarantined[0].startswith("8-")
  assert sorted(os.listdir(ckpt_dir), key=int) == ["4", "8"]
  # Steps 5..8 were retrained from step 4 and gave the same losses as the first time.
  retrained = [m for m in read_metrics(workdir) if "train/loss" in m][-4:]
  assert [m["step"] for m in retrained] == [5, 6, 7, 8]
  for m in retrained:
    assert m["train/loss"] == expected[m["step"]]


def test_resuming_with_a_different_model_is_refused(tmp_path):
  config = tiny_config(num_steps=2)
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config.model.d_model = 48
  with pytest.raises(ValueError, match="different model"):
    train.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_checkpoint_of_another_optimizer_is_a_clear_error_and_left_untouched(tmp_path):
  # The model matches (config.json allows the resume), but the optimizer chain does not: the
  # checkpoint is readable, so it must not be mistaken for a corrupt one and moved aside.
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(tiny_config(num_steps=4), workdir)
  changed = tiny_config(num_steps=8)
  changed.optimizer.clip_norm = 0.0  # drops the clipping transform: the state tree changes
  with pytest.raises(ValueError, match="different model or optimizer state"):
    train.train_and_evaluate(changed, workdir)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["4"]
  assert not os.path.exists(os.path.join(workdir, "checkpoints_unreadable"))
  # The restore failed while the steps were compiling in the background: the failing run waited
  # for those compiles instead of leaving them running (and logging) into the caller's next work.
  assert not [t.name for t in threading.enumerate() if t.name.startswith("tfjax-compile")]



def test_a_checkpoint_of_another_model_is_refused_before_orbax_reads_it(tmp_path, monkeypatch):
  """A checkpoint whose arrays differ in shape from the state to restore (another model, in a
  workdir whose config.json does not tell) is refused from its metadata: orbax never starts
  reading. When it did, the failing array's read left the matching arrays' reads suspended, and
  each raised out of its close when collected (42 PytestUnraisableExceptionWarning tracebacks of
  orbax's _read_array_index_and_device_put in a suite run)."""
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  try:
    ckpt.save(1, state(1.0), {"position": 1}, {})
    ckpt.wait()
    reads, unraisable = [], []
    real_restore = ckpt._manager.restore  # pylint: disable=protected-access
    monkeypatch.setattr(ckpt._manager, "restore",  # pylint: disable=protected-access
                        lambda *a, **k: reads.append(a) or real_restore(*a, **k))
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    other = {"params": {"w": jnp.zeros((5,)), "step": jnp.int32(0)}, "opt": {"mu": jnp.zeros((2,))}}
    with pytest.raises(ValueError, match=r"checkpoint step 1 .* holds a different model .*"
                                         r"only in the checkpoint: \[\(\('params', 'w'\), \(3,\)"):
      ckpt.restore_latest(other)
    assert reads == []
    # The same shapes in another dtype still restore (orbax casts): the check reads shapes only.
    step, restored, _ = ckpt.restore_latest(
        {"params": {"w": jnp.zeros((3,), jnp.bfloat16), "step": jnp.int32(0)},
         "opt": {"mu": jnp.zeros((2,))}})
    assert step == 1 and restored["params"]["w"].dtype == jnp.bfloat16 and len(reads) == 1
    gc.collect()
    assert [str(u.object) for u in unraisable] == []
    assert ckpt.steps() == [1]
  finally:
    ckpt.close()
