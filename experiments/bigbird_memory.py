"""Compiled cost of BigBird block-sparse attention against dense softmax attention, by length.

  python experiments/bigbird_memory.py [--lengths=1024,2048,4096,8192]

One attention (batch 1, 4 heads of 64, bigbird_block_size 64, 3 random blocks: BigBird-base's
pattern), forward and backward (the gradient of sum(out^2) w.r.t. q, k, v), compiled by XLA for
this machine's backend and never run: XLA's own accounting of the program's temporary buffers
(memory_analysis().temp_size_in_bytes) and FLOPs (cost_analysis()['flops']). Dense softmax is
tfjax.nn.ops.dot_product_attention with implementation='xla'. Prints a Markdown table
(docs/attention/bigbird.md).
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from tfjax.nn import ops
from tfjax.nn.kinds import bigbird

HEADS, DIM, BLOCK, RANDOM = 4, 64, 64, 3


def _compiled(fn, length):
  x = jax.ShapeDtypeStruct((1, length, HEADS, DIM), jnp.float32)
  grad = jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2))
  compiled = jax.jit(grad).lower(x, x, x).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return compiled.memory_analysis().temp_size_in_bytes, cost.get("flops", float("nan"))


def main(argv) -> None:
  lengths = (1024, 2048, 4096, 8192)
  for arg in argv[1:]:
    if arg.startswith("--lengths="):
      lengths = tuple(int(v) for v in arg.split("=", 1)[1].split(","))
  print(f"backend {jax.default_backend()}, jax {jax.__version__}")
  print("| L | bigbird temp MiB | softmax temp MiB | bigbird GFLOP | softmax GFLOP |")
  print("| --- | --- | --- | --- | --- |")
  for length in lengths:
    table = bigbird.random_blocks(length, BLOCK, RANDOM, HEADS, 0, max(length, 4096))
    sparse = lambda q, k, v, t=table: bigbird.block_sparse_attention(
        q, k, v, t, block_size=BLOCK)
    dense = lambda q, k, v: ops.dot_product_attention(q, k, v, implementation="xla")
    (bb_mem, bb_flops), (sm_mem, sm_flops) = _compiled(sparse, length), _compiled(dense, length)
    print(f"| {length} | {bb_mem / 2**20:.1f} | {sm_mem / 2**20:.1f} | {bb_flops / 1e9:.2f} | "
          f"{sm_flops / 1e9:.2f} |")


if __name__ == "__main__":
  main(sys.argv)
