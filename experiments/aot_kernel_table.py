"""The flash-attention kernels' resource table of docs/benchmarks/kernels.md, compiled ahead of
time from this CPU host: Triton kernels for H100 (registers, spills, shared memory, occupancy)
and the Mosaic kernels for each TPU generation (compiles or not; each kernel's scoped VMEM,
measured by tfjax.aot.tpu_vmem, against the `vmem_bytes` estimate and the scoped limit).

  python experiments/aot_kernel_table.py [--out=aot_results] [--write_docs] [--skip_tpu|--skip_gpu]

Needs the cuda-aot and tpu-aot extras. Writes OUT/kernel_table.json and .md; --write_docs puts
the tables into docs/benchmarks/kernels.md between the aot-kernel-table markers.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: never open a GPU or TPU
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# pylint: disable=wrong-import-position
import datetime
import importlib
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax.training.entry import cli

_OUT = flags.DEFINE_string("out", "aot_results", "Output directory.")
_WRITE_DOCS = flags.DEFINE_bool("write_docs", False,
                                 "Render the tables into docs/benchmarks/kernels.md.")
_SKIP_TPU = flags.DEFINE_bool("skip_tpu", False, "Only the GPU table.")
_SKIP_GPU = flags.DEFINE_bool("skip_gpu", False, "Only the TPU table (keeps the GPU rows of "
                              "OUT/kernel_table.json).")
_LENGTH = flags.DEFINE_integer("length", 4096, "Sequence length compiled (8 query, 2 KV heads).")
_VMEM_ROWS = flags.DEFINE_list(
    "vmem_rows", ["128/bfloat16", "256/float32"], "TPU_TILINGS rows (padded head_dim/dtype, on "
    "every generation) whose kernels' scoped VMEM is measured (about 7 compiles per kernel); "
    "'all' for every row. The others keep OUT/kernel_table.json's measurements.")
_GENERATIONS = flags.DEFINE_list("generations", ["v4", "v5e", "v5p", "v6e"],
                                 "TPU generations compiled.")
_TPU_BATCH = flags.DEFINE_integer(
    "tpu_batch", 16, "Batch of the TPU programs: large enough that XLA keeps the kernels' "
    "operands in HBM (a small array placed in VMEM needs no pipeline buffers).")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKERS = ("<!-- aot-kernel-table:start -->", "<!-- aot-kernel-table:end -->")
KERNELS = ("forward", "dkdv", "dq")
TPU_TARGET = {"v4": "v4-8", "v5e": "v5e-1", "v5p": "v5p-8", "v6e": "v6e-1"}


def _spec(target_name):
  from tfjax.aot import devices, targets  # pylint: disable=import-outside-toplevel
  target = targets.parse_target(target_name)
  device = devices.compile_only_devices(target)[0]
  return target, NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())


def _qkv(spec, head_dim, dtype, length, batch=1):
  q = jax.ShapeDtypeStruct((batch, length, 8, head_dim), dtype, sharding=spec)
  kv = jax.ShapeDtypeStruct((batch, length, 2, head_dim), dtype, sharding=spec)
  return q, kv, kv


def gpu_rows(length):
  from tfjax.aot import gpu_kernels  # pylint: disable=import-outside-toplevel
  gpu = importlib.import_module("tfjax.nn.kernels.flash_attention")
  target, spec = _spec("h100")
  info = gpu_kernels.device_info(target.gpu_target_config())
  rows = []
  for (head_dim, itemsize), tilings in sorted(gpu.GPU_TILINGS.items()):
    dtype = jnp.bfloat16 if itemsize == 2 else jnp.float32
    loss = lambda q, k, v, t=tilings: gpu.flash_attention(  # pylint: disable=cell-var-from-loop
        q, k, v, causal=True, tilings=t, interpret=False).astype(jnp.float32).sum()
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        *_qkv(spec, head_dim, dtype, length)).lower(lowering_platforms=("cuda",))
    _, resources = gpu_kernels.compile_with_resources(lowered, "tfjax_flash")
    for r in resources:
      tiling = tilings.forward if r.name.endswith("forward") else tilings.backward
      rows.append(dict(head_dim=head_dim, dtype=jnp.dtype(dtype).name,
                       kernel=r.name.replace("tfjax_flash_", ""),
                       tile=f"{tiling.block_q}x{tiling.block_k} w{tiling.num_warps} "
                            f"s{tiling.num_stages}",
                       registers=r.registers, spill_bytes=r.spill_bytes,
                       shared_kib=r.shared_bytes / 1024, threads=r.threads,
                       occupancy=r.occupancy(info)))
  return rows


def tpu_rows(length, batch, vmem_rows, previous=()):
  """Per TPU_TILINGS row: whether forward + backward compiles, and each kernel's scoped VMEM as
  libtpu needs it (tfjax.aot.tpu_vmem) beside the `vmem_bytes` estimate. A kernel outside
  `vmem_rows` keeps its measurement from `previous` rows (an earlier run's), if any."""
  key = lambda r: (r["generation"], r["head_dim"], r["dtype"], r["kernel"], r["tile"])
  measured_before = {key(r): r.get("vmem_measured_mib") for r in previous}
  from tfjax.aot import tpu_vmem  # pylint: disable=import-outside-toplevel
  tpu = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")
  rows = []
  for (generation, head_dim, itemsize), tilings in sorted(tpu.TPU_TILINGS.items()):
    if generation not in _GENERATIONS.value:
      continue
    _, spec = _spec(TPU_TARGET[generation])
    dtype = jnp.bfloat16 if itemsize == 2 else jnp.float32
    loss = lambda q, k, v, t=tilings: tpu.flash_attention_tpu(  # pylint: disable=cell-var-from-loop
        q, k, v, causal=True, tilings=t, interpret=False).astype(jnp.float32).sum()
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        *_qkv(spec, head_dim, dtype, length, batch)).lower(lowering_platforms=("tpu",))
    start = time.perf_counter()
    try:
      lowered.compile()
      status = "compiles"
    except Exception as e:  # pylint: disable=broad-except  (the compiler's refusal is the result)
      status = "FAILS: " + " ".join(str(e).split())[:120]
    seconds = time.perf_counter() - start
    limit = tpu.VMEM_LIMIT_BYTES[generation]
    for kernel in KERNELS:
      tiling = tilings.forward if kernel == "forward" else tilings.backward
      estimate = tpu.vmem_bytes(tiling, head_dim, itemsize, kernel)
      measured = measured_before.get((generation, head_dim, jnp.dtype(dtype).name, kernel,
                                      f"{tiling.block_q}x{tiling.block_k}"))
      measured = None if measured is None else int(measured * 2**20)
      if status == "compiles" and ("all" in vmem_rows or
                                   f"{head_dim}/{jnp.dtype(dtype).name}" in vmem_rows):
        measured = tpu_vmem.kernel_scoped_vmem(lowered, f"tfjax_flash_tpu_{kernel}", guess=estimate)
      rows.append(dict(generation=generation, head_dim=head_dim, dtype=jnp.dtype(dtype).name,
                       kernel=kernel, tile=f"{tiling.block_q}x{tiling.block_k}",
                       vmem_estimate_mib=estimate / 2**20,
                       vmem_measured_mib=None if measured is None else measured / 2**20,
                       vmem_limit_mib=limit / 2**20, status=status, compile_s=seconds))
      print(rows[-1], flush=True)
  return rows


def _estimate_again(rows) -> None:
  """The estimate column from the current `vmem_bytes` (rows kept by --skip_tpu included)."""
  tpu = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")
  for r in rows:
    block_q, block_k = (int(n) for n in r["tile"].split("x"))
    r["vmem_estimate_mib"] = tpu.vmem_bytes(
        tpu.TpuTiling(block_q, block_k), r["head_dim"], jnp.dtype(r["dtype"]).itemsize,
        r["kernel"]) / 2**20


def markdown(result) -> str:
  commands = " and ".join(f"`{c}`" for c in result["commands"])
  lines = [f"Compiled from a CPU host ({result['host']}), jax {result['jax']}, {result['date']}, "
           f"{commands}; batch 1 (TPU: {result.get('tpu_batch', 1)}), L {result['length']}, "
           "8 query / 2 KV heads, causal, forward + backward.", "",
           "H100 (sm_90a), Triton kernels (GPU_TILINGS): registers and spills from ptxas -v, "
           "shared memory from XLA's launch, occupancy = resident threads / 2048 per SM.", "",
           "| head_dim | dtype | kernel | tile (q x k, warps, stages) | registers | spills (B) | "
           "shared KiB | occupancy |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in result["gpu"]:
    lines.append(f"| {r['head_dim']} | {r['dtype']} | {r['kernel']} | {r['tile']} | "
                 f"{r['registers']} | {r['spill_bytes']} | {r['shared_kib']:.0f} | "
                 f"{100 * r['occupancy']:.1f}% |")
  if result["tpu"]:
    lines += ["", "TPU, Mosaic kernels (TPU_TILINGS), compiled by libtpu for each generation. "
              "Measured = the smallest scoped-VMEM limit under which libtpu compiles the kernel "
              "(`tfjax.aot.tpu_vmem.kernel_scoped_vmem`, bisected to 64 KiB; '-': not measured, "
              "see --vmem_rows); estimate = `vmem_bytes`, kept under half the default scoped "
              "limit:", "",
              "| generation | head_dim | dtype | kernel | tile | VMEM estimate MiB | "
              "measured MiB | estimate / measured | scoped limit MiB | libtpu | compile s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["tpu"]:
      measured = r.get("vmem_measured_mib")
      lines.append(f"| {r['generation']} | {r['head_dim']} | {r['dtype']} | {r['kernel']} | "
                   f"{r['tile']} | {r['vmem_estimate_mib']:.2f} | "
                   + ("- | - |" if measured is None else
                      f"{measured:.2f} | {r['vmem_estimate_mib'] / measured:.2f} |")
                   + f" {r['vmem_limit_mib']:.0f} | {r['status']} | {r['compile_s']:.0f} |")
  return "\n".join(lines) + "\n"


def write_docs(table: str) -> None:
  from tfjax.aot import report  # pylint: disable=import-outside-toplevel
  doc = os.path.join(REPO, "docs", "benchmarks", "kernels.md")
  report.replace_marked_block(doc, MARKERS, table)


def main(argv):
  del argv
  import platform  # pylint: disable=import-outside-toplevel
  path = os.path.join(_OUT.value, "kernel_table.json")
  previous = {}
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
  result = {"jax": jax.__version__, "date": datetime.date.today().isoformat(),
            "host": f"{os.cpu_count()}-core CPU {platform.machine()}",
            "commands": (previous.get("commands", []) if _SKIP_GPU.value or _SKIP_TPU.value
                         else []) + ([] if _SKIP_GPU.value and _SKIP_TPU.value  # re-rendering
                                     else [" ".join(["python"] + sys.argv)]),
            "length": _LENGTH.value,
            "gpu": previous.get("gpu", []) if _SKIP_GPU.value else gpu_rows(_LENGTH.value),
            "tpu_batch": previous.get("tpu_batch") if _SKIP_TPU.value else _TPU_BATCH.value,
            "tpu": (previous.get("tpu", []) if _SKIP_TPU.value
                    else tpu_rows(_LENGTH.value, _TPU_BATCH.value, _VMEM_ROWS.value,
                             previous.get("tpu", [])))}
  _estimate_again(result["tpu"])
  os.makedirs(_OUT.value, exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  table = markdown(result)
  with open(os.path.join(_OUT.value, "kernel_table.md"), "w") as f:
    f.write(table)
  if _WRITE_DOCS.value:
    write_docs(table)
  print(table)


if __name__ == "__main__":
  cli.run_absl(main)
