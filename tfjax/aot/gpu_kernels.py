"""Per-kernel GPU resources of a program compiled for a GPU that is not attached: registers and
spills (ptxas -v on the PTX XLA emitted), launch grid, threads and shared memory (XLA's thunk
sequence), and the occupancy they allow.

XLA writes both into an `xla_dump_to` directory (a compile option, so no environment variable
is needed); ptxas is the one the CUDA plugin installs (the nvidia-cuda-nvcc wheel). A tiling that
needs more shared memory than the GPU has fails the compile itself ("Shared memory size limit
exceeded"), as it would on the device.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import subprocess
import tempfile

_THUNK = re.compile(r"kCustomKernel\s.*?\]\s+([\w.\-]+)\s+grid:\s*\[([\d, ]+)\]\s+threads:\s*"
                    r"\[([\d, ]+)\]\s+shared_memory:\s*(\d+)\s*bytes")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


@dataclasses.dataclass(frozen=True)
class KernelResources:
  name: str
  grid: tuple
  threads: int
  shared_bytes: int
  registers: int
  spill_bytes: int        # stores + loads

  def occupancy(self, device_info: dict) -> float:
    """Resident threads per SM over the SM's maximum, from registers, shared memory and
    threads (register allocation rounded to 256 per warp, as NVIDIA's occupancy calculator)."""
    warps = -(-self.threads // 32)
    regs_per_warp = -(-self.registers * 32 // 256) * 256
    by_threads = device_info["threads_per_core_limit"] // (warps * 32)
    by_registers = device_info["registers_per_core_limit"] // max(regs_per_warp * warps, 1)
    by_shared = (device_info["shared_memory_per_core"] // self.shared_bytes
                 if self.shared_bytes else by_threads)
    blocks = min(by_threads, by_registers, by_shared, 32)
    return blocks * warps * 32 / device_info["threads_per_core_limit"]


def device_info(target_config: str) -> dict:
  """The integer fields of a GpuTargetConfigProto's gpu_device_info."""
  return {k: int(v) for k, v in re.findall(r"^\s+(\w+):\s*(\d+)\s*$", target_config, re.M)}


def ptxas_path() -> str:
  import nvidia.cuda_nvcc  # pylint: disable=import-outside-toplevel
  roots = list(getattr(nvidia.cuda_nvcc, "__path__", [])) or [
      os.path.dirname(nvidia.cuda_nvcc.__file__)]
  for root in roots:
    path = os.path.join(root, "bin", "ptxas")
    if os.path.exists(path):
      return path
  raise FileNotFoundError('ptxas: install the CUDA plugin with pip install -e ".[cuda-aot]" (in '
                          "the tfjax clone)")


def compile_with_resources(lowered, kernel_prefix: str = "", options: dict | None = None):
  """(the compiled executable, [KernelResources] of its kernels whose names start with
  `kernel_prefix`) for a program lowered for CUDA."""
  with tempfile.TemporaryDirectory() as dump:
    compiled = lowered.compile({**(options or {}), "xla_dump_to": dump})
    launches = {}
    for path in glob.glob(os.path.join(dump, "*thunk_sequence.txt")):
      with open(path) as f:
        for name, grid, threads, shared in _THUNK.findall(f.read()):
          if name.startswith(kernel_prefix):
            launches[name] = (tuple(int(g) for g in grid.split(",")),
                              _product(threads), int(shared))
    registers = {}
    arch = "sm_90a"
    for path in glob.glob(os.path.join(dump, "*.ptx")):
      with open(path) as f:
        text = f.read()
      target = re.search(r"^\.target\s+(\w+)", text, re.M)
      arch = target.group(1) if target else arch
      if not any(f".entry {name}" in text for name in launches):
        continue
      result = subprocess.run([ptxas_path(), "-v", f"--gpu-name={arch}", path, "-o", os.devnull],
                              capture_output=True, text=True, check=True)
      registers.update(_parse_ptxas(result.stderr))
  return compiled, [KernelResources(name, grid, threads, shared, *registers.get(name, (0, 0)))
                    for name, (grid, threads, shared) in sorted(launches.items())]


def _product(text: str) -> int:
  out = 1
  for n in text.split(","):
    out *= int(n)
  return out


def _parse_ptxas(log: str) -> dict:
  """entry name -> (registers, spill bytes) from `ptxas -v` output."""
  out, name, spills = {}, None, 0
  for line in log.splitlines():
    entry = _ENTRY.search(line)
    if entry:
      name, spills = entry.group(1), 0
    spill = _SPILLS.search(line)
    if spill and name:
      spills = int(spill.group(1)) + int(spill.group(2))
    used = _REGISTERS.search(line)
    if used and name:
      out[name] = (int(used.group(1)), spills)
  return out
