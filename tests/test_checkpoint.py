"""tfjax/training/checkpoint.py: what Checkpointer.save refuses to write."""

import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.training import checkpoint


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
