"""Measured device time per kernel, read from a `jax.profiler` trace: the counterpart of the
ahead-of-time estimate, to attribute a step's time to matmuls, attention, memory-bound fusions
and the gaps between kernels.

  rows = kernel_rows(load_xspace(trace_dir))      # one row per (HLO op, kernel name)
  summary = summarize(rows, steps=N, step_s=...)  # seconds per step by category, plus idle time

A GPU trace holds one plane per device (`/device:GPU:0`) whose lines are CUDA streams; each event
is one kernel launch (or memcpy/memset) with stats naming the HLO op (`hlo_op`) and module
(`hlo_module`) it runs for. A CPU trace carries the same stats on the XLA client's thread lines,
so the same code reads both (tests run it on CPU).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

# Category of a kernel, by the first pattern that matches "<hlo_op> <kernel name>" (lower case).
# Pallas kernels are custom calls named after their pallas_call; XLA's GEMMs are cuBLAS/cuBLASLt
# kernels (sm90_xmma, nvjet, cutlass) or Triton GEMM fusions (`gemm_fusion`), convolutions never
# appear in a Transformer step.
CATEGORIES = (
    ("attention", re.compile(r"flash|attention|mha|cudnn.*fmha|fmha")),
    ("matmul", re.compile(r"gemm|cublas|cutlass|xmma|nvjet|\bdot\b|dot[._]|matmul")),
    ("collective",
     re.compile(r"nccl|psum|all-reduce|all-gather|reduce-scatter|all-to-all|permute")),
    ("memcpy", re.compile(r"memcpy|memset")),
    ("reduction", re.compile(r"reduce|reduction")),
    ("copy/transpose", re.compile(r"copy|transpose")),
)
OTHER = "elementwise/other fusion"


def category(hlo_op: str, kernel: str) -> str:
  text = f"{hlo_op} {kernel}".lower()
  for name, pattern in CATEGORIES:
    if pattern.search(text):
      return name
  return OTHER


@dataclasses.dataclass
class KernelRow:
  hlo_op: str
  kernel: str
  category: str
  count: int = 0
  total_ns: float = 0.0


def load_xspace(trace_dir: str):
  """The newest `*.xplane.pb` under `trace_dir` (what `jax.profiler.trace(trace_dir)` writes)."""
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}: was the trace written there?")
  return ProfileData.from_file(paths[-1])


def _device_planes(xspace):
  """The accelerator planes (`/device:GPU:0`, ...); on a CPU trace the host plane instead."""
  planes = [p for p in xspace.planes if p.name.startswith("/device:")
            and not p.name.startswith("/device:CUSTOM")]
  return planes or [p for p in xspace.planes if p.name == "/host:CPU"]


def _events(plane):
  """(stream line name, event name, start ns, duration ns, stats) of every event that runs for
  an HLO module (kernels, memcpys); host-side bookkeeping events carry no such stat."""
  for line in plane.lines:
    for event in line.events:
      stats = dict(event.stats)
      if "hlo_module" in stats or "hlo_op" in stats or line.name.lower().startswith("stream"):
        yield line.name, event.name, event.start_ns, event.duration_ns, stats


def kernel_rows(xspace) -> list[KernelRow]:
  """Device time per (HLO op, kernel), largest first."""
  rows: dict = {}
  for plane in _device_planes(xspace):
    for _, name, _, duration, stats in _events(plane):
      hlo_op = str(stats.get("hlo_op", ""))
      key = (hlo_op, name)
      if key not in rows:
        rows[key] = KernelRow(hlo_op, name, category(hlo_op, name))
      rows[key].count += 1
      rows[key].total_ns += duration
  return sorted(rows.values(), key=lambda r: -r.total_ns)


def busy_span_ns(xspace) -> tuple[float, float]:
  """(union of kernel intervals, first start to last end) on the device planes, in ns: their
  difference is the time the device sat idle between kernels (launch gaps, host waits)."""
  intervals = []
  for plane in _device_planes(xspace):
    for _, _, start, duration, _ in _events(plane):
      intervals.append((start, start + duration))
  if not intervals:
    return 0.0, 0.0
  intervals.sort()
  busy, (cur_start, cur_end) = 0.0, intervals[0]
  for start, end in intervals[1:]:
    if start > cur_end:
      busy += cur_end - cur_start
      cur_start, cur_end = start, end
    else:
      cur_end = max(cur_end, end)
  busy += cur_end - cur_start
  return busy, intervals[-1][1] - intervals[0][0]


def summarize(rows: list[KernelRow], steps: int, busy_ns: float = 0.0,
              span_ns: float = 0.0, top: int = 25) -> dict:
  """Per-step seconds by category, kernel launches per step, idle time and the top kernels."""
  by_category = collections.defaultdict(float)
  launches = 0
  for row in rows:
    by_category[row.category] += row.total_ns
    launches += row.count
  total = sum(by_category.values())
  return {
      "steps": steps,
      "kernel_s_per_step": total / 1e9 / steps,
      "busy_s_per_step": busy_ns / 1e9 / steps,
      "span_s_per_step": span_ns / 1e9 / steps,
      "launches_per_step": launches / steps,
      "by_category_s": {k: v / 1e9 / steps for k, v in
                        sorted(by_category.items(), key=lambda kv: -kv[1])},
      "by_category_share": {k: v / total for k, v in by_category.items()} if total else {},
      "top_kernels": [{"hlo_op": r.hlo_op, "kernel": r.kernel[:160], "category": r.category,
                       "per_step": r.count / steps, "ms_per_step": r.total_ns / 1e6 / steps}
                      for r in rows[:top]],
  }
