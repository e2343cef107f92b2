"""The device's achieved ceilings: a large bf16 GEMM's FLOP/s and a large copy's bandwidth.

  python experiments/bench_peaks.py --out=bench_results/peaks

These are the rates the ahead-of-time kernel-sum model (tfjax/aot/kernel_model.py) divides by,
as fractions of the datasheet peaks (tfjax/aot/targets.py). The GEMM is square (8192^3 on a GPU)
on random data; the copy reads and writes one float32 buffer (bytes counted both ways), the
element-wise pass every memory-bound fusion is. Best of `--repeats` timed runs of `--iters`
calls each, after a warm-up. Writes OUT/bench_peaks.json and .md with device, JAX version, date.
"""

import datetime
import json
import os
import sys
import time

from absl import flags

from tfjax.training import cli

_GEMM = flags.DEFINE_integer("gemm", 0, "GEMM size n (n x n x n); 0 = 8192 on GPU/TPU, 1024 on CPU.")
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


def measure(gemm_n: int, copy_mib: int, iters: int, repeats: int) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  key_a, key_b, key_c = jax.random.split(jax.random.key(0), 3)
  a = jax.random.normal(key_a, (gemm_n, gemm_n), jnp.bfloat16)
  b = jax.random.normal(key_b, (gemm_n, gemm_n), jnp.bfloat16)
  gemm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)
                 .astype(jnp.bfloat16))
  gemm_s = best_seconds(gemm, (a, b), iters, repeats)
  elements = copy_mib * (1 << 20) // 4
  x = jax.random.normal(key_c, (elements,), jnp.float32)
  copy = jax.jit(lambda x: x * 1.5 + 0.5)  # one read and one write per element, not elided
  copy_s = best_seconds(copy, (x,), iters, repeats)
  return {"gemm_n": gemm_n, "gemm_ms": gemm_s * 1e3, "gemm_tflops": 2 * gemm_n ** 3 / gemm_s / 1e12,
          "copy_mib": copy_mib, "copy_ms": copy_s * 1e3,
          "copy_gb_per_s": 2 * elements * 4 / copy_s / 1e9}


def main(argv):
  del argv
  import jax  # pylint: disable=import-outside-toplevel
  accelerator = jax.default_backend() != "cpu"
  result = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "jax": jax.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
  result.update(measure(_GEMM.value or (8192 if accelerator else 1024),
                        _COPY_MIB.value or (2048 if accelerator else 64),
                        _ITERS.value, _REPEATS.value))
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_peaks.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(_OUT.value, "bench_peaks.md"), "w") as f:
    f.write("| metric | value |\n| --- | --- |\n" + "".join(
        f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n"
        for k, v in result.items()))
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  cli.run_absl(main)
