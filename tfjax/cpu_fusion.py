"""Fusion boundaries that make XLA:CPU's backward pass fast (no-ops on GPU/TPU).

Profiling nanoGPT's CPU recipe (4x128, batch 12 x 64) showed forward+backward ~9x the forward.
Nearly all of the gap was XLA:CPU fusing elementwise backward math (GELU's erf polynomial,
LayerNorm's backward and the residual-gradient sum) into the transposes that feed weight-gradient
matmuls dW = x^T g; such transpose fusions run scalar and strided. XLA:CPU drops
`optimization_barrier`, but cannot fuse across a data-dependent `lax.cond`, so routing a value
through one makes it be written once, vectorized, and the transpose becomes a plain copy.
See docs/benchmarks.md for before/after step times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
  backward pass only multiplies by it. A custom JVP (not VJP) keeps forward-mode autodiff working."""
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
