"""Compile-only devices of a target, from a host that has none of them.

TPU: libtpu (`pip install -e ".[tpu-aot]"`) describes any slice; v4 and v5p chips are one
megacore device each. GPU: the CUDA plugin (`pip install -e ".[cuda-aot]"`) builds devices from
XLA's GpuTargetConfigProto of the GPU (tfjax/aot/specs). Neither needs the hardware; JAX must
run with JAX_PLATFORMS=cpu so that it never tries to open a TPU or GPU (tfjax.aot.main sets it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from tfjax.aot.targets import Target

_MEGACORE = ("v4", "v5p")


def compile_only_devices(target: Target) -> list:
  """The target's devices, in the order JAX lists them (a Mesh is laid over this order)."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    if target.platform == "tpu":
      kwargs = {}
      if target.generation in _MEGACORE:
        kwargs = dict(chip_config_name="megacore", chips_per_host_bounds=(2, 2, 1))
      elif target.devices == 1:  # libtpu's default host is 2x2 chips
        kwargs = dict(chips_per_host_bounds=(1, 1, 1))
      with _native_stderr_dropped():
        topology = topologies.get_topology_desc(
            topology_name=f"{target.generation}:{target.topology}", platform="tpu", **kwargs)
    else:
      target_config = target.gpu_target_config()
      topology = topologies.get_topology_desc(
          platform="cuda", topology_name=target.generation, target_config=target_config,
          topology=target.topology)
  except Exception as e:  # pylint: disable=broad-except  (a missing plugin raises many kinds)
    extra = "tpu-aot" if target.platform == "tpu" else "cuda-aot"
    raise ValueError(
        f"--target={target.name}: cannot describe its devices without the hardware ({e}); "
        f"install the compiler with pip install -e \".[{extra}]\" (in the tfjax clone)") from e
  devices = list(topology.devices)
  if len(devices) != target.devices:
    raise RuntimeError(f"{target.name}: the topology has {len(devices)} devices, expected "
                       f"{target.devices}")
  return devices


@contextlib.contextmanager
def _native_stderr_dropped():
  """Runs the block with file descriptor 2 pointed at a scratch file that is then dropped.

  Why: loading libtpu on a host without TPUs writes 5 lines to the process's stderr from C++
  ("could not determine TPU accelerator type", "unexpected worker hostname ...", a source
  location trace) about the TPU runtime it would open; a compile-only topology opens none, so
  they are noise, and they would come before a later one-line `error:`. A failure of the call
  is still raised (and reported) as usual."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with tempfile.TemporaryFile() as scratch:
      os.dup2(scratch.fileno(), 2)
      try:
        yield
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
  finally:
    os.close(saved)
