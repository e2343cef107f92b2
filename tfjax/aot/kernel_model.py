"""A step time summed kernel by kernel from the optimized HLO of a compiled GPU program.

The plain roofline (tfjax/aot/roofline.py) overlaps all of a step's arithmetic with all of its
memory traffic at datasheet peaks. A GPU runs a step as a sequence of kernels instead, each
bound by its own arithmetic or its own bytes, one after another:

  step = sum over kernels k of  max(FLOPs_k / (eff_matmul x peak FLOP/s),
                                    bytes_k / (eff_memory x HBM bandwidth))  + launch gap
  attention kernels (Pallas custom calls, 0 FLOPs to the compiler): their analytic FLOPs at the
  rate our kernels were measured at for that length and head_dim (ATTENTION_TFLOPS)

Kernels are the instructions of the entry computation, of loop bodies (times their trip counts)
and of called computations, never the bodies of fusions: XLA:GPU launches one kernel per fusion,
library GEMM or custom call. A kernel's bytes are its operands plus its result (each read or
written once); a GEMM's FLOPs are 2 x output elements x the contracted size. The efficiencies are
measured rates (experiments/bench_peaks.py: a large GEMM, a large element-wise pass; the idle time
between kernels of a profiled step), not datasheet ones: `Efficiency` carries them with their
source.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from tfjax.aot import hlo

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*?)\)(?:,\s*(.*))?$")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->")
# Instructions that launch nothing: bookkeeping, control flow (their bodies are walked instead).
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
              "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
              "add-dependency", "copy-start", "copy-done", "send", "recv", "send-done",
              "recv-done", "domain"}
_COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(-start)?$")
_ATTENTION_CALL = re.compile(r'custom_call_target="(?:__gpu\$xla\.gpu\.triton|mosaic_gpu\w*|'
                             r'__cudnn\$fmha\w*)"')
_CONTROL_FLOW = re.compile(r"\b(body|condition|to_apply|branch_computations|true_computation|"
                           r"false_computation)=(\{[^}]*\}|%?[\w.\-]+)")
_CUBLAS = re.compile(r'custom_call_target="__cublas\$(?:lt\$)?(?:gemm|matmul)')


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  kind: str        # matmul | attention | collective | memory
  flops: float     # per launch (0 for memory kernels; attention FLOPs are added by the caller)
  bytes: int       # operands + result, per launch
  launches: int    # per step


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """Achieved fractions of a GPU's datasheet peaks, and the idle time per kernel launch."""
  matmul: float     # of the dense bf16 (or TF32) matmul peak
  memory: float     # of the HBM bandwidth
  launch_s: float   # device idle time per kernel launch
  source: str


def _shapes(lines: list[str], header: str) -> dict[str, str]:
  shapes = {}
  head = _HEADER.match(header) if header else None
  if head:  # parameters named in the computation's signature
    for name, shape in re.findall(r"([\w.\-]+):\s*([^,()]+(?:\([^)]*\))?)", head.group(2)):
      shapes[name] = shape
  for line in lines:
    ins = _INSTRUCTION.match(line)
    if ins:
      shapes[ins.group(1)] = ins.group(2)
  return shapes


def _fused_flops(computation: list[str], header: str) -> float:
  """FLOPs of the dots inside a fused computation (a Triton GEMM fusion)."""
  shapes = _shapes(computation, header)
  total = 0.0
  for line in computation:
    ins = _INSTRUCTION.match(line)
    if ins and ins.group(3) == "dot":
      operands = re.findall(r"%?([\w.\-]+)", ins.group(4))
      if operands and operands[0] in shapes:
        total += hlo.gemm_flops(ins.group(2), shapes[operands[0]], ins.group(5) or "")
  return total


def _is_control_flow(line: str) -> bool:
  ins = _INSTRUCTION.match(line)
  return bool(ins) and ins.group(3) in ("while", "call", "conditional")


def _headers(text: str) -> dict[str, str]:
  heads = {}
  for line in text.splitlines():
    if line and not line[0].isspace():
      head = _HEADER.match(line)
      if head:
        heads[head.group(1)] = line
  return heads


def kernels(text: str) -> list[Kernel]:
  """Every kernel an optimized XLA:GPU module launches per step, with its FLOPs and bytes."""
  bodies = hlo.computations(text)
  headers = _headers(text)
  # Control flow only (loop bodies x trip count, conditions, branches, calls): a fusion's body
  # or a reducer is part of its kernel, not a kernel of its own. A conditional runs one branch:
  # its branches share its runs (the zigzag chunk calls' lax.switch: their mean cost).
  runs = hlo.runs_per_step(bodies, _CONTROL_FLOW, _is_control_flow, one_branch=True)
  found = []
  for name, count in runs.items():
    lines = bodies.get(name, [])
    shapes = _shapes(lines, headers.get(name, ""))
    for line in lines:
      ins = _INSTRUCTION.match(line)
      if not ins or ins.group(3) in _NO_KERNEL:
        continue
      op, attrs = ins.group(3), ins.group(5) or ""
      if op.endswith("-done"):
        continue
      operands = [o for o in re.findall(r"%?([\w.\-]+)", ins.group(4)) if o in shapes]
      nbytes = hlo.array_bytes(ins.group(2)) + sum(hlo.array_bytes(shapes[o]) for o in operands)
      flops, kind = 0.0, "memory"
      if _COLLECTIVE.match(op):
        kind = "collective"
      elif op == "custom-call" and _ATTENTION_CALL.search(line):
        kind = "attention"
      elif op == "custom-call" and _CUBLAS.search(line) and operands:
        flops, kind = hlo.gemm_flops(ins.group(2), shapes[operands[0]], attrs), "matmul"
      elif op == "dot" and operands:
        flops, kind = hlo.gemm_flops(ins.group(2), shapes[operands[0]], attrs), "matmul"
      elif op == "fusion":
        callee = re.search(r"calls=%?([\w.\-]+)", attrs)
        if callee and callee.group(1) in bodies:
          flops = _fused_flops(bodies[callee.group(1)], headers.get(callee.group(1), ""))
          kind = "matmul" if flops else "memory"
      found.append(Kernel(ins.group(1), kind, flops, nbytes, count))
  return found


def step_time(found: list[Kernel], peak, efficiency: Efficiency, dtype: str,
              attention_s: float) -> dict:
  """Seconds per step by kind under the kernel-sum model, and their total; `attention_s` is the
  time of all attention kernels together (kernel_sum derives it from measured rates)."""
  matmul_rate = peak.matmul_flops(dtype) * efficiency.matmul
  bandwidth = peak.hbm_bytes_per_s * efficiency.memory
  by_kind: dict = collections.defaultdict(float)
  launches = 0
  for k in found:
    if k.kind == "attention":
      continue  # attention_s covers them
    seconds = max(k.flops / matmul_rate, k.bytes / bandwidth)
    by_kind[k.kind] += seconds * k.launches
    launches += k.launches
  attention_calls = sum(k.launches for k in found if k.kind == "attention")
  if attention_calls:
    by_kind["attention"] = attention_s
    launches += attention_calls
  by_kind["launch gaps"] = launches * efficiency.launch_s
  return {"by_kind_s": dict(by_kind), "step_s": sum(by_kind.values()),
          "launches": int(round(launches))}


# Our Pallas attention's forward+backward rate (TFLOP/s, bf16; the benchmark's convention:
# 4 B L^2 H D forward, halved when causal, backward 2.5x) by (causal, L, D), measured on an H200
# with jax 0.11.2 (docs/gpu/attention_h200.json, experiments/bench_attention.py). The H100 has
# the same tensor cores and clocks, so the same rates stand for it.
_ATTENTION_TFLOPS_H200 = {
    (True, 1024, 64): 193, (True, 4096, 64): 242, (True, 16384, 64): 256,
    (True, 1024, 128): 231, (True, 4096, 128): 299, (True, 16384, 128): 310,
    (False, 1024, 64): 230, (False, 4096, 64): 251, (False, 16384, 64): 252,
    (False, 1024, 128): 295, (False, 4096, 128): 319, (False, 16384, 128): 343,
}
ATTENTION_TFLOPS = {"h200": _ATTENTION_TFLOPS_H200, "h100": _ATTENTION_TFLOPS_H200}


def attention_tflops(generation: str, causal: bool, seq_len: int, head_dim: int):
  """The measured attention rate of the nearest benchmarked (L, D), or None when the generation
  has none (then the kernel-sum model is not offered)."""
  table = ATTENTION_TFLOPS.get(generation)
  if not table:
    return None
  key = min((k for k in table if k[0] == causal),
            key=lambda k: (abs(math.log2(k[1] / seq_len)), abs(math.log2(k[2] / head_dim))))
  return table[key]


def attention_flops(cfg, rows_per_device: float, seq_len: int, what: str) -> tuple[float, float]:
  """(causal, non-causal) attention FLOPs of one call per device, in the benchmark's convention:
  each self- or cross-attention 4 x rows x L^2 x heads x head_dim forward (halved when causal),
  3.5x that for a training step."""
  per_attention = 4.0 * rows_per_device * seq_len ** 2 * cfg.attention.num_heads * cfg.dim_per_head
  scale = 3.5 if what == "train" else 1.0
  if cfg.family == "decoder":
    return cfg.num_layers * per_attention / 2 * scale, 0.0
  if cfg.family == "encoder":
    return 0.0, cfg.num_layers * per_attention * scale
  causal = cfg.decoder_layers * per_attention / 2 * scale
  return causal, (cfg.num_layers + cfg.decoder_layers) * per_attention * scale


def kernel_sum(found: list[Kernel], peak, efficiency: Efficiency, cfg, generation: str,
               rows_per_device: float, seq_len: int, what: str):
  """The kernel-sum step time of a compiled GPU program (None without attention rates)."""
  causal_flops, full_flops = attention_flops(cfg, rows_per_device, seq_len, what)
  seconds = 0.0
  for causal, fl in ((True, causal_flops), (False, full_flops)):
    if fl:
      rate = attention_tflops(generation, causal, seq_len, cfg.dim_per_head)
      if rate is None:
        return None
      seconds += fl / (rate * 1e12)
  return step_time(found, peak, efficiency, cfg.dtype, seconds)


# Achieved fractions of the datasheet peaks (targets.PEAKS), measured on an H200 with jax 0.11.2
# (docs/gpu/peaks_h200.json, experiments/bench_peaks.py): a bf16 8192^3 GEMM at 737 TFLOP/s and an
# element-wise pass over 2 GiB at 4215 GB/s; the idle time per launch is that of a profiled GPT-2
# small step (docs/gpu/train_gpt2_small_h200_gather_loss.json: span - busy over 1375 launches).
# The H100 has the H200's chip; the same fraction of its own (lower) bandwidth is assumed.
_H200 = Efficiency(matmul=737 / 989, memory=4215 / 4800, launch_s=1.45e-6,
                   source="H200 measured: GEMM 737 TFLOP/s, copy 4215 GB/s, 1.45 us per launch "
                          "(docs/gpu)")
GPU_EFFICIENCY = {"h200": _H200, "h100": _H200}
