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


def _materialize(x):
  """x, computed in its own fusion (the predicate is never true but cannot be folded)."""
  never = jnp.isnan(x.reshape(-1)[0])
  return jax.lax.cond(never, jnp.zeros_like, lambda v: v, x)


@jax.custom_vjp
def _identity_materialized_cotangent(x):
  return x


def _identity_fwd(x):
  return x, None


def _identity_bwd(_, g):
  return (_materialize(g),)


_identity_materialized_cotangent.defvjp(_identity_fwd, _identity_bwd)


def materialize_cotangent(x):
  """Identity whose gradient is materialized: put it where a residual-stream gradient forms."""
  return _identity_materialized_cotangent(x) if _on_cpu() else x


def derivative_materialized(act):
  """`act` whose derivative act'(x) is computed in the forward pass, materialized, and reused."""
  @jax.custom_vjp
  def fn(x):
    return act(x)

  def fwd(x):
    y, vjp = jax.vjp(act, x)
    never = jnp.isnan(x.reshape(-1)[0])
    derivative = jax.lax.cond(never, jnp.zeros_like, lambda v: vjp(jnp.ones_like(v))[0], x)
    return y, derivative

  def bwd(derivative, g):
    return (g * derivative,)

  fn.defvjp(fwd, bwd)
  return lambda x: fn(x) if _on_cpu() else act(x)
