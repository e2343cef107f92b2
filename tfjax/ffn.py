"""Position-wise feed-forward: relu / gelu (two matrices), swiglu / geglu (three; Shazeer 2020)."""

from __future__ import annotations

import flax.linen as nn
import jax

from tfjax.config import ModelConfig
from tfjax.cpu_fusion import derivative_materialized  # why: see that module


def _gelu(x):
  """Exact GELU x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)) (Hendrycks & Gimpel). Written with erf,
  not jax.nn.gelu's erfc form: erf is one vectorized polynomial, erfc adds exp and divisions
  (~2x the elementwise time of the FFN on CPU); they differ by < 1e-7 absolute."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)))


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": derivative_materialized(_gelu),
    "swiglu": derivative_materialized(jax.nn.silu),
    "geglu": derivative_materialized(_gelu),
}


def dense(cfg: ModelConfig, features: int, axes, name: str, use_bias: bool,
          init_std: float | None = None):
  """A Dense layer whose kernel and bias carry logical axis names for sharding."""
  std = cfg.init_std if init_std is None else init_std
  return nn.Dense(
      features, use_bias=use_bias, dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(std), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axes[-1],)))


class FeedForward(nn.Module):
  """relu/gelu: W2 act(W1 x);  swiglu/geglu: W2 (act(W_gate x) * (W1 x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.config
    act = _ACTIVATIONS[cfg.ffn]
    h_BxLxF = dense(cfg, cfg.d_ff, ("embed", "mlp"), "wi", cfg.ffn_bias)(x_BxLxD)
    if cfg.ffn in ("swiglu", "geglu"):
      gate_BxLxF = dense(cfg, cfg.d_ff, ("embed", "mlp"), "wi_gate", cfg.ffn_bias)(x_BxLxD)
      h_BxLxF = act(gate_BxLxF) * h_BxLxF
    else:
      h_BxLxF = act(h_BxLxF)
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, ("batch", "length", "mlp"))
    return dense(cfg, x_BxLxD.shape[-1], ("mlp", "embed"), "wo", cfg.ffn_bias,
                 cfg.residual_init_std)(h_BxLxF)
