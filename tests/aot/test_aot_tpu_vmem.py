"""The scoped VMEM of a Mosaic TPU kernel, measured by libtpu's refusal to compile it under a
smaller limit (tfjax.aot.tpu_vmem), against the `vmem_bytes` estimate of its tiling."""

import importlib
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax.aot import tpu_vmem

tpu_kernels = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or jax.default_backend() != "cpu",
    reason="needs libtpu (pip install '.[tpu-aot]') on a CPU host")

# How far the estimate may be from the measurement, either way (the kernel table's ratio column).
TOLERANCE = 1.5


def lowered_forward(generation="v5e", head_dim=128, dtype=jnp.bfloat16, batch=64, length=1024):
  """The forward kernel of one TPU_TILINGS row, lowered for `generation`. The arrays (128 MiB and
  more) are too big for XLA to place in VMEM, so the kernel pipelines them from HBM, the case the
  estimate describes."""
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  target = {"v4": "v4-8", "v5e": "v5e-1", "v5p": "v5p-8", "v6e": "v6e-1"}[generation]
  device = devices.compile_only_devices(targets.parse_target(target))[0]
  spec = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
  tilings = tpu_kernels.default_tilings(head_dim, dtype, generation)
  q = jax.ShapeDtypeStruct((batch, length, 8, head_dim), dtype, sharding=spec)
  attention = lambda q, k, v: tpu_kernels.flash_attention_tpu(
      q, k, v, causal=True, tilings=tilings, interpret=False)
  return jax.jit(attention).trace(q, q, q).lower(lowering_platforms=("tpu",)), tilings


def test_forward_kernel_needs_its_estimate_within_the_tolerance():
  """Two compiles bracket the measurement: the kernel compiles under TOLERANCE x the estimate and
  is refused under the estimate / TOLERANCE."""
  lowered, tilings = lowered_forward()
  assert tpu_vmem.kernel_names(lowered) == ["tfjax_flash_tpu_forward"]
  estimate = tpu_kernels.vmem_bytes(tilings.forward, 128, 2, "forward")
  assert tpu_vmem.compiles_within(lowered, "tfjax_flash_tpu_forward", int(estimate * TOLERANCE))
  assert not tpu_vmem.compiles_within(lowered, "tfjax_flash_tpu_forward",
                                      int(estimate / TOLERANCE))


@pytest.mark.slow
def test_bisection_finds_the_smallest_limit_that_compiles():
  lowered, tilings = lowered_forward()
  with pytest.raises(ValueError, match="no Mosaic kernel named 'tfjax_flash_tpu_dq'"):
    tpu_vmem.kernel_scoped_vmem(lowered, "tfjax_flash_tpu_dq")
  with pytest.raises(ValueError, match="does not compile within 0.06 MiB"):
    tpu_vmem.kernel_scoped_vmem(lowered, "tfjax_flash_tpu_forward", upper=64 << 10,
                                resolution=64 << 10)
  estimate = tpu_kernels.vmem_bytes(tilings.forward, 128, 2, "forward")
  measured = tpu_vmem.kernel_scoped_vmem(lowered, "tfjax_flash_tpu_forward", guess=estimate,
                                         resolution=64 << 10)
  assert measured % (64 << 10) == 0
  assert tpu_vmem.compiles_within(lowered, "tfjax_flash_tpu_forward", measured)
  assert not tpu_vmem.compiles_within(lowered, "tfjax_flash_tpu_forward", measured - (64 << 10))
  assert estimate / TOLERANCE < measured <= estimate * TOLERANCE
