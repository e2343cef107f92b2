"""What the optimized HLO of a compiled program says: its collectives (kind, bytes, group size)
and its Pallas kernel calls, each counted as many times as it runs per step, and the shapes of
the buffers it holds (instructions outside fusions: a [B, H, L, L] attention-weights array shows
there when the program materializes one).

A collective inside a `while` body (a scanned layer stack, gradient accumulation) runs once per
iteration: XLA writes the trip count into the loop's backend_config (`known_trip_count`), and
every computation's count is the product of the trip counts of the loops around it; where it
records none (XLA:TPU), the bound of the loop condition's `i < N` is used. (XLA's cost analysis
does not do this: it counts a loop body once.)

Bytes of a collective are those of the whole buffer it reduces or gathers: an all-reduce's
result, an all-gather's result, a reduce-scatter's operand (result x group size), an all-to-all's
or a collective-permute's result. Asynchronous pairs are counted once, at their `-done` op.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Callable

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2,
          "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8,
          "c128": 16}
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s("
                 + "|".join(KINDS) + r")(-done|-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_CALLEES = re.compile(r"\b(calls|body|to_apply|branch_computations|called_computations)="
                      r"(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CUSTOM = re.compile(r'custom_call_target="([^"]+)"')


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str
  bytes: int       # the whole buffer, per execution
  group: int       # devices taking part
  count: int       # executions per step (loop trip counts multiplied)


def array_bytes(shape_text: str) -> int:
  """Bytes of every array in an HLO shape (a tuple's elements summed; layouts ignored)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape_text):
    size = _BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
    if size is None:
      continue
    total += size * math.prod(int(d) for d in dims.split(",") if d)
  return total


def group_size(line: str, num_devices: int) -> int:
  """Devices per replica group: `{{0,1},{2,3}}`, iota `[G,S]<=[N]`, or the mesh-axes form
  `mesh['a'=4,'b'=2] {'a'}`; all devices when the op names none."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh:
    sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))}
    axes = re.findall(r"'([^']+)'", mesh.group(2))
    return math.prod(sizes[a] for a in axes) if axes else num_devices
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
  if iota:
    return int(iota.group(2))
  listed = re.search(r"replica_groups=\{\{([^}]*)\}", line)
  if listed:
    return len(listed.group(1).split(","))
  pairs = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*?)\}\s*(?:,|$)", line)
  if pairs:
    return 2
  return num_devices


def computations(text: str) -> dict[str, list[str]]:
  """HLO text -> {computation name: its instruction lines}; "__entry__" names the ENTRY one."""
  bodies, name = {}, None
  for line in text.splitlines():
    head = _COMPUTATION.match(line) if not line[:1].isspace() else None
    if head:
      name = head.group(1)
      bodies[name] = []
      if line.lstrip().startswith("ENTRY"):
        bodies["__entry__"] = name
    elif name is not None:
      bodies[name].append(line)
  return bodies


def runs_per_step(bodies: dict, callees: re.Pattern = _CALLEES,
                  follows: Callable[[str], bool] = lambda line: True,
                  one_branch: bool = False) -> dict[str, float]:
  """computation -> how many times it runs per call of the entry computation. `callees` matches
  (attribute, computation(s)) pairs of the lines `follows` accepts; a `body` runs its loop's trip
  count times. The default follows every called computation (fusions and reducers included: the
  FLOP counts); tfjax/aot/kernel_model.py follows control flow only. `one_branch`: a
  conditional runs one of its n branches, so each gets 1/n of its runs (exact for a total over
  branches that hold the same ops, as the zigzag chunk calls' `lax.switch`); else each all."""
  entry = bodies.get("__entry__")
  counts: dict = collections.defaultdict(int)
  stack = [(entry, 1)] if entry else []
  while stack:
    name, runs = stack.pop()
    counts[name] += runs
    for line in bodies.get(name, ()):
      if not follows(line):
        continue
      trips = trip_count(line, bodies)
      for key, callee_text in callees.findall(line):
        names = [c for c in re.findall(r"%?([\w.\-]+)", callee_text)
                 if c in bodies and c != "__entry__"]
        share = 1 / len(names) if one_branch and key == "branch_computations" and names else 1
        for callee in names:
          stack.append((callee, runs * (trips if key == "body" else 1) * share))
  return counts


def trip_count(while_line: str, bodies: dict) -> int:
  """Iterations of a `while` op: XLA's known_trip_count where it records one (GPU), else the
  bound of its condition `i < constant` (a scan's counter starts at 0); 1 if neither is found."""
  known = _TRIP.search(while_line)
  if known:
    return int(known.group(1))
  condition = re.search(r"condition=%?([\w.\-]+)", while_line)
  lines = bodies.get(condition.group(1), []) if condition else []
  constants = dict(re.findall(r"^\s*%?([\w.\-]+)\s*=\s*s32\[\]\S*\s+constant\((\d+)\)",
                              "\n".join(lines), re.M))
  for line in lines:
    compare = re.search(r"ROOT.*compare\(%?([\w.\-]+),\s*%?([\w.\-]+)\),\s*direction=LT", line)
    if compare and compare.group(2) in constants:
      return int(constants[compare.group(2)])
  return 1


def collectives(text: str, num_devices: int) -> list[Collective]:
  """Every collective of an optimized HLO module, with its executions per step."""
  bodies = computations(text)
  runs = runs_per_step(bodies)
  found = []
  for name, lines in bodies.items():
    if name == "__entry__" or not runs.get(name):
      continue
    for line in lines:
      op = _OP.match(line)
      if not op or op.group(3) == "-start":
        continue
      kind, nbytes = op.group(2), array_bytes(op.group(1))
      group = group_size(line, num_devices)
      if op.group(3) == "-done":  # the start op holds the replica groups
        group = _start_group(lines, line, num_devices)
      if kind == "reduce-scatter":
        nbytes *= group
      found.append(Collective(kind, nbytes, group, runs[name]))
  return found


def _start_group(lines: list[str], done_line: str, num_devices: int) -> int:
  operand = re.search(r"-done\(\s*(?:[^%)]*\s)?%?([\w.\-]+)\)", done_line)
  if operand:
    for line in lines:
      if re.match(rf"^\s*(?:ROOT\s+)?%?{re.escape(operand.group(1))}\s*=", line):
        return group_size(line, num_devices)
  return num_devices


def bytes_by_kind(found: list[Collective]) -> dict[str, int]:
  """kind -> bytes per step (every execution counted)."""
  totals: dict = collections.defaultdict(int)
  for c in found:
    totals[c.kind] += c.bytes * c.count
  return dict(totals)


def wire_bytes(found: list[Collective]) -> float:
  """Bytes each device sends per step with bandwidth-optimal (ring) algorithms: an all-reduce
  2(n-1)/n of its buffer, an all-gather or reduce-scatter (n-1)/n, the others all of it."""
  total = 0.0
  for c in found:
    n = max(c.group, 1)
    share = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n,
             "reduce-scatter": (n - 1) / n}.get(c.kind, 1.0 if n > 1 else 0.0)
    total += share * c.bytes * c.count
  return total


def custom_calls(text: str) -> dict[str, int]:
  """custom_call_target -> executions per step (Pallas kernels appear as tpu_custom_call /
  __gpu$xla.gpu.triton with their kernel names in the backend config); a conditional's branches
  share its runs (one of them runs)."""
  bodies = computations(text)
  runs = runs_per_step(bodies, one_branch=True)
  found: dict = collections.defaultdict(int)
  for name, lines in bodies.items():
    if name == "__entry__" or not runs.get(name):
      continue
    for line in lines:
      target = _CUSTOM.search(line)
      if target:
        found[target.group(1)] += runs[name]
  return {k: int(round(v)) for k, v in found.items()}


_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s[a-z][\w\-]*\(")
_GEMM = re.compile(r'custom_call_target="__cublas\$(?:lt\$)?(?:gemm|matmul)[^"]*"')


def _dims(shape_text: str) -> list[int]:
  """The dimensions of the first array in an HLO shape."""
  first = _ARRAY.search(shape_text)
  return [int(d) for d in first.group(2).split(",") if d] if first else []


def library_gemm_flops(text: str) -> float:
  """FLOPs per step of the cuBLAS GEMM custom calls, which XLA's cost analysis counts as 0:
  2 x output elements x contracted size each, times its executions per step."""
  bodies = computations(text)
  runs = runs_per_step(bodies)
  total = 0.0
  for name, lines in bodies.items():
    if name == "__entry__" or not runs.get(name) or not any(_GEMM.search(l) for l in lines):
      continue
    shapes = {}
    for line in lines:
      definition = _DEFINITION.match(line)
      if definition:
        shapes[definition.group(1)] = definition.group(2)
    for line in lines:
      if not _GEMM.search(line):
        continue
      definition = _DEFINITION.match(line)
      lhs = re.search(r"custom-call\(\s*%?([\w.\-]+)", line)
      if definition and lhs and lhs.group(1) in shapes:
        total += gemm_flops(definition.group(2), shapes[lhs.group(1)], line) * runs[name]
  return total


def gemm_flops(result_shape: str, lhs_shape: str, attrs: str) -> float:
  """2 x output elements x contracted size of one dot or GEMM call; the contracted dimensions
  from a dot's `lhs_contracting_dims={..}` or a cuBLAS call's backend config
  `"lhs_contracting_dimensions":[..]` (0 when `attrs` names neither)."""
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs) or re.search(
      r'"lhs_contracting_dimensions":\[([^\]]*)\]', attrs)
  if not contracting:
    return 0.0
  lhs = _dims(lhs_shape)
  contracted = math.prod(lhs[int(d)] for d in re.findall(r"\d+", contracting.group(1))
                         if int(d) < len(lhs))
  return 2.0 * math.prod(_dims(result_shape)) * contracted


_FLOATS = frozenset(("f32", "bf16", "f16", "f64"))


def fused_computations(bodies: dict) -> set[str]:
  """Computations that are fusion bodies (their values live in registers or on-chip memory, not in
  buffers): those a `fusion(` op calls, nested ones included."""
  fused = set()
  for name, lines in bodies.items():
    if name == "__entry__":
      continue
    for line in lines:
      if " fusion(" in line:
        for callee in re.findall(r"calls=%?([\w.\-]+)", line):
          fused.add(callee)
  return fused


def buffer_shapes(text: str) -> frozenset:
  """(dtype, dims) of every float array an instruction outside a fusion body defines: the
  buffers of the program (a tuple's elements each; layouts ignored)."""
  bodies = computations(text)
  fused = fused_computations(bodies)
  found = set()
  for name, lines in bodies.items():
    if name == "__entry__" or name in fused:
      continue
    for line in lines:
      definition = _DEFINITION.match(line)
      if not definition:
        continue
      for dtype, dims in _ARRAY.findall(definition.group(2)):
        if dtype in _FLOATS or dtype.startswith("f8"):
          found.add((dtype, tuple(int(d) for d in dims.split(",") if d)))
  return frozenset(found)


def square_buffers(shapes, length: int, exclude=frozenset()) -> list[tuple[str, tuple]]:
  """The float buffers of `shapes` (buffer_shapes) with at least 3 dimensions whose two trailing
  ones both equal `length` (a [B, H, L, L] attention-weights array, or its [B * H, L, L]
  bitcast), largest first; dims in `exclude` (the parameters' shapes: a stacked [layers, d, d]
  weight with d = L) are not counted."""
  hits = [(dtype, dims) for dtype, dims in shapes
          if len(dims) >= 3 and dims[-2:] == (length, length) and dims not in exclude]
  return sorted(hits, key=lambda s: -array_bytes(f"{s[0]}[{','.join(map(str, s[1]))}]"))
