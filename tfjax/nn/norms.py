"""LayerNorm (Ba et al.) and RMSNorm (Zhang & Sennrich), selected by `model.norm`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig


class Norm(nn.Module):
  """layernorm: (x - mean) / sqrt(var + eps) * scale + bias;
  rmsnorm: x / sqrt(mean(x^2) + eps) * scale.

  Statistics are computed in float32 whatever the compute dtype (bf16 variance underflows).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x32 = x.astype(jnp.float32)
    if cfg.norm == "layernorm":
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + cfg.norm_eps)
    scale = self.param(
        "scale", nn.with_logical_partitioning(nn.initializers.ones, (axes.EMBED,)), (x.shape[-1],))
    y = y * scale
    if cfg.norm == "layernorm" and cfg.norm_bias:
      y = y + self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, (axes.EMBED,)),
          (x.shape[-1],))
    return y.astype(cfg.compute_dtype)
