"""tfjax/runtime/distributed.py: where jax.distributed settings come from (flags, environment,
cluster)."""


import pytest

from test_multiprocess import _LAUNCH_ENV



def test_distributed_settings_come_from_flags_environment_or_cluster(monkeypatch):
  from tfjax.runtime import distributed  # pylint: disable=import-outside-toplevel
  for key in _LAUNCH_ENV:
    monkeypatch.delenv(key, raising=False)
  calls = []
  monkeypatch.setattr("jax.distributed.initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr("jax.distributed.is_initialized", lambda: False)
  assert distributed.initialize() is False and not calls  # plain single-process run
  assert distributed.initialize("h:1", 2, 0, mode="off") is False and not calls
  with pytest.raises(ValueError, match="--num_processes"):
    distributed.initialize("10.0.0.1:8476")  # incomplete, and no cluster to fill it in
  assert distributed.initialize("10.0.0.1:8476", 2, 1)
  assert calls[-1]["coordinator_address"] == "10.0.0.1:8476" and calls[-1]["process_id"] == 1
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.2:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert distributed.initialize()
  assert (calls[-1]["num_processes"], calls[-1]["process_id"]) == (4, 3)
  for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(key)
  monkeypatch.setenv("SLURM_NTASKS", "1")
  monkeypatch.setenv("SLURM_PROCID", "0")
  assert distributed.initialize() is False  # a one-task srun stays single-process
  monkeypatch.setenv("SLURM_NTASKS", "16")
  assert distributed.cluster_detected() == "slurm"
  assert distributed.initialize()
  assert "coordinator_address" not in calls[-1]  # left to JAX's SLURM auto-detection
