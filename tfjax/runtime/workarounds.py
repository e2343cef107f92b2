"""Startup and runtime workarounds of the training system, in one place, each with its reason.

None of them changes a value a run computes; they change when programs compile, how far the host
runs ahead of the devices, and what Python keeps around. docs/benchmarks/cpu_training.md has the
measurements behind each one.
(The CPU fusion boundary of the backward pass is tfjax/training/parallel/cpu_fusion.py; splitting
the CPU into several XLA devices is tfjax.training.parallel.sharding.configure_cpu_devices.)
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gc
import importlib.abc
import sys
from typing import Any, Callable, ContextManager, Iterator, Sequence

import jax

# Compile options for programs that run once or rarely (a run's state init, its occasional greedy
# sample). Why: on CPU, XLA's backend optimizations cost more compile time than they save in run
# time for these, and the values they compute agree to float rounding.
UNOPTIMIZED = {"xla_backend_optimization_level": 0}


def call_once(jitted, *args):
  """`jitted(*args)` for a program that runs once per run (e.g. the state init).

  Why: on CPU such a program (one random draw per parameter) takes longer to compile optimized
  than to run; compiled UNOPTIMIZED it draws the same values to float rounding."""
  if jax.default_backend() != "cpu":
    return jitted(*args)
  return jitted.lower(*args).compile(UNOPTIMIZED)(*args)


def freeze_startup_objects() -> None:
  """Moves every object alive now (the imports' modules, functions, constants) out of the
  garbage collector's reach. Call once, after the imports and before tracing.

  Why: tracing a model allocates many short-lived objects, so full collections run often, and
  each would re-scan the large, never-freed set the imports leave behind; frozen, it is skipped."""
  gc.freeze()


class HostLeadLimiter:
  """Keeps the host at most `max_steps_ahead` jitted calls in front of the devices: call
  `wait_if_ahead` with each call's (not donated) outputs.

  Why: with several XLA:CPU devices (config.mesh.cpu_devices) the gradient all-reduce deadlocks
  once the host has queued a few dozen steps (seen with jax 0.10.2 and 2 devices; a regression
  test in tests/training/test_train.py reproduces it). One call of lead is all the host needs to
  keep the devices busy, so waiting on the call `max_steps_ahead` back costs nothing.
  """

  def __init__(self, max_steps_ahead: int = 4):
    self._max_ahead = max_steps_ahead
    self._pending = collections.deque()

  def wait_if_ahead(self, outputs: Any) -> None:
    self._pending.append(outputs)
    if len(self._pending) > self._max_ahead:
      jax.block_until_ready(self._pending.popleft())


@contextlib.contextmanager
def compiling_in_background(jobs: Sequence[tuple[Callable, tuple]],
                            axis_rules: Callable[[], ContextManager]
                            ) -> Iterator[list[concurrent.futures.Future]]:
  """Compiles each (jitted fn, abstract args) of `jobs` on a thread of its own; yields their
  futures. `axis_rules()` enters the mesh and logical axis rules the real calls run under (e.g.
  BatchPlacement.axis_rules), so the programs are the same, and the jitted functions' caches then
  serve the real calls. On exit, also when the run fails, it waits for every compile to end: none
  outlives the run (a leftover one would go on using the CPU, and logging, during whatever the
  caller does next).

  Why: the train and eval steps need only shapes and shardings, so they can compile while the
  calling thread initializes (or restores) the state and runs the step-0 evaluation and sample.
  Wait on a function's future before calling it (a call meanwhile would compile it again)."""

  def compile_(fn, args):
    with axis_rules():  # thread-local: enter them on this thread too
      fn.lower(*args).compile()

  with concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="tfjax-compile") as pool:
    yield [pool.submit(compile_, fn, args) for fn, args in jobs]


class _RefuseImports(importlib.abc.MetaPathFinder):
  """A finder that makes `import <root>` (and its submodules) fail while it is installed."""

  def __init__(self, *roots: str):
    self._roots = roots

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname.split(".")[0] in self._roots:
      raise ModuleNotFoundError(f"{fullname} is not imported while tfjax loads tensorboardX")
    return None


def summary_writer_class():
  """tensorboardX.SummaryWriter, imported without importing PyTorch.

  Why: tensorboardX imports torch, when it is installed, only to accept torch tensors; tfjax
  writes Python floats and strings, and importing torch is a large share of a short run's startup.
  A torch that is already imported stays in use, and later `import torch` works as usual."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top  (optional dep)
    return SummaryWriter
  refuse = _RefuseImports("torch")
  sys.meta_path.insert(0, refuse)
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top  (see above)
  finally:
    sys.meta_path.remove(refuse)
  return SummaryWriter
