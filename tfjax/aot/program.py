"""The program a run would execute, traced for a target's devices: the train step, the eval step
or one KV-cache decode step, with the shardings training uses, for any registered task
(tfjax/training/tasks/: the task builds the model, feeds the batch and says its FLOPs).

The train and eval steps are exactly those of tfjax/training/loop/experiment.py (`jit_train_step`,
`jit_eval_step`) on `make_mesh(config.mesh, devices=<the target's devices>)`; only their inputs
are ShapeDtypeStructs, so nothing is allocated, and the batch shapes come without reading the
corpus (tfjax/aot/shapes.py). The CPU-only workarounds (cpu_fusion) are
switched off: the target is not a CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from tfjax.aot import shapes
from tfjax.inference import cached_model
from tfjax.training import tasks
from tfjax.training.accounting import flops
from tfjax.training.loop import experiment
from tfjax.training.parallel import sharding

WHATS = ("train", "eval", "decode")
# The module (tfjax.nn.kernels re-exports its function under the same name).
flash_attention_tpu = importlib.import_module("tfjax.nn.kernels.flash_attention_tpu")


@dataclasses.dataclass(frozen=True)
class Program:
  """A jitted step and its abstract arguments, ready for `.trace(*args).lower(...)`."""
  what: str
  jitted: Any
  args: tuple
  placement: sharding.BatchPlacement
  experiment: experiment.Experiment
  tokens: int    # tokens this call processes (rows x the length the task predicts over)
  seq_len: int   # that length (text tasks: the attention's; an image classifier's: 1)
  # Analytic FLOPs of the whole call (all devices), None where the task has no count
  # (Task.train_flops_per_row; eval and decode: a forward pass, a third of training's).
  flops: float | None = None


def build(config, devices: list, what: str = "train") -> Program:
  """The `what` program of `config` laid over `devices` (any platform: nothing runs)."""
  config = config.copy_and_resolve_references()
  config.mesh.cpu_devices = 0  # the target's devices, not the host's
  # A CPU-only fusion workaround (tfjax/training/parallel/cpu_fusion.py).
  config.train.cpu_fusion = "off"
  # Shapes only: the corpus is not read (tfjax/aot/shapes.py). Model 'auto' values resolve for
  # the target's platform, not this host's CPU.
  exp = experiment.prepare(config, num_devices=len(devices), platform=devices[0].platform,
                           dataset=shapes.stand_in_dataset(config))
  config = exp.config  # with the values resolved for these devices (e.g. eval_batch_size -1)
  placement = sharding.BatchPlacement.create(sharding.make_mesh(config.mesh, devices=devices),
                                             sharding.rules(config))
  layout = experiment.state_layout(exp, placement)
  one_row = exp.dataset.train_batch(0, 1)
  seq_len, _ = tasks.row_lengths(one_row, config.task)
  seq_len = int(seq_len)
  row_flops = exp.task.train_flops_per_row(exp.model_config, one_row)

  def call_flops(rows: int, share: float):
    return None if row_flops is None else row_flops * rows * share
  if what == "train":
    rows = config.train.batch_size
    return Program(what, experiment.jit_train_step(exp, placement, layout.shardings),
                   (layout.abstract, placement.abstract(one_row, rows)), placement, exp,
                   rows * seq_len, seq_len, call_flops(rows, 1.0))
  if what == "eval":  # forward only: 2 of the 6 FLOPs per weight and position
    rows = config.train.eval_batch_size
    return Program(what, experiment.jit_eval_step(exp, placement, layout.shardings),
                   (layout.abstract.params, placement.abstract(one_row, rows)), placement, exp,
                   rows * seq_len, seq_len, call_flops(rows, 1 / 3))
  if what == "decode":
    return _decode_program(config, exp, placement, layout, seq_len)
  raise ValueError(f"--what={what!r}: use one of {', '.join(WHATS)}")


def _decode_program(config, exp, placement, layout, seq_len: int) -> Program:
  """One generated token per row with a cache of seq_len slots (eval_batch_size rows)."""
  cfg = exp.model_config
  if exp.task.own_model or cfg.family != "decoder":
    family = exp.task.family if exp.task.own_model else cfg.family
    raise ValueError(f"--what=decode compiles a text decoder's KV-cache step; config.task="
                     f"{config.task!r} (model {family!r}): use --what=train or --what=eval")
  rows = config.train.eval_batch_size
  cache_shapes = jax.eval_shape(lambda: cached_model.init_cache(cfg, rows, seq_len))
  batch_axes = placement.sharding.spec[0]
  row_axis = 1 if cfg.scan_layers else 0  # nn.scan stacks the layers' caches in front

  def cache_sharding(leaf):
    if leaf.ndim <= row_axis:
      return placement.replicated()
    spec = [None] * leaf.ndim
    spec[row_axis] = batch_axes
    return NamedSharding(placement.mesh, PartitionSpec(*spec))
  cache = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=cache_sharding(s)),
                       cache_shapes)
  tokens = jax.ShapeDtypeStruct((rows, 1), jnp.int32, sharding=placement.sharding)

  def step(params, cache, tokens_Bx1, positions_Bx1):
    return cached_model.forward_cached(cfg, params, cache, tokens_Bx1, positions_Bx1)
  jitted = jax.jit(step, donate_argnums=(1,))
  return Program("decode", jitted, (layout.abstract.params, cache, tokens, tokens), placement,
                 exp, rows, seq_len, flops.flops_per_token(cfg, seq_len) / 3 * rows)


# Without a GPU, XLA cannot autotune its Triton GEMM tilings, and its untuned choice fails for
# some dot shapes ("Couldn't find output tile sizes"); cuBLAS GEMMs need no tuning to compile
# and their FLOPs can be counted (tfjax.aot.hlo.library_gemm_flops).
COMPILER_OPTIONS = {"tpu": {}, "cuda": {"xla_gpu_enable_triton_gemm": False}}


def compile_for(program: Program, platform: str, generation: str | None = None):
  """The target compiler's executable of `program` (platform 'tpu' or 'cuda'); a TPU
  `generation` ('v4', 'v5e', 'v5p', 'v6e') picks the Pallas kernels' tilings of that chip."""
  tilings = (flash_attention_tpu.compiling_for(generation) if platform == "tpu" and generation
             else contextlib.nullcontext())
  with program.placement.axis_rules(), tilings:
    traced = program.jitted.trace(*program.args)
    return traced.lower(lowering_platforms=(platform,)).compile(COMPILER_OPTIONS[platform])


def compile_with_kernels(program: Program, platform: str, generation: str | None = None):
  """(executable, [gpu_kernels.KernelResources] of tfjax's Pallas kernels in it): on CUDA the
  registers, spills and shared memory of each (tfjax/aot/gpu_kernels.py); on TPU an empty list
  (the compiler reports no Mosaic kernel's VMEM; tfjax.aot.tpu_vmem measures it by bisection)."""
  if platform != "cuda":
    return compile_for(program, platform, generation), []
  from tfjax.aot import gpu_kernels  # pylint: disable=import-outside-toplevel
  with program.placement.axis_rules():
    lowered = program.jitted.trace(*program.args).lower(lowering_platforms=(platform,))
    return gpu_kernels.compile_with_resources(lowered, "tfjax_flash", COMPILER_OPTIONS[platform])
