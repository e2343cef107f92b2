"""Position-wise feed-forward: relu / gelu (two matrices), swiglu / geglu (three; Shazeer 2020)."""

from __future__ import annotations

import flax.linen as nn
import jax

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig


def gelu(x):
  """Exact GELU x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel), the one GELU of
  the library. Written with erf, not jax.nn.gelu's erfc form (the same function to < 1e-7
  absolute): erf is one vectorized polynomial, erfc adds an exp and divisions (docs/benchmarks.md).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)))


# The nonlinearity of each `model.ffn`; the gated kinds apply it to the gate.
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": gelu,
    "swiglu": jax.nn.silu,
    "geglu": gelu,
}
GATED = ("swiglu", "geglu")


def dense(cfg: ModelConfig, features: int, logical_axes, name: str, use_bias: bool,
          init_std: float | None = None):
  """A Dense layer whose kernel and bias carry logical axis names for sharding."""
  std = cfg.init_std if init_std is None else init_std
  return nn.Dense(
      features, use_bias=use_bias, dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(std), logical_axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (logical_axes[-1],)))


class FeedForward(nn.Module):
  """relu/gelu: W2 act(W1 x);  swiglu/geglu: W2 (act(W_gate x) * (W1 x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    act = ACTIVATIONS[cfg.ffn]
    h_BxLxF = dense(cfg, cfg.d_ff, (axes.EMBED, axes.MLP), "wi", cfg.ffn_bias)(x_BxLxD)
    if cfg.ffn in GATED:
      gate_BxLxF = dense(cfg, cfg.d_ff, (axes.EMBED, axes.MLP), "wi_gate", cfg.ffn_bias)(x_BxLxD)
      h_BxLxF = act(gate_BxLxF) * h_BxLxF
    else:
      h_BxLxF = act(h_BxLxF)
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, (axes.BATCH, axes.LENGTH, axes.MLP))
    return dense(cfg, x_BxLxD.shape[-1], (axes.MLP, axes.EMBED), "wo", cfg.ffn_bias,
                 cfg.residual_init_std)(h_BxLxF)
