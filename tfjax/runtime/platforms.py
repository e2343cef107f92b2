"""JAX's platform list on a machine without a TPU: CPU only, so that libtpu stays quiet.

With libtpu installed (`jax[tpu]`, pulled in by the test extra for the TPU compile tests), JAX's
default start-up (JAX_PLATFORMS unset) loads libtpu and tries to open a TPU; on a machine that
has none, libtpu prints about five lines of errors ("Failed to find host bounds", "unexpected
worker hostname") before the command's own output. `quiet_absent_tpu()`, run once when tfjax is
imported, sets JAX_PLATFORMS=cpu in exactly that case:

  * libtpu is installed (else JAX never loads it and there is nothing to silence);
  * the user has not set JAX_PLATFORMS (an explicit value, even an empty one, is kept) and
    JAX_FORCE_TPU_INIT is unset;
  * nothing suggests an accelerator: no TPU device file (/dev/accel*, /dev/vfio/*), no PCI device
    of Google's vendor id (TPU chips; gVNIC shares it, so a GCE VM keeps JAX's default), no TPU_*
    environment of a TPU VM or pod, no GPU device file (NVIDIA, AMD).

Any doubt keeps JAX's default: a real TPU or GPU is never hidden, at worst the noise stays.
tfjax.aot compiles for TPUs with JAX_PLATFORMS=cpu anyway (libtpu describes the chips without
opening them), so the TPU compile-only path works the same.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

PLATFORMS_ENV = "JAX_PLATFORMS"
GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips (and gVNIC) on Google Cloud
# Set on TPU VMs and pods (by the VM image or the user) for libtpu; any of them means "TPU here".
# (Not TPU_SKIP_MDS_QUERY: JAX's import sets it on machines that have no TPU chip.)
TPU_ENV = ("JAX_FORCE_TPU_INIT", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID",
           "TPU_NAME", "TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_HOST_BOUNDS",
           "TPU_PROCESS_BOUNDS")
DEVICE_FILES = ("/dev/accel*", "/dev/vfio/*", "/dev/nvidia*", "/dev/dxg", "/dev/kfd")
PCI_VENDORS = "/sys/bus/pci/devices/*/vendor"


def accelerator_hints(root: str = "") -> list[str]:
  """What suggests a TPU or GPU on this machine (device files, Google PCI devices, TPU_*
  environment); empty when there is none. `root` prefixes the paths (tests)."""
  hints = [name for name in TPU_ENV if name in os.environ]
  for pattern in DEVICE_FILES:
    hints += glob.glob(root + pattern)
  for path in glob.glob(root + PCI_VENDORS):
    try:
      with open(path, encoding="ascii") as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          hints.append(path)
    except OSError:  # a device that went away, or one we may not read: count it
      hints.append(path)
  return hints


def quiet_absent_tpu() -> bool:
  """Sets JAX_PLATFORMS=cpu when libtpu is installed but this machine has no accelerator (see
  the module docstring); True when it did. Also applies it to an already imported JAX that has
  no platform list of its own."""
  if PLATFORMS_ENV in os.environ or importlib.util.find_spec("libtpu") is None:
    return False
  if accelerator_hints():
    return False
  os.environ[PLATFORMS_ENV] = "cpu"
  jax = sys.modules.get("jax")
  if jax is not None and hasattr(jax, "config") and not jax.config.jax_platforms:
    # JAX read the environment when it was imported; its backends start on first use, so the
    # setting still applies unless a device was already asked for.
    jax.config.update("jax_platforms", "cpu")
  return True
