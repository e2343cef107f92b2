"""LayerNorm (Ba et al.) and RMSNorm (Zhang & Sennrich), selected by `model.norm`."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig


class Norm(nn.Module):
  """layernorm: (x - mean) / sqrt(var + eps) * scale + bias;
  rmsnorm: x / sqrt(mean(x^2) + eps) * scale.

  With model.norm_unit_offset the scale is (1 + w), w initialized to 0 (Gemma's RMSNorm), so the
  same function at init but weight decay pulls the gain towards 1 rather than 0.
  Statistics are computed in float32 whatever the compute dtype (bf16 variance underflows).
  `kind` overrides model.norm (QK-norm has its own key); `axis` is the logical axis of the
  normalized dimension (embed for the residual stream, head_dim for QK-norm).
  """
  config: ModelConfig
  kind: Optional[str] = None
  axis: str = axes.EMBED

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    kind = cfg.norm if self.kind is None else self.kind
    x32 = x.astype(jnp.float32)
    if kind == "layernorm":
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + cfg.norm_eps)
    init = nn.initializers.zeros if cfg.norm_unit_offset else nn.initializers.ones
    scale = self.param("scale", nn.with_logical_partitioning(init, (self.axis,)), (x.shape[-1],))
    y = y * (1.0 + scale) if cfg.norm_unit_offset else y * scale
    if kind == "layernorm" and cfg.norm_bias:
      y = y + self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,)),
          (x.shape[-1],))
    return y.astype(cfg.compute_dtype)
