"""The scoped VMEM each Mosaic TPU kernel of a program needs, measured by libtpu without a TPU.

libtpu does not report a Mosaic kernel's VMEM, but it enforces a limit: a `tpu_custom_call`
whose backend config carries `scoped_memory_configs` (what `pltpu.CompilerParams(
vmem_limit_bytes=...)` writes) fails to compile with `CompileTimeScopedVmemOom ... Scoped
allocation with size X and limit Y` when its stack of VMEM buffers (the pipeline's block buffers,
the scratch, Mosaic's temporaries) exceeds the limit. `kernel_scoped_vmem` sets that limit on one
kernel at a time, leaves the others at the compiler's default, and bisects: the smallest limit
the program compiles under is the kernel's scoped VMEM, exact to `resolution`. The X of a refusal
is not the need, nor a bound on it (a kernel refused with X under one limit can compile under a
limit below X), so the search reads only whether each compile succeeds.

What the number includes depends on where XLA puts the kernel's operands: operands and outputs
that XLA's memory-space assignment places in VMEM (`S(1)` in the optimized HLO) are read in place
and need no pipeline buffers, so measure with arrays too big for VMEM. `compiles_within` compiles
under one limit: two of them bracket a kernel's need, the cheap check of an estimate.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Optional

_CUSTOM_CALL = re.compile(r'(stablehlo\.custom_call @tpu_custom_call\(.*?backend_config = ")'
                          r'((?:[^"\\]|\\.)*)(".*?kernel_name = "([^"]+)")')
_REFUSAL = re.compile(r"CompileTimeScopedVmemOom.*?for %(\S+) = ", re.S)


def _escape(text: str) -> str:
  return text.replace("\\", "\\5C").replace('"', "\\22")


def _unescape(text: str) -> str:
  return re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def kernel_names(lowered) -> list[str]:
  """The `kernel_name` of every Mosaic kernel call in a lowered TPU program, in program order."""
  return [m.group(4) for m in _CUSTOM_CALL.finditer(_text(lowered))]


def _text(lowered) -> str:
  # With locations: libtpu names each HLO instruction after its op's location, which is how a
  # refusal says which kernel overflowed.
  return lowered.as_text(debug_info=True)


def _with_limit(text: str, kernel: str, limit_bytes: int) -> str:
  """The program text with `limit_bytes` of scoped VMEM on every call of `kernel`."""
  def rewrite(m):
    if m.group(4) != kernel:
      return m.group(0)
    config = json.loads(_unescape(m.group(2)))
    config["scoped_memory_configs"] = [{"memory_space": 1, "offset": 0, "size": int(limit_bytes)}]
    return m.group(1) + _escape(json.dumps(config)) + m.group(3)
  return _CUSTOM_CALL.sub(rewrite, text)


def _compile_text(lowered, text: str) -> None:
  """Compiles MLIR `text` with `lowered`'s devices and options (a fresh module each time, so
  that no compiled executable is reused)."""
  from jax._src.lib.mlir import ir  # pylint: disable=import-outside-toplevel
  lowering = getattr(lowered, "_lowering", None)
  if lowering is None or not hasattr(lowering, "_hlo"):
    raise RuntimeError("kernel_scoped_vmem needs a jax.stages.Lowered from jax.jit(...).lower()")
  fresh = copy.copy(lowering)
  fresh._executable = None  # pylint: disable=protected-access
  with lowering._hlo.context:  # pylint: disable=protected-access
    fresh._hlo = ir.Module.parse(text)  # pylint: disable=protected-access
  fresh.compile()


def _is_refusal(error: Exception, kernel: str) -> bool:
  """Whether `error` is libtpu refusing `kernel` for its scoped VMEM."""
  m = _REFUSAL.search(str(error))
  return m is not None and kernel in m.group(1)


def compiles_within(lowered, kernel: str, limit_bytes: int) -> bool:
  """Whether the program compiles with `kernel` limited to `limit_bytes` of scoped VMEM; any
  other compile error is raised."""
  try:
    _compile_text(lowered, _with_limit(_text(lowered), kernel, limit_bytes))
  except Exception as e:  # pylint: disable=broad-except  (libtpu raises XlaRuntimeError)
    if not _is_refusal(e, kernel):
      raise
    return False
  return True


def kernel_scoped_vmem(lowered, kernel: str, *, upper: int = 128 << 20,
                       resolution: int = 64 << 10, guess: Optional[int] = None) -> int:
  """The smallest multiple of `resolution` bytes of scoped VMEM under which libtpu compiles
  `kernel` of the lowered TPU program, by bisection. `guess` (e.g. the tiling's estimate) and half
  of it are tried first, which only shortens the search. Raises ValueError when even `upper` is
  refused."""
  if kernel not in kernel_names(lowered):
    raise ValueError(f"no Mosaic kernel named {kernel!r} in the program; it has "
                     f"{sorted(set(kernel_names(lowered)))}")
  text = _text(lowered)
  top = upper // resolution
  refused, compiles = 0, None  # in units of `resolution`: refused at `refused`, compiles at ...

  def attempt(units):
    nonlocal refused, compiles
    try:
      _compile_text(lowered, _with_limit(text, kernel, units * resolution))
    except Exception as e:  # pylint: disable=broad-except  (libtpu raises XlaRuntimeError)
      if not _is_refusal(e, kernel):
        raise
      refused = max(refused, units)
      return
    compiles = units

  first = min(top, _round_up(guess, resolution) // resolution) if guess else top
  attempt(first)
  while compiles is None:  # grow until it compiles
    if refused >= top:
      raise ValueError(f"{kernel} does not compile within {upper / 2**20:.2f} MiB of scoped VMEM")
    attempt(min(top, 2 * refused))
  if guess and compiles > 1:
    attempt(compiles // 2)
  while compiles - refused > 1:
    attempt((refused + compiles) // 2)
  return compiles * resolution


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
