"""XLA:CPU performance workarounds (no-ops on GPU/TPU): fusion boundaries that make the backward
pass fast, and one flat gradient all-reduce for data parallelism over CPU devices.

Profiling nanoGPT's CPU recipe (4x128, batch 12 x 64) showed forward+backward ~9x the forward.
Nearly all of the gap was XLA:CPU fusing elementwise backward math (GELU's erf polynomial,
LayerNorm's backward and the residual-gradient sum) into the transposes that feed weight-gradient
matmuls dW = x^T g; such transpose fusions run scalar and strided. XLA:CPU drops
`optimization_barrier`, but cannot fuse across a data-dependent `lax.cond`, so routing a value
through one makes it be written once, vectorized, and the transpose becomes a plain copy.
See docs/benchmarks.md for before/after step times.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _materialized(value, like):
  """`value`, computed in its own fusion: a cond whose predicate (on the primal `like`) is never
  true but cannot be folded away. Linear in `value`, so JAX can transpose it."""
  never = jnp.isnan(like.reshape(-1)[0])
  return jax.lax.cond(never, jnp.zeros_like, lambda v: v, value)


@jax.custom_jvp
def _identity_materialized_cotangent(x):
  return x


@_identity_materialized_cotangent.defjvp
def _identity_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  # Transposed for the backward pass, this cond materializes the cotangent.
  return x, _materialized(t, x)


def materialize_cotangent(x):
  """Identity whose gradient is materialized: put it where a residual-stream gradient forms."""
  return _identity_materialized_cotangent(x) if _on_cpu() else x


def derivative_materialized(act):
  """`act` whose derivative act'(x) is computed and materialized in the forward pass, so the
  backward pass only multiplies by it. A custom JVP (not VJP) keeps forward-mode autodiff
  working."""
  @jax.custom_jvp
  def fn(x):
    return act(x)

  @fn.defjvp
  def fn_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y, vjp = jax.vjp(act, x)  # elementwise: act'(x) = vjp(ones)
    derivative = _materialized(vjp(jnp.ones_like(y))[0], x)
    return y, derivative * t

  return lambda x: fn(x) if _on_cpu() else act(x)


def flat_all_reduce_applies(mesh, model_config) -> bool:
  """Whether `summed_over_shards` should replace GSPMD's gradient all-reduce: on one CPU host,
  a mesh that is data parallel only (config.mesh.cpu_devices), and no dropout (whose masks
  shard_map would draw per shard, unlike the global draw of the other path)."""
  data_only = mesh.shape.get("data", 1) > 1 and mesh.size == mesh.shape["data"]
  return (_on_cpu() and jax.process_count() == 1 and data_only
          and model_config.dropout == 0 and model_config.attention_dropout == 0)


def summed_over_shards(fn, mesh, batch_spec):
  """`fn(params, batch, rng) -> pytree of sums over the batch`, computed on each data shard and
  added up with ONE all-reduce of a flat vector.

  Why: XLA:CPU all-reduces a tuple of buffers one rendezvous per buffer (~50 per step for a
  4-layer GPT), and each rendezvous waits for the slower device; one flat buffer makes it one
  (nanoGPT's CPU recipe on 2 devices: 41-44 -> 35-38 ms per step). The sums equal GSPMD's to
  float rounding: tests/test_sharding.py (8 devices vs 1) and tests/test_train.py (with gradient
  accumulation)."""
  axes = batch_spec[0]

  def local(params, batch, rng):
    with nn.logical_axis_rules(()):  # inside shard_map every array is already this shard's
      sums = fn(params, batch, rng)
    flat, unflatten = ravel_pytree(sums)
    return unflatten(jax.lax.psum(flat, axes))

  replicated = PartitionSpec()
  return jax.shard_map(local, mesh=mesh, in_specs=(replicated, batch_spec, replicated),
                       out_specs=replicated, check_vma=False)
