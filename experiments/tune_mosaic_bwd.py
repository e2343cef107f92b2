"""Tiling sweep for the Mosaic GPU backward (tfjax/nn/kernels/flash_attention_mgpu_bwd.py), prepared
for a GPU window: times the backward alone (dK/dV + dQ kernels and the delta/stats step) for each
candidate BwdTilings beside the Triton backward of the same call, both from the same forward's
(out, lse), on the issue-42 shapes (bf16, d_model 2048, 16k tokens, causal and not).

  python experiments/tune_mosaic_bwd.py --out bench_results/mosaic_bwd_h100.jsonl   # on a GPU
  python experiments/tune_mosaic_bwd.py --compile_only                # CPU host + CUDA plugin

--compile_only compiles every candidate for H100 from a CPU host and reports the ones Mosaic GPU
refuses (shared memory over 227 KiB) and each kernel's spills (ptxas, through Mosaic GPU's
MOSAIC_GPU_DUMP_* dumps), so that a GPU window times only candidates that build cleanly.
Backward FLOPs: 2.5x the forward's 4 * B * L^2 * H * D (halved when causal).
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax.aot import devices, targets
from tfjax.nn.kernels import flash_attention_mgpu, flash_attention_mgpu_bwd as bwd
from tfjax.nn.kernels.flash_attention import flash_attention

T = bwd.BwdTiling
# Candidates per head_dim: ring depth, and 128-wide dK/dV query blocks / dQ key blocks where the
# fp32 tiles still fit the registers (two [64, D] accumulators per warpgroup beside them).
CANDIDATES = {
    64: [bwd.BwdTilings(T(bq, 64, s), T(64, bk, s2)) for bq in (64, 128) for s in (2, 3, 4)
         for bk, s2 in ((64, 3), (128, 2))],
    128: [bwd.BwdTilings(T(64, 64, s), T(64, bk, s2)) for s in (2, 3)
          for bk, s2 in ((64, 2), (64, 3), (128, 2))],
}


def shapes(length, head_dim, tokens=16384, d_model=2048):
  batch, heads = max(1, tokens // length), d_model // head_dim
  return (batch, length, heads, head_dim), 4 * batch * length ** 2 * heads * head_dim


def backward_fns(q, k, v, causal):
  """{name: (jitted fn, args)} timing the backward alone: Triton's through the custom VJP, and
  per candidate the Mosaic kernels on the Mosaic forward's (out, lse)."""
  scale = q.shape[-1] ** -0.5
  out, lse = flash_attention_mgpu.mosaic_forward(q, k, v, causal=causal, scale=scale)
  d_out = jax.random.normal(jax.random.PRNGKey(1), q.shape, q.dtype)
  _, triton_vjp = jax.vjp(functools.partial(flash_attention, causal=causal, gpu_forward="mosaic",
                                            gpu_backward="triton"), q, k, v)
  fns = {"triton": (jax.jit(lambda f, g: f(g)), (triton_vjp, d_out))}
  for tilings in CANDIDATES[q.shape[-1]]:
    fn = functools.partial(bwd.mosaic_backward, causal=causal, scale=scale, tilings=tilings)
    fns[json.dumps(tilings_row(tilings))] = (jax.jit(fn), (q, k, v, out, lse, d_out))
  return fns


def tilings_row(tilings):
  return {name: [t.block_q, t.block_kv, t.stages] for name, t in
          (("dkdv", tilings.dkdv), ("dq", tilings.dq))}


def compile_only(args):
  """Compiles every candidate for H100 (sm_90a) from this host; prints which build."""
  spec = NamedSharding(Mesh(np.array(devices.compile_only_devices(targets.parse_target("h100"))),
                            ("x",)), PartitionSpec())
  known = {}  # (head_dim, kernel, its tiling) -> spill bytes: a kernel compiled once is cached
  for head_dim in args.head_dims:
    shape, _ = shapes(args.lengths[0], head_dim)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=spec)
    lse = jax.ShapeDtypeStruct((shape[0], shape[2], shape[1]), jnp.float32, sharding=spec)
    for tilings in CANDIDATES[head_dim]:
      fn = functools.partial(bwd.mosaic_backward, causal=True, scale=head_dim ** -0.5,
                             tilings=tilings)
      kernels = {"dkdv": tuple(tilings_row(tilings)["dkdv"]),
                 "dq": tuple(tilings_row(tilings)["dq"])}
      with tempfile.TemporaryDirectory() as dump:
        os.environ.update(MOSAIC_GPU_DUMP_TO=dump, MOSAIC_GPU_DUMP_PTXAS="1")
        try:
          jax.jit(fn).trace(x, x, x, x, lse, x).lower(lowering_platforms=("cuda",)).compile()
          status = "ok"
        except Exception as e:  # pylint: disable=broad-except  # recorded: shared memory, ...
          status = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        for path in glob.glob(os.path.join(dump, "*.ptxas")):
          with open(path) as f:
            found = re.findall(r"(\d+) bytes spill (?:stores|loads)", f.read())
          kernel = os.path.basename(path).split("_mgpu")[0].removeprefix("tfjax_flash_")
          known[head_dim, kernel, kernels[kernel]] = sum(map(int, found))
      spills = {k: known.get((head_dim, k, t)) for k, t in kernels.items()}
      print(json.dumps(dict(head_dim=head_dim, **tilings_row(tilings), status=status,
                            spill_bytes=spills)), flush=True)


def sweep(args):
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from bench_attention import time_ms  # pylint: disable=import-outside-toplevel
  rows = []
  for head_dim in args.head_dims:
    for length in args.lengths:
      for causal in (False, True):
        shape, fwd_flops = shapes(length, head_dim)
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
        flops = 2.5 * fwd_flops * (0.5 if causal else 1.0)
        reference = None  # Triton's gradients (the first entry): each candidate is checked
        for name, (fn, fn_args) in backward_fns(q, k, v, causal).items():
          row = dict(head_dim=head_dim, seq_len=length, causal=causal, batch=shape[0],
                     heads=shape[2], backward=name, device=jax.devices()[0].device_kind,
                     jax=jax.__version__)
          try:
            compiled = fn.lower(*fn_args).compile()
            grads = [np.asarray(g, np.float32) for g in compiled(*fn_args)]
            reference = grads if reference is None else reference
            # max |error| / max |Triton's|, over dq, dk, dv: a fast but wrong tiling shows here
            row["max_rel_err"] = max(float(np.abs(g - r).max() / np.abs(r).max())
                                     for g, r in zip(grads, reference))
            ms = time_ms(compiled, fn_args, args.iters, args.min_seconds)
            row.update(bwd_ms=ms, bwd_tflops=flops / (ms * 1e-3) / 1e12, status="ok")
          except Exception as e:  # pylint: disable=broad-except  # recorded, e.g. smem
            row["status"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
          print(json.dumps(row), flush=True)
          rows.append(row)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--head_dims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128])
  p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                 default=[1024, 4096, 16384])
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--min_seconds", type=float, default=0.5)
  p.add_argument("--out", default=None, help="JSON lines file for the timed rows")
  p.add_argument("--compile_only", action="store_true")
  args = p.parse_args(argv)
  if args.compile_only:
    compile_only(args)
  else:
    if jax.default_backend() != "gpu":
      raise SystemExit("timing needs a Hopper GPU; use --compile_only on a CPU host")
    sweep(args)


if __name__ == "__main__":
  main()
