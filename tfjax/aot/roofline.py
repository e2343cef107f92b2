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

from tfjax.training.accounting import flops

# The fraction of a training step's FLOPs that one forward pass is (6N vs 2N per token).
_FORWARD_SHARE = {"train": 1.0, "eval": 1 / 3, "decode": 1 / 3}


def analytic_flops(program, num_devices: int) -> float:
  """FLOPs per device of one call of `program` (tfjax/training/accounting/flops.py: 6N plus
  attention per trained token, a third of that per forward-only token)."""
  per_token = flops.flops_per_token(program.experiment.model_config, program.seq_len)
  return per_token * _FORWARD_SHARE[program.what] * program.tokens / num_devices


def minimum_collectives(program) -> dict[str, float]:
  """kind -> bytes per step that the layout needs at least (in the model's compute dtype), per
  device and in the whole-buffer convention of tfjax.aot.hlo: DP one all-reduce of the gradients;
  FSDP an all-gather of the parameters forward and again backward plus a reduce-scatter of the
  gradients; TP (Megatron) one all-reduce of the [rows, length, d_model] activations per attention
  and per FFN sublayer, forward and backward."""
  sizes = dict(program.placement.mesh.shape)
  data, fsdp, tensor = sizes["data"], sizes["fsdp"], sizes["tensor"]
  params = program.args[0].params if program.what == "train" else program.args[0]
  cfg = program.experiment.model_config
  # Weights and their gradients can cross the network in the compute dtype (XLA casts a float32
  # weight to bfloat16 before gathering it); each tensor shard moves only its own slice.
  param_bytes = (sum(math.prod(x.shape) for x in jax.tree.leaves(params))
                 * np.dtype(cfg.dtype).itemsize / tensor)
  train = program.what == "train"
  out: dict = {}
  if fsdp > 1:
    out["all-gather"] = param_bytes * (2 if train else 1)
    if train:
      out["reduce-scatter"] = param_bytes
  if train and data > 1:
    out["all-reduce"] = param_bytes / fsdp
  if tensor > 1:
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
  mfu_bound: float


def roofline(peak, dtype: str, flops_per_device: float, analytic_per_device: float,
             hbm_bytes: float, wire_bytes: float) -> Roofline:
  """The roofline of one step; `dtype` is the model's compute dtype (float32 matmuls run at
  TF32 rate on GPUs)."""
  peak_flops = peak.matmul_flops(dtype)
  compute_s = max(flops_per_device, analytic_per_device) / peak_flops
  memory_s = hbm_bytes / peak.hbm_bytes_per_s
  comm_s = wire_bytes / (peak.link_bytes_per_s / 2)
  step_s = max(compute_s, memory_s) + comm_s
  # MFU against the bf16 peak whatever the dtype, as experiments/bench_train.py measures it.
  mfu = analytic_per_device / peak.bf16_flops / step_s if step_s > 0 else 0.0
  return Roofline(compute_s, memory_s, comm_s, step_s, mfu)
