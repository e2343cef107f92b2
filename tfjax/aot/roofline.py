"""Analytic counts for a compiled program (FLOPs, the minimum collectives of its layout) and the
roofline step time they imply.

  step time  = max(FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth) + wire bytes / link bandwidth
  MFU bound  = analytic FLOPs / bf16 peak FLOP/s / step time

all per device. The step's peak FLOP/s is the matmul rate of the model's dtype (TF32 for float32
on GPUs); the MFU is against the bf16 peak, as experiments/bench_train.py reports it. FLOPs are
the larger of the compiler's count and the analytic one (the compiler counts a loop body once
and Pallas kernels as 0); HBM bytes are the compiler's bytes accessed; wire bytes are those each
device sends in ring collectives (tfjax.aot.hlo.wire_bytes), over half the bidirectional link
bandwidth (sending and receiving at once). Compute and memory overlap, communication is assumed
not to (overlapped, a step could be faster by up to the network term).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np



def analytic_flops(program, num_devices: int) -> float | None:
  """FLOPs per device of one call of `program`: the task's count (Task.train_flops_per_row;
  text tasks: tfjax/training/accounting/flops.py, 6N plus attention per trained token, a third
  of that per forward-only token); None where the task has none."""
  return None if program.flops is None else program.flops / num_devices


def minimum_collectives(program) -> dict[str, float]:
  """kind -> bytes per step that the layout needs at least (in the model's compute dtype), per
  device and in the whole-buffer convention of tfjax.aot.hlo: DP one all-reduce of the gradients;
  FSDP an all-gather of the parameters forward and again backward plus a reduce-scatter of the
  gradients; TP (Megatron) one all-reduce of the [rows, length, d_model] activations per attention
  and per FFN sublayer, forward and backward (None for a task with a model of its own: its
  sublayers are not the text families')."""
  sizes = dict(program.placement.mesh.shape)
  data, fsdp, tensor = sizes["data"], sizes["fsdp"], sizes["tensor"]
  params = program.args[0].params if program.what == "train" else program.args[0]
  cfg, task = program.experiment.model_config, program.experiment.task
  dtype = task.compute_dtype(cfg)
  # Weights and their gradients can cross the network in the compute dtype (XLA casts a float32
  # weight to bfloat16 before gathering it); each tensor shard moves only its own slice.
  param_bytes = (sum(math.prod(x.shape) for x in jax.tree.leaves(params))
                 * np.dtype(dtype).itemsize / tensor)
  train = program.what == "train"
  out: dict = {}
  if fsdp > 1:
    out["all-gather"] = param_bytes * (2 if train else 1)
    if train:
      out["reduce-scatter"] = param_bytes
  if train and data > 1:
    out["all-reduce"] = param_bytes / fsdp
  if tensor > 1 and task.own_model:
    out["all-reduce"] = None  # unknown: the activation all-reduces of its own sublayers
  elif tensor > 1:
    rows_per_device = program.tokens / program.seq_len / (data * fsdp)
    act_bytes = np.dtype(cfg.dtype).itemsize
    sublayers = 2 * cfg.num_layers + (  # a decoder layer of encoder_decoder also cross-attends
        3 * cfg.decoder_layers if cfg.family == "encoder_decoder" else 0)
    per_pass = sublayers * rows_per_device * program.seq_len * cfg.d_model * act_bytes
    out["all-reduce"] = out.get("all-reduce", 0.0) + per_pass * (2 if train else 1)
  return out


@dataclasses.dataclass(frozen=True)
class Roofline:
  compute_s: float
  memory_s: float
  comm_s: float
  step_s: float
  mfu_bound: float | None  # None: the task has no analytic FLOPs count


def roofline(peak, dtype: str, flops_per_device: float, analytic_per_device: float | None,
             hbm_bytes: float, wire_bytes: float) -> Roofline:
  """The roofline of one step; `dtype` is the model's compute dtype (float32 matmuls run at
  TF32 rate on GPUs). Without an analytic count (None) the compute term is the compiler's count
  alone and there is no MFU bound (None)."""
  peak_flops = peak.matmul_flops(dtype)
  compute_s = max(flops_per_device, analytic_per_device or 0.0) / peak_flops
  memory_s = hbm_bytes / peak.hbm_bytes_per_s
  comm_s = wire_bytes / (peak.link_bytes_per_s / 2)
  step_s = max(compute_s, memory_s) + comm_s
  # MFU against the bf16 peak whatever the dtype, as experiments/bench_train.py measures it.
  if analytic_per_device is None:
    return Roofline(compute_s, memory_s, comm_s, step_s, None)
  mfu = analytic_per_device / peak.bf16_flops / step_s if step_s > 0 else 0.0
  return Roofline(compute_s, memory_s, comm_s, step_s, mfu)
