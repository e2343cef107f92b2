"""Multi-process (multi-host) start-up: `jax.distributed.initialize` from flags or the environment.

Every process of a multi-host run executes the same program; `initialize` must run before anything
touches a JAX device. Where the settings come from, first match wins:

  1. explicit arguments (tfjax.training.entry.main's --coordinator_address, --num_processes,
     --process_id, --local_device_ids flags);
  2. the environment: JAX_COORDINATOR_ADDRESS (read by JAX itself), JAX_NUM_PROCESSES,
     JAX_PROCESS_ID, JAX_LOCAL_DEVICE_IDS;
  3. a cluster JAX detects by itself (SLURM `srun`, Open MPI `mpirun`, Cloud TPU, ...): plain
     `jax.distributed.initialize()` fills in everything.

With none of these the run is single-process and nothing happens. On CPU the cross-process
collectives go through gloo (`jax_cpu_collectives_implementation`), set before initializing.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

import jax

from tfjax.nn.choices import one_of

_log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name)
  return int(value) if value not in (None, "") else None


def cluster_detected() -> Optional[str]:
  """Name of a multi-process launcher found in the environment, or None.

  Only launches with more than one task count: a single-task `srun` stays single-process.
  """
  if int(os.environ.get("SLURM_NTASKS", os.environ.get("SLURM_STEP_NUM_TASKS", "1")) or 1) > 1 \
      and "SLURM_PROCID" in os.environ:
    return "slurm"
  if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
    return "ompi"
  return None


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None,
               local_device_ids: Optional[Sequence[int]] = None, *, mode: str = "auto",
               cpu_collectives: str = "gloo", timeout_s: int = 300) -> bool:
  """Initializes jax.distributed if this is a multi-process run. True when it did (or had).

  mode: 'auto' initializes when settings are given (arguments or environment) or a cluster is
  detected; 'on' always calls it (plain jax.distributed.initialize() auto-detection when nothing
  is given); 'off' never does.
  """
  one_of("distributed mode", mode, MODES)
  if jax.distributed.is_initialized():
    return True
  if mode == "off":
    return False
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  if local_device_ids is None and os.environ.get("JAX_LOCAL_DEVICE_IDS"):
    local_device_ids = [int(i) for i in os.environ["JAX_LOCAL_DEVICE_IDS"].split(",")]
  explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
  cluster = cluster_detected()
  if mode == "auto" and not explicit and cluster is None:
    return False
  if explicit and None in (coordinator_address, num_processes, process_id) and cluster is None:
    raise ValueError(
        "multi-process run: give all of --coordinator_address (host:port of process 0), "
        f"--num_processes and --process_id (got {coordinator_address!r}, {num_processes!r}, "
        f"{process_id!r}), or launch under SLURM/Open MPI for auto-detection")
  if cpu_collectives:
    try:  # only the CPU backend reads it; without it CPU collectives across processes fail
      jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    except (AttributeError, KeyError, ValueError) as e:  # pragma: no cover - option renamed
      _log.warning("could not select CPU collectives %r: %s", cpu_collectives, e)
  kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                process_id=process_id, local_device_ids=local_device_ids)
  kwargs = {k: v for k, v in kwargs.items() if v is not None}
  jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s)
  _log.info("jax.distributed: process %d of %d (%s), %d local / %d global devices",
            jax.process_index(), jax.process_count(), cluster or "explicit",
            jax.local_device_count(), jax.device_count())
  return True


def shutdown() -> None:
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()
