"""Compile targets: the hardware `python -m tfjax.aot --target=NAME` compiles for, and its peaks.

Names follow Cloud TPU's accelerator types and common GPU node shapes:
  v4-N, v5p-N   N TensorCores (2 per chip, one JAX device per chip: megacore), N in 8..4096
  v5e-N, v6e-N  N chips (one TensorCore each), N in 1..256
  h100xN, h200xN, a100xN   N GPUs on one host (h100 = h100x1, likewise h200, a100)
each with its standard topology (the Cloud TPU docs' slice shapes). `PEAKS` is the one table of
per-device peak numbers the roofline reads; every row names its source.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Peak:
  """Per-device peaks: dense bf16 FLOP/s, HBM capacity (bytes) and bandwidth (bytes/s), and the
  interconnect bandwidth one device can drive (bytes/s, both directions summed: ICI per chip on
  TPU, NVLink per GPU)."""
  bf16_flops: float
  hbm_bytes: int
  hbm_bytes_per_s: float
  link_bytes_per_s: float
  source: str
  fp32_flops: float = 0.0  # a float32 matmul at JAX's default precision; 0 = the bf16 peak
                           # (TPU: one bf16 pass); GPUs run it as TF32

  def matmul_flops(self, dtype: str) -> float:
    """Peak FLOP/s of the matmuls of a model computing in `dtype` ('float32' or 'bfloat16')."""
    return self.fp32_flops if dtype == "float32" and self.fp32_flops else self.bf16_flops


PEAKS = {
    "v4": Peak(275e12, 32 * GIB, 1200e9, 300e9,
               "cloud.google.com/tpu/docs/v4 (275 TFLOPs, 32 GiB, 1200 GBps); ICI: 6 links x "
               "50 GB/s, Jouppi et al. 2023 (TPU v4, ISCA)"),
    "v5e": Peak(197e12, 16 * GIB, 819e9, 400e9,
                "cloud.google.com/tpu/docs/v5e (197 TFLOPs, 16 GB, 819 GBps, bidirectional ICI "
                "400 GBps per chip)"),
    "v5p": Peak(459e12, 95 * GIB, 2765e9, 1200e9,
                "cloud.google.com/tpu/docs/v5p (459 TFLOPs, 95 GiB, 2765 GBps, bidirectional ICI "
                "1200 GBps per chip)"),
    "v6e": Peak(918e12, 32 * GIB, 1638e9, 800e9,
                "cloud.google.com/tpu/docs/v6e (918 TFLOPs, 32 GB, 1638 GBps, bidirectional ICI "
                "800 GBps per chip)"),
    # GPU memory sizes are the device_memory_size of XLA's target config (what XLA plans with).
    "h100": Peak(989e12, 84942979072, 3.35e12, 900e9,
                 "NVIDIA H100 SXM5 datasheet (989 / 494 TFLOPS dense bf16 / tf32, 3.35 TB/s, "
                 "NVLink 900 GB/s); HBM size from XLA's h100_sxm.txtpb", 494e12),
    "h200": Peak(989e12, 151397597184, 4.8e12, 900e9,
                 "NVIDIA H200 SXM datasheet (989 / 494 TFLOPS dense bf16 / tf32, 4.8 TB/s, "
                 "NVLink 900 GB/s); HBM size from XLA's h200.txtpb", 494e12),
    "a100": Peak(312e12, 85100068864, 2.039e12, 600e9,
                 "NVIDIA A100 SXM4 80GB datasheet (312 / 156 TFLOPS dense bf16 / tf32, "
                 "2.039 TB/s, NVLink 600 GB/s); HBM size from XLA's a100_sxm_80.txtpb", 156e12),
}

# XLA's GpuTargetConfigProto text files shipped in tfjax/aot/specs (their headers name the
# openxla/xla commit they come from).
GPU_SPECS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "a100": "a100_sxm_80.txtpb"}

# Chips -> slice shape (Cloud TPU docs' standard topologies).
_TORUS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16"}
_TORUS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
             256: "16x16"}
_GPUS_PER_HOST = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Target:
  """A parsed --target: `devices` JAX devices of `generation` on `platform` ('tpu' or 'cuda')."""
  name: str
  platform: str
  generation: str   # a PEAKS key
  devices: int
  topology: str     # TPU slice shape ("2x4", "2x2x1") or GPU "partitions x hosts x GPUs per host"

  @property
  def peak(self) -> Peak:
    return PEAKS[self.generation]

  def gpu_target_config(self) -> str:
    """XLA's GpuTargetConfigProto text for this GPU."""
    return (importlib.resources.files("tfjax.aot") / "specs" /
            GPU_SPECS[self.generation]).read_text()


def _names() -> str:
  return ("v4-N / v5p-N (N TensorCores: " + ", ".join(str(2 * c) for c in _TORUS_3D) +
          "), v5e-N / v6e-N (N chips: " + ", ".join(str(c) for c in _TORUS_2D) +
          "), h100, h100xN, h200xN, a100xN (N in " + ", ".join(map(str, _GPUS_PER_HOST)) + ")")


def parse_target(name: str) -> Target:
  """The Target named `name`; ValueError listing the valid names for anything else."""
  text = name.strip().lower()
  tpu = re.fullmatch(r"(v4|v5p|v5e|v6e)-(\d+)", text)
  if tpu:
    gen, count = tpu.group(1), int(tpu.group(2))
    if gen in ("v4", "v5p"):  # counted in TensorCores, two per chip
      chips = count // 2 if count % 2 == 0 else 0
      shape = _TORUS_3D.get(chips)
    else:
      chips, shape = count, _TORUS_2D.get(count)
    if shape:
      return Target(name, "tpu", gen, chips, shape)
  gpu = re.fullmatch(r"(h100|h200|a100)(?:x(\d+))?", text)
  if gpu:  # a bare GPU name is one GPU
    count = int(gpu.group(2) or 1)
    if count in _GPUS_PER_HOST:
      return Target(name, "cuda", gpu.group(1), count, f"1x1x{count}")
  raise ValueError(f"--target={name!r} is not a known target; use one of {_names()}")
