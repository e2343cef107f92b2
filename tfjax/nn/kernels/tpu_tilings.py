"""Block sizes of the Mosaic TPU flash-attention kernels (flash_attention_tpu.py, which
re-exports these names), by TPU generation, padded head_dim and bytes per element.

  * block_k is a multiple of 128 (the logits tile's lane axis) and block_q of 8 (fp32) / 16 (bf16,
    two rows per sublane): smaller tiles waste the vregs and the MXU.
  * The MXU is 128 x 128 on v4 / v5e / v5p and 256 x 256 on v6e; tiles of 512+ rows amortise the
    per-grid-step overhead (~0.35 us) and the MXU fill/drain, so the forward uses 512 x 512 (v6e:
    512 x 1024, whose larger VMEM holds the bigger logits tile).
  * VMEM: the default scoped limit is 16 MiB on v4 / v5e / v5p and 32 MiB on v6e. The working set
    is two buffers of every input/output block, the fp32 scratch, and the fp32 (block_q, block_k)
    temporaries (measured: docs/benchmarks/kernels.md); `vmem_bytes` estimates it and the
    table keeps it under half the limit. So head_dim 256 halves block_k, fp32 halves block_q, and
    the backward (more blocks, two accumulators) uses smaller tiles than the forward.
These are starting points derived from those limits, not measured on hardware: time
experiments/bench_attention.py on the target TPU and update the table.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from tfjax.nn.kernels import _common

LANES = 128  # minor (lane) axis of a TPU vreg
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class TpuTiling:
  block_q: int
  block_k: int


@dataclasses.dataclass(frozen=True)
class TpuTilings:
  forward: TpuTiling
  backward: TpuTiling  # Shared by the dK/dV and the dQ kernels.


def _row(fwd, bwd):
  return TpuTilings(TpuTiling(*fwd), TpuTiling(*bwd))


# (generation, padded head_dim, bytes per element) -> tilings; see the module docstring.
TPU_TILINGS = {
    **{(gen, 128, 2): _row((512, 512), (256, 512)) for gen in ("v4", "v5e", "v5p")},
    **{(gen, 256, 2): _row((512, 256), (256, 256)) for gen in ("v4", "v5e", "v5p")},
    **{(gen, 128, 4): _row((256, 512), (128, 512)) for gen in ("v4", "v5e", "v5p")},
    **{(gen, 256, 4): _row((256, 256), (128, 256)) for gen in ("v4", "v5e", "v5p")},
    ("v6e", 128, 2): _row((512, 1024), (512, 512)),
    ("v6e", 256, 2): _row((512, 512), (256, 512)),
    ("v6e", 128, 4): _row((256, 1024), (256, 512)),
    ("v6e", 256, 4): _row((256, 512), (128, 512)),
}
VMEM_LIMIT_BYTES = {"v4": 16 << 20, "v5e": 16 << 20, "v5p": 16 << 20, "v6e": 32 << 20}
_DEVICE_KINDS = (("v6", "v6e"), ("v5 lite", "v5e"), ("v5e", "v5e"), ("v5", "v5p"), ("v4", "v4"))


_COMPILING_FOR: contextvars.ContextVar = contextvars.ContextVar("tpu_generation", default=None)


@contextlib.contextmanager
def compiling_for(generation: str):
  """Inside, kernels traced on a host without TPUs take `generation`'s TPU_TILINGS row: a
  program compiled ahead of time for that TPU (tfjax.aot) gets the tiles it would get there."""
  token = _COMPILING_FOR.set(generation)
  try:
    yield
  finally:
    _COMPILING_FOR.reset(token)


def tpu_generation(device_kind: Optional[str] = None) -> str:
  """'v4' / 'v5e' / 'v5p' / 'v6e' from a device_kind such as 'TPU v5 lite' (the first device's
  when None, or the generation of `compiling_for`; off TPU, or for an unknown kind, 'v5e': the
  smallest VMEM, so the safe choice)."""
  if device_kind is None and _COMPILING_FOR.get() is not None:
    return _COMPILING_FOR.get()
  if device_kind is None:
    device = jax.devices()[0]
    device_kind = device.device_kind if device.platform == "tpu" else ""
  kind = device_kind.lower()
  return next((gen for key, gen in _DEVICE_KINDS if key in kind), "v5e")


def padded_head_dim(head_dim: int) -> int:
  return _common.round_up(head_dim, LANES)


def default_tilings(head_dim: int, dtype, generation: Optional[str] = None) -> TpuTilings:
  if head_dim > MAX_HEAD_DIM:
    raise _common.unsupported(f"head_dim {head_dim} (> {MAX_HEAD_DIM})", "'pallas' on TPU",
                              "'xla' or 'chunked'")
  key = (generation or tpu_generation(), padded_head_dim(head_dim),
         2 if jnp.dtype(dtype).itemsize <= 2 else 4)
  return TPU_TILINGS[key]


def vmem_bytes(tiling: TpuTiling, head_dim_p: int, itemsize: int, kernel: str) -> int:
  """Scoped VMEM of one step of `kernel` ('forward', 'dkdv' or 'dq'), on any TPU generation: two
  buffers of every block the pipeline moves, the fp32 scratch, and the fp32 (block_q, block_k)
  logits temporaries (columns pad to 128 lanes), counted as one tile: libtpu's need, measured by
  tfjax.aot.tpu_vmem, is within 1.5x of this on every generation (docs/benchmarks/kernels.md)."""
  bq, bk, d = tiling.block_q, tiling.block_k, head_dim_p
  column = bq * LANES * 4  # an fp32 [bq, 1] column in VMEM
  tiles = bq * bk * 4
  if kernel == "forward":  # blocks q, o; k, v; lse -- scratch acc, m, l
    return 2 * ((2 * bq * d + 2 * bk * d) * itemsize + column) + bq * d * 4 + 2 * column + tiles
  if kernel == "dkdv":  # blocks q, dO; k, v, dK, dV; lse, delta -- scratch dK, dV
    return 2 * ((2 * bq * d + 4 * bk * d) * itemsize + 2 * column) + 2 * bk * d * 4 + tiles
  if kernel == "dq":  # blocks q, dO, dQ; k, v; lse, delta -- scratch dQ
    return 2 * ((3 * bq * d + 2 * bk * d) * itemsize + 2 * column) + bq * d * 4 + tiles
  raise ValueError(f"kernel must be 'forward', 'dkdv' or 'dq', not {kernel!r}")
