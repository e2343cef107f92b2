"""LayerNorm (Ba et al.) and RMSNorm (Zhang & Sennrich), selected by `model.norm`; the norms'
config section (kind, eps, bias, unit offset, placement) and DeepNorm's constants.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.choices import one_of
from tfjax.nn.sections import Section, flat_key, internal

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("pre", "post", "sandwich", "deepnorm")


@dataclasses.dataclass(frozen=True)
class NormConfig(Section):
  """kind: layernorm | rmsnorm. eps: added to the variance. bias: LayerNorm's beta (RMSNorm never
  has one). unit_offset: every norm's gain is (1 + w), w initialized to 0 (Gemma).
  placement: pre: x + f(norm(x)), final norm | post: norm(x + f(x)) | sandwich: x +
  norm(f(norm(x))), final norm (Gemma 2) | deepnorm: norm(alpha x + f(x)), init gain beta on W_V,
  W_O, FFN (Wang et al. 2022; tfjax/nn/layers.py). parallel_shared_norm: a parallel block's one
  norm feeds both branches (GPT-J, Falcon-7B); False: attention and FFN norms (NeoX, Falcon-40B).
  residual_alpha / init_gain: DeepNorm's alpha and beta of one layer stack, set by
  `stack_config` from the layer counts (1 otherwise; not config keys).
  """
  kind: str = flat_key("norm", "layernorm")
  eps: float = flat_key("norm_eps", 1e-5)
  bias: bool = flat_key("norm_bias", True)
  unit_offset: bool = flat_key("norm_unit_offset", False)
  placement: str = flat_key("norm_placement", "pre")
  parallel_shared_norm: bool = True
  residual_alpha: float = internal(1.0)
  init_gain: float = internal(1.0)

  @staticmethod
  def eps_from_hf(f, hf_key: str, default: float) -> dict:
    """model.norm_eps from config.json (`f`: tfjax.hf.mapping.Fields), whose family spells the
    epsilon `hf_key` (rms_norm_eps, layer_norm_eps, layer_norm_epsilon) with its own default."""
    return {"norm_eps": float(f.get(hf_key, default))}

  def eps_to_hf(self, hf_key: str) -> dict:
    return {hf_key: self.eps}

  @property
  def has_final_norm(self) -> bool:
    """Whether each layer stack ends with a norm (pre-norm placements leave the stream unnormed)."""
    return self.placement in ("pre", "sandwich")

  def validate(self, model) -> None:
    one_of("model.norm", self.kind, NORMS)
    one_of("model.norm_placement", self.placement, PLACEMENTS)
    if model.parallel_block:
      if self.placement != "pre":
        raise ValueError(f"model.parallel_block=True is a pre-norm block (x + attn(norm(x)) + "
                         f"ffn(norm(x))), not norm_placement={self.placement!r}; set "
                         "model.norm_placement='pre'")
    elif not self.parallel_shared_norm:
      raise ValueError("model.parallel_shared_norm=False chooses the norms of a parallel block; "
                       "set model.parallel_block=True or leave it True")
    if self.placement == "deepnorm" and model.scaled_residual_init:
      raise ValueError("model.norm_placement='deepnorm' sets its own residual init gain (beta); "
                       "set model.scaled_residual_init=False")


def deepnorm_constants(cfg: ModelConfig, decoder_stack: bool) -> Tuple[float, float]:
  """DeepNet's (alpha, beta) for a stack (Wang et al. 2022, table 1), N encoder / M decoder layers.

  decoder-only or encoder-only (N layers): alpha = (2N)^(1/4), beta = (8N)^(-1/4);
  encoder-decoder: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16),
                   decoder alpha = (3M)^(1/4),         beta = (12M)^(-1/4).
  (1, 1) for every other norm placement.
  """
  if cfg.norms.placement != "deepnorm":
    return 1.0, 1.0
  n, m = cfg.num_layers, cfg.decoder_layers
  if cfg.family != "encoder_decoder":
    return (2.0 * n) ** 0.25, (8.0 * n) ** -0.25
  if decoder_stack:
    return (3.0 * m) ** 0.25, (12.0 * m) ** -0.25
  return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)


def stack_config(cfg: ModelConfig, decoder_stack: bool) -> ModelConfig:
  """`cfg` for the layers of one stack: its norms section carries that stack's DeepNorm alpha
  (read by the residual step) and beta (read by the W_V, W_O and FFN inits)."""
  alpha, beta = deepnorm_constants(cfg, decoder_stack)
  if (alpha, beta) == (cfg.norms.residual_alpha, cfg.norms.init_gain):
    return cfg
  return dataclasses.replace(
      cfg, norms=dataclasses.replace(cfg.norms, residual_alpha=alpha, init_gain=beta))


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
    norms = cfg.norms
    kind = norms.kind if self.kind is None else self.kind
    x32 = x.astype(jnp.float32)
    if kind == "layernorm":
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + norms.eps)
    init = nn.initializers.zeros if norms.unit_offset else nn.initializers.ones
    scale = self.param("scale", nn.with_logical_partitioning(init, (self.axis,)), (x.shape[-1],))
    y = y * (1.0 + scale) if norms.unit_offset else y * scale
    if kind == "layernorm" and norms.bias:
      y = y + self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,)),
          (x.shape[-1],))
    return y.astype(cfg.compute_dtype)
