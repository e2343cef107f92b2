"""Position-wise feed-forward: relu / gelu (two matrices) and swiglu / geglu (three; Shazeer 2020)."""

from __future__ import annotations

import flax.linen as nn
import jax

from tfjax.config import ModelConfig
from tfjax.cpu_fusion import derivative_materialized  # why: see that module


def _gelu(x):
  return jax.nn.gelu(x, approximate=False)


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": derivative_materialized(_gelu),
    "swiglu": derivative_materialized(jax.nn.silu),
    "geglu": derivative_materialized(_gelu),
}


def dense(cfg: ModelConfig, features: int, axes, name: str, use_bias: bool):
  """A Dense layer whose kernel and bias carry logical axis names for sharding."""
  return nn.Dense(
      features, use_bias=use_bias, dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), axes),
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
    return dense(cfg, x_BxLxD.shape[-1], ("mlp", "embed"), "wo", cfg.ffn_bias)(h_BxLxF)
