"""The device's achieved ceilings: large GEMMs' FLOP/s and a large copy's bandwidth.

  python experiments/bench_peaks.py --out=bench_results/peaks
  python experiments/bench_peaks.py --gemm_shapes=16384x384x1536,16384x1536x384

These are the rates the ahead-of-time kernel-sum model (tfjax/aot/kernel_model.py) divides by,
as fractions of the datasheet peaks (tfjax/aot/targets.py). The GEMM is square (8192^3 on a GPU)
on random data, in bfloat16 and in float32 (which a GPU multiplies as TF32 under JAX's default
matmul precision: the rate float32 models train at); the copy reads and writes one float32
buffer (bytes counted both ways), the element-wise pass every memory-bound fusion is.
`--gemm_shapes` adds GEMMs of given [B x] M x K x N in both dtypes: a small model's thin GEMMs
(K or N a few hundred) and unfused attention's batched K = head_dim products run far below the
square rate, which the model's single efficiency does not see.
Best of `--repeats` timed runs of `--iters` calls each, after a warm-up. Writes
OUT/bench_peaks.json and .md with device, JAX version, date.
"""

import datetime
import json
import os
import sys
import time

from absl import flags

from tfjax.training.entry import cli

_GEMM = flags.DEFINE_integer("gemm", 0, "GEMM size n (n x n x n); 0 = 8192 on GPU/TPU, 1024 on CPU.")
_SHAPES = flags.DEFINE_list(
    "gemm_shapes", [], "Extra GEMMs as MxKxN or BxMxKxN (B products at once), each timed in "
    "bfloat16 and float32: e.g. a small model's 16384x384x1536, or unfused attention's scores "
    "384x256x64x256 (batch x heads, queries, head_dim, keys).")
_COPY_MIB = flags.DEFINE_integer("copy_mib", 0, "Copy buffer MiB; 0 = 2048 on GPU/TPU, 64 on CPU.")
_ITERS = flags.DEFINE_integer("iters", 20, "Calls per timed run.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs; the best is kept.")
_OUT = flags.DEFINE_string("out", "bench_results/peaks", "Output directory.")


def best_seconds(fn, args, iters: int, repeats: int) -> float:
  """Seconds per call of `fn(*args)`: the best of `repeats` runs of `iters` back-to-back calls."""
  import jax  # pylint: disable=import-outside-toplevel
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / iters)
  return best


def parse_shape(text: str) -> tuple[int, int, int, int]:
  """'MxKxN' or 'BxMxKxN' (a batch of B products) -> (B, M, K, N), B = 1 when not given; an
  error names the expected spelling."""
  parts = text.lower().split("x")
  if len(parts) not in (3, 4) or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"--gemm_shapes entry {text!r} is not MxKxN or BxMxKxN with positive "
                     "integers, e.g. 16384x384x1536 or 384x256x64x256")
  return tuple(int(p) for p in ([1] * (4 - len(parts)) + parts))


def gemm_seconds(b: int, m: int, k: int, n: int, dtype: str, iters: int, repeats: int) -> float:
  """Seconds per B x (M x K) @ (K x N) batched product in `dtype` (float32 accumulation, result
  in dtype); B = 1 is a plain GEMM."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  key_a, key_b = jax.random.split(jax.random.key(b * 11 + m * 7 + k * 3 + n), 2)
  a = jax.random.normal(key_a, (b, m, k), dtype)
  w = jax.random.normal(key_b, (b, k, n), dtype)
  gemm = jax.jit(lambda a, w: jnp.einsum("bmk,bkn->bmn", a, w,
                                         preferred_element_type=jnp.float32).astype(dtype))
  return best_seconds(gemm, (a, w), iters, repeats)


def gemm_row(b: int, m: int, k: int, n: int, dtype: str, iters: int, repeats: int) -> dict:
  seconds = gemm_seconds(b, m, k, n, dtype, iters, repeats)
  return {"batch": b, "m": m, "k": k, "n": n, "dtype": dtype, "ms": seconds * 1e3,
          "tflops": 2 * b * m * k * n / seconds / 1e12}


def measure(gemm_n: int, copy_mib: int, iters: int, repeats: int, shapes=()) -> dict:
  """The square GEMM in both dtypes, `shapes` ((B, M, K, N) tuples) in both, and the copy."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  square = {dtype: gemm_row(1, gemm_n, gemm_n, gemm_n, dtype, iters, repeats)
            for dtype in ("bfloat16", "float32")}
  elements = copy_mib * (1 << 20) // 4
  x = jax.random.normal(jax.random.key(1), (elements,), jnp.float32)
  copy = jax.jit(lambda x: x * 1.5 + 0.5)  # one read and one write per element, not elided
  copy_s = best_seconds(copy, (x,), iters, repeats)
  return {"gemm_n": gemm_n, "gemm_ms": square["bfloat16"]["ms"],
          "gemm_tflops": square["bfloat16"]["tflops"],
          "gemm_float32_ms": square["float32"]["ms"],
          "gemm_float32_tflops": square["float32"]["tflops"],
          "matmul_precision": str(jax.config.jax_default_matmul_precision),
          "gemms": [gemm_row(*shape, dtype, iters, repeats)
                    for shape in shapes for dtype in ("bfloat16", "float32")],
          "copy_mib": copy_mib, "copy_ms": copy_s * 1e3,
          "copy_gb_per_s": 2 * elements * 4 / copy_s / 1e9}


def main(argv):
  del argv
  shapes = [parse_shape(s) for s in _SHAPES.value]  # a typo fails before anything is timed
  import jax  # pylint: disable=import-outside-toplevel
  accelerator = jax.default_backend() != "cpu"
  result = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "jax": jax.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
  result.update(measure(_GEMM.value or (8192 if accelerator else 1024),
                        _COPY_MIB.value or (2048 if accelerator else 64),
                        _ITERS.value, _REPEATS.value, shapes))
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_peaks.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(_OUT.value, "bench_peaks.md"), "w") as f:
    f.write("| metric | value |\n| --- | --- |\n" + "".join(
        f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n"
        for k, v in result.items() if k != "gemms"))
    if result["gemms"]:
      f.write("\n| batch | M | K | N | dtype | ms | TFLOP/s |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n")
      f.write("".join(f"| {g['batch']} | {g['m']} | {g['k']} | {g['n']} | {g['dtype']} | "
                      f"{g['ms']:.4g} | {g['tflops']:.4g} |\n" for g in result["gemms"]))
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  cli.run_absl(main)
