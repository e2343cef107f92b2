"""Block sizes of the Triton flash-attention kernels (flash_attention.py, which re-exports these
names), by padded head_dim and bytes per element."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

from tfjax.nn.kernels import _common


@dataclasses.dataclass(frozen=True)
class KernelTiling:
  block_q: int
  block_k: int
  num_warps: int = 4
  num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class Tilings:
  forward: KernelTiling
  backward: KernelTiling  # Shared by the dK/dV and the dQ kernels.


# Triton tilings by (padded head_dim, bytes per element). The bf16 rows for head_dim 64 and 128
# are the fastest candidates of `experiments/bench_attention.py --tune` (causal, L 4096) on an
# NVIDIA H200 with jax 0.11.2 (docs/benchmarks/gpu.md): 128x64 forward tiles with 8 warps and
# 3 stages, 64x64 backward tiles with 4 warps. The other rows are starting points in the range of
# the published FlashAttention-2 Triton configs (fp32 halves the tiles to fit shared memory),
# not yet tuned on hardware.
GPU_TILINGS = {
    (64, 2): Tilings(KernelTiling(128, 64, 8, 3), KernelTiling(64, 64, 4, 2)),
    (128, 2): Tilings(KernelTiling(128, 64, 8, 3), KernelTiling(64, 64, 4, 2)),
    (256, 2): Tilings(KernelTiling(64, 32, 8, 2), KernelTiling(32, 32, 8, 1)),
    (64, 4): Tilings(KernelTiling(64, 32, 4, 2), KernelTiling(32, 32, 4, 2)),
    (128, 4): Tilings(KernelTiling(64, 32, 8, 2), KernelTiling(32, 32, 8, 1)),
    (256, 4): Tilings(KernelTiling(32, 32, 8, 1), KernelTiling(16, 16, 8, 1)),
}


def default_tilings(head_dim: int, dtype) -> Tilings:
  padded = max(64, pl.next_power_of_2(head_dim))
  key = (padded, 2 if jnp.dtype(dtype).itemsize <= 2 else 4)
  if key not in GPU_TILINGS:
    raise _common.unsupported(f"head_dim {head_dim} (> 256)", "pallas", "'xla' or 'chunked'")
  return GPU_TILINGS[key]
