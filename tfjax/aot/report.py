"""The report of one ahead-of-time compile: measurements from the executable, the table a person
reads, the one-line verdict when it does not fit, and the JSON line a script reads."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Optional

import jax
import numpy as np

from tfjax.aot import hlo, kernel_model
from tfjax.aot.roofline import Roofline, analytic_flops, minimum_collectives, roofline
from tfjax.aot.targets import GIB, Target

# Kernel calls the compiler counts as 0 FLOPs: Pallas on TPU (Mosaic) and on GPU (Triton).
PALLAS_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu")
# The attention kernel a custom-call target stands for (tfjax's only Pallas kernels are its
# attention ones, tfjax/nn/kernels/), by the name the table and the JSON line give it.
ATTENTION_KERNELS = (("tpu_custom_call", "mosaic_tpu"), ("__gpu$xla.gpu.triton", "triton"),
                     ("mosaic_gpu", "mosaic_gpu"), ("__cudnn$fmha", "cudnn"))
_KERNEL_WORDS = {"mosaic_tpu": "Pallas, Mosaic TPU", "triton": "Pallas, Triton",
                 "mosaic_gpu": "Pallas, Mosaic GPU", "cudnn": "cuDNN"}


@dataclasses.dataclass
class Measured:
  memory: dict            # arguments, outputs, aliased, temp, code, total (bytes per device)
  flops: float            # the compiler's count, per device per call (loop bodies once)
  hbm_bytes_accessed: float
  collectives: list       # hlo.Collective
  custom_calls: dict      # custom_call_target -> executions per step
  kernels: list = dataclasses.field(default_factory=list)  # kernel_model.Kernel (GPU programs)
  buffer_shapes: frozenset = frozenset()  # (dtype, dims) of its float buffers (hlo.buffer_shapes)


def _cost(compiled, platform: str) -> dict:
  """XLA's HloCostAnalysis of the optimized module. Compile-only GPU executables do not
  implement cost_analysis(), so there it runs through a CPU client on the GPU module."""
  if platform == "tpu":
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost
  from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
  module = compiled._executable.xla_executable.hlo_modules()[0]  # pylint: disable=protected-access
  return xla_client._xla.hlo_module_cost_analysis(  # pylint: disable=protected-access
      jax.devices("cpu")[0].client, module)


def measure(compiled, platform: str, num_devices: int) -> Measured:
  stats = compiled.memory_analysis()
  memory = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
            "aliased": -stats.alias_size_in_bytes, "temp": stats.temp_size_in_bytes,
            "code": stats.generated_code_size_in_bytes}
  memory["total"] = sum(memory.values())
  cost = _cost(compiled, platform)
  text = compiled.as_text()
  compiler_flops = float(cost.get("flops", 0.0)) + hlo.library_gemm_flops(text)
  return Measured(memory, compiler_flops, float(cost.get("bytes accessed", 0.0)),
                  hlo.collectives(text, num_devices), hlo.custom_calls(text),
                  kernel_model.kernels(text) if platform == "cuda" else [],
                  hlo.buffer_shapes(text))


@dataclasses.dataclass(frozen=True)
class Attention:
  """Which attention implementation the compiled per-device program holds (the SPMD program
  every device runs): its kernel calls per step by kind (ATTENTION_KERNELS; none: xla or
  chunked), and its float buffers shaped [..., L, L] for the sequence length L (seq_len 0: not
  looked for, as in a task with a model of its own)."""
  kernels: dict           # kind -> calls per step
  seq_len: int
  square_buffers: list    # (dtype, dims), largest first
  # L equals a weight's dimension (e.g. d_model = 4096 = L): a [B, L, D] activation is then
  # [..., L, L] too, so only buffers with a head count before (L, L) are counted.
  ambiguous: bool = False

  @property
  def implementation(self) -> str:
    """'pallas', 'cudnn', or 'none' (no kernel call: xla or chunked)."""
    if any(k != "cudnn" for k in self.kernels):
      return "pallas"
    return "cudnn" if self.kernels else "none"

  def describe(self) -> str:
    if self.kernels:
      return ", ".join(f"{_KERNEL_WORDS[k]}: {n} kernel calls per step"
                       for k, n in self.kernels.items())
    return "no attention kernel call (xla or chunked)"

  @property
  def largest_square(self) -> Optional[str]:
    """The largest [..., L, L] float buffer's HLO shape, e.g. 'f32[16,4,34,34]'; None if none."""
    if not self.square_buffers:
      return None
    dtype, dims = self.square_buffers[0]
    return f"{dtype}[{','.join(map(str, dims))}]"

  def square_text(self) -> str:
    if not self.seq_len:
      return "not checked (a task with a model of its own: its attention lengths are its own)"
    shape = self.largest_square
    note = (" (L equals a weight dimension: only [..., heads, L, L] counted)"
            if self.ambiguous else "")
    if shape is None:
      return f"none (L = {self.seq_len}){note}"
    more = len(self.square_buffers) - 1
    return (f"{shape} ({hlo.array_bytes(shape) / GIB:.2f} GiB)"
            + (f" and {more} more shape{'s' if more > 1 else ''}" if more else "") + note)


def attention(program, measured: Measured) -> Attention:
  """The attention implementation in `measured`'s program, and its [..., L, L] float buffers
  (parameters' own shapes excluded: a stacked [layers, d, d] weight with d = L is no weights
  array)."""
  kernels: dict = {}
  for target, calls in measured.custom_calls.items():
    for key, kind in ATTENTION_KERNELS:
      if key in target:
        kernels[kind] = kernels.get(kind, 0) + calls
  params = set()
  for leaf in jax.tree_util.tree_leaves(program.args[0]):
    params.add(tuple(leaf.shape))
    if getattr(leaf, "sharding", None) is not None:
      params.add(tuple(leaf.sharding.shard_shape(leaf.shape)))
  if program.experiment.task.own_model:  # its attention lengths are its model's (unchecked)
    return Attention(kernels, 0, [])
  squares = hlo.square_buffers(measured.buffer_shapes, program.seq_len, params)
  ambiguous = program.seq_len in {d for shape in params for d in shape}
  if ambiguous:
    heads = program.experiment.model_config.attention.num_heads
    tensor = dict(program.placement.mesh.shape).get("tensor", 1)
    counts = {heads, max(heads // tensor, 1)}
    squares = [s for s in squares if len(s[1]) >= 4 and s[1][-3] in counts]
  return Attention(kernels, program.seq_len, squares, ambiguous)


def parameters(program) -> tuple[int, int, int]:
  """(parameter count, their bytes, their bytes per device) of the program's parameter tree:
  the model's weights as training holds them (the optimizer state not included)."""
  params = program.args[0].params if program.what == "train" else program.args[0]
  count = total = per_device = 0
  for leaf in jax.tree_util.tree_leaves(params):
    shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    size = np.dtype(leaf.dtype).itemsize
    count += math.prod(leaf.shape)
    total += math.prod(leaf.shape) * size
    per_device += math.prod(shard) * size
  return count, total, per_device


_ARG_NAMES = {"train": ("state", "batch"), "eval": ("params", "batch"),
              "decode": ("params", "cache", "tokens", "positions")}


def largest_arguments(program, count: int = 3) -> list[tuple[str, int]]:
  """(leaf path, bytes per device) of the biggest input buffers."""
  sizes = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(program.args)[0]:
    shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    names = _ARG_NAMES[program.what]
    name = names[path[0].idx] + jax.tree_util.keystr(path[1:])
    sizes.append((name, math.prod(shard) * np.dtype(leaf.dtype).itemsize))
  return sorted(sizes, key=lambda s: -s[1])[:count]


def advice(program, measured: Measured, target: Target) -> str:
  """The switch that most likely makes the program fit."""
  cfg, config = program.experiment.model_config, program.experiment.config
  mesh = dict(program.placement.mesh.shape)
  state = measured.memory["arguments"]
  if state > target.peak.hbm_bytes / 2 and mesh["fsdp"] < target.devices:
    return (f"shard the weights and Adam moments: --config.mesh.data=1 "
            f"--config.mesh.fsdp={target.devices // mesh['tensor']}")
  if program.what == "train" and getattr(cfg, "remat", None) == "none":  # text models have it
    return "recompute activations in the backward pass: --config.model.remat=full"
  accum = config.optimizer.grad_accum_steps
  return (f"a smaller per-device batch: --config.optimizer.grad_accum_steps={2 * accum} "
          f"(or a smaller --config.train.batch_size)")


@dataclasses.dataclass
class Report:
  target: Target
  fits: bool
  measured: Measured
  analytic_flops: float
  minimum: dict
  roof: Roofline
  verdict: str
  kernel_sum: Optional[dict] = None  # kernel_model.kernel_sum (GPU targets with measured rates)
  attention: Optional[Attention] = None
  params: tuple = (0, 0, 0)  # parameters(): count, bytes, bytes per device

  def json_line(self) -> str:
    """One JSON object. `flops_per_step` (per device) is the analytic count, the trusted one;
    the compiler's HloCostAnalysis count is `xla_flops_per_step`: it counts a loop body once,
    so a scanned layer stack (model.scan_layers) shows one layer's FLOPs of many.
    `flops_per_step` and `mfu_bound` are null where the task has no analytic count (unknown).
    `params`, `param_bytes`: the model's parameters as training holds them, in all."""
    by_kind = hlo.bytes_by_kind(self.measured.collectives)
    att = self.attention
    return json.dumps({
        "target": self.target.name, "fits": self.fits,
        "bytes_per_device": int(self.measured.memory["total"]),
        "hbm_bytes": int(self.target.peak.hbm_bytes),
        "flops_per_step": self.analytic_flops, "xla_flops_per_step": self.measured.flops,
        "est_step_s": self.roof.step_s, "mfu_bound": self.roof.mfu_bound,
        "est_step_kernel_sum_s": self.kernel_sum["step_s"] if self.kernel_sum else None,
        "kernel_sum_s_by_kind": self.kernel_sum["by_kind_s"] if self.kernel_sum else None,
        "roofline_compute_s": self.roof.compute_s, "roofline_memory_s": self.roof.memory_s,
        "collectives": [{"kind": k, "bytes": int(v)} for k, v in sorted(by_kind.items())],
        "attention_impl": att.implementation if att else None,
        "attention_kernel_calls": att.kernels if att else None,
        "square_buffer": att.largest_square if att else None,
        "mfu_kernel_sum": self.kernel_sum_mfu,
        "params": self.params[0], "param_bytes": self.params[1],
        "param_bytes_per_device": self.params[2],
    })

  @property
  def kernel_sum_mfu(self) -> Optional[float]:
    """Analytic FLOPs / bf16 peak / the kernel-sum step time (the table's 'kernel sum' MFU)."""
    if not self.kernel_sum or not self.kernel_sum["step_s"] or self.analytic_flops is None:
      return None
    return self.analytic_flops / self.target.peak.bf16_flops / self.kernel_sum["step_s"]


def build_report(program, measured: Measured, target: Target) -> Report:
  num_devices = target.devices
  analytic = analytic_flops(program, num_devices)
  roof = roofline(target.peak, _dtype(program), measured.flops, analytic,
                  measured.hbm_bytes_accessed, hlo.wire_bytes(measured.collectives))
  fits = measured.memory["total"] <= target.peak.hbm_bytes
  verdict = ""
  if not fits:
    biggest = ", ".join(f"{name} {size / GIB:.2f} GiB" for name, size in
                        largest_arguments(program))
    verdict = (f"does not fit: {measured.memory['total'] / GIB:.2f} GiB per device of "
               f"{target.peak.hbm_bytes / GIB:.1f} GiB HBM (arguments "
               f"{measured.memory['arguments'] / GIB:.2f} GiB, temporaries "
               f"{measured.memory['temp'] / GIB:.2f} GiB; largest inputs: {biggest}); "
               f"{advice(program, measured, target)}")
  return Report(target, fits, measured, analytic, minimum_collectives(program), roof, verdict,
                _kernel_sum(program, measured, target), attention(program, measured),
                parameters(program))


def _dtype(program) -> str:
  """The model's matmul dtype, as its task says (tfjax/training/tasks/registry.py)."""
  return program.experiment.task.compute_dtype(program.experiment.model_config)


def _kernel_sum(program, measured: Measured, target: Target):
  efficiency = kernel_model.GPU_EFFICIENCY.get(target.generation)
  # The kernel-sum model's attention terms are the text families' (tfjax/aot/kernel_model.py).
  if (target.platform != "cuda" or not measured.kernels or efficiency is None
      or program.experiment.task.own_model):
    return None
  rows_per_device = program.tokens / program.seq_len / target.devices
  return kernel_model.kernel_sum(measured.kernels, target.peak, efficiency,
                                 program.experiment.model_config, target.generation,
                                 rows_per_device, program.seq_len, program.what)


def _gib(n: float) -> str:
  return f"{n / GIB:8.2f}"


def table(report: Report, program, header: str, kernels=()) -> str:
  m, t, roof = report.measured, report.target, report.roof
  peak = t.peak
  margin = peak.hbm_bytes - m.memory["total"]
  count, total, per_device = report.params
  lines = [header, "", f"parameters: {count:,} ({total / GIB:.3f} GiB in all, "
           f"{per_device / GIB:.3f} GiB per device; {total:,} bytes)", "",
           "memory per device (GiB)"]
  for key in ("arguments", "outputs", "aliased", "temp", "code", "total"):
    lines.append(f"  {key:<28}{_gib(m.memory[key])}")
  lines.append(f"  {'HBM':<28}{_gib(peak.hbm_bytes)}   "
               f"{'fits' if report.fits else 'DOES NOT FIT'}, margin {margin / GIB:.2f} GiB "
               f"({100 * margin / peak.hbm_bytes:.0f}%)")
  lines += ["", "FLOPs per device per step",
            f"  {'compiler (HloCostAnalysis)':<28}{m.flops:10.3e}   (a loop body counted once, "
            "Pallas kernels as 0; cuBLAS GEMMs added)"]
  if report.analytic_flops is None:
    lines.append(f"  {'analytic':<28}{'unknown':>10}   (config.task="
                 f"{program.experiment.config.task!r} has no FLOPs count: no MFU bound)")
  else:
    ratio = m.flops / report.analytic_flops if report.analytic_flops else float("nan")
    lines.append(f"  {'analytic (6N + attention)':<28}{report.analytic_flops:10.3e}   compiler "
                 f"/ analytic = {ratio:.2f}")
  pallas = {k: v for k, v in m.custom_calls.items() if any(p in k for p in PALLAS_TARGETS)}
  if pallas:
    lines.append(f"  {'Pallas kernel calls':<28}{sum(pallas.values()):10d}   counted "
                 "analytically")
  if report.attention:
    att = report.attention
    lines += ["", "attention in the per-device program (the one every device runs)",
              f"  {'implementation':<28}{att.implementation}: {att.describe()}",
              f"  {'[..., L, L] float buffer':<28}{att.square_text()}"]
  lines += ["", "collectives per step (per device, whole buffers; GB = 1e9 bytes)",
            f"  {'kind':<20}{'ops':>6}{'compiled GB':>14}{'minimum GB':>14}"]
  by_kind = hlo.bytes_by_kind(m.collectives)
  for kind in hlo.KINDS:
    if kind in by_kind or kind in report.minimum:
      ops = sum(c.count for c in m.collectives if c.kind == kind)
      minimum = report.minimum.get(kind, 0)
      lines.append(f"  {kind:<20}{ops:6d}{by_kind.get(kind, 0) / 1e9:14.3f}" + (
          f"{'unknown':>14}" if minimum is None else f"{minimum / 1e9:14.3f}"))
  if not by_kind and not report.minimum:
    lines.append("  none")
  lines += ["", "roofline (per device): max(FLOPs / peak, HBM bytes / HBM bandwidth) + ring wire "
            "bytes / (link bandwidth / 2)",
            f"  compute   {roof.compute_s * 1e3:10.3f} ms  "
            f"({peak.matmul_flops(_dtype(program)) / 1e12:.0f} TFLOP/s for "
            f"{_dtype(program)} matmuls)",
            f"  memory    {roof.memory_s * 1e3:10.3f} ms  ({peak.hbm_bytes_per_s / 1e9:.0f} GB/s, "
            f"{m.hbm_bytes_accessed / 1e9:.2f} GB accessed)",
            f"  network   {roof.comm_s * 1e3:10.3f} ms  ({peak.link_bytes_per_s / 1e9:.0f} GB/s "
            "bidirectional)",
            f"  step      {roof.step_s * 1e3:10.3f} ms  -> MFU bound " + (
                "unknown (no analytic FLOPs)" if roof.mfu_bound is None
                else f"{100 * roof.mfu_bound:.1f}%"),
            f"  peaks: {peak.source}"]
  if report.kernel_sum:
    ks, eff = report.kernel_sum, kernel_model.GPU_EFFICIENCY[t.generation]
    mfu = report.kernel_sum_mfu or 0.0
    lines += ["", f"kernel sum (per device): {ks['launches']} kernels one after another, each "
              f"max(FLOPs / ({eff.matmul:.2f} x peak), bytes / ({eff.memory:.2f} x bandwidth)); "
              "attention at our kernels' measured rate; launch gaps"]
    lines += [f"  {kind:<10}{sec * 1e3:10.3f} ms" for kind, sec in ks["by_kind_s"].items()]
    lines += [f"  step      {ks['step_s'] * 1e3:10.3f} ms  -> MFU {100 * mfu:.1f}%",
              f"  efficiencies: {eff.source}"]
  if kernels:
    from tfjax.aot import gpu_kernels  # pylint: disable=import-outside-toplevel
    info = gpu_kernels.device_info(t.gpu_target_config())
    lines += ["", "Pallas kernels (ptxas -v; shared memory and launch from XLA)",
              f"  {'kernel':<24}{'registers':>10}{'spills B':>10}{'shared KiB':>12}"
              f"{'threads':>9}{'occupancy':>11}"]
    for k in kernels:
      lines.append(f"  {k.name:<24}{k.registers:10d}{k.spill_bytes:10d}"
                   f"{k.shared_bytes / 1024:12.0f}{k.threads:9d}{100 * k.occupancy(info):10.1f}%")
  elif pallas and t.platform == "tpu":
    lines += ["", "Pallas kernels: Mosaic; libtpu reports no VMEM per kernel (each tiling's, "
              "measured by tfjax.aot.tpu_vmem against its estimate: docs/benchmarks/kernels.md)"]
  if report.verdict:
    lines += ["", report.verdict]
  return "\n".join(lines)


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def is_out_of_memory(error: Exception) -> bool:
  """Whether a compile failed because the program does not fit (XLA:TPU refuses to compile
  such a program; XLA:GPU compiles it and memory_analysis shows the excess)."""
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text and "memory" in text.lower()


def out_of_memory(program, target: Target, error: Exception) -> tuple[str, str]:
  """(the verdict line, the JSON line) of a program the compiler refused for lack of HBM."""
  message = " ".join(str(error).split())
  needed = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT])\)", message)
  temp = float(needed.group(1)) * _UNITS[needed.group(2)] if needed else 0.0
  inputs = sum(size for _, size in largest_arguments(program, count=1 << 30))
  biggest = ", ".join(f"{name} {size / GIB:.2f} GiB" for name, size in largest_arguments(program))
  measured = Measured({"arguments": inputs, "temp": temp, "total": inputs + temp}, 0.0, 0.0, [],
                      {})
  verdict = (f"does not fit: the compiler needs {temp / GIB:.2f} GiB of temporaries per device "
             f"besides {inputs / GIB:.2f} GiB of inputs, of {target.peak.hbm_bytes / GIB:.1f} GiB "
             f"HBM (largest inputs: {biggest}); {advice(program, measured, target)} "
             f"[{message[:200]}]")
  line = json.dumps({
      "target": target.name, "fits": False, "bytes_per_device": int(inputs + temp),
      "hbm_bytes": int(target.peak.hbm_bytes),
      "flops_per_step": analytic_flops(program, target.devices), "xla_flops_per_step": None,
      "est_step_s": None,
      "mfu_bound": None, "collectives": None, "attention_impl": None,
      "attention_kernel_calls": None, "square_buffer": None, "mfu_kernel_sum": None})
  return verdict, line


def replace_marked_block(path: str, markers, block: str) -> None:
  """Rewrites the text between a doc's (start, end) marker lines with `block` (the generated
  tables of docs/scaling/aot.md and docs/benchmarks/kernels.md), leaving the rest of the file as
  it is."""
  start, end = markers
  with open(path) as f:
    text = f.read()
  if start not in text or end not in text:
    raise ValueError(f"{path} has no {start} ... {end} markers: add the section first")
  head, rest = text.split(start, 1)
  with open(path, "w") as f:
    f.write(f"{head}{start}\n{block}{end}{rest.split(end, 1)[1]}")

