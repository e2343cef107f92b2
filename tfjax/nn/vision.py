"""Vision Transformer (Dosovitskiy et al. 2021) as a front-end over tfjax's encoder blocks.

  images [B, H, W, C] -> patches [B, N, P*P*C] (N = (H/P)(W/P), row-major, each patch
  flattened (row, column, channel)) -> x = patches W_E (+ b_E) -> [CLS; x] + E_pos [B, N+1, D]
  -> (CLIP: LayerNorm) -> pre-LN encoder layers (tfjax/nn/layers.py LayerStack) -> final norm
  -> h[:, 0] -> classifier [B, classes] (ViT) or projection (CLIP, tfjax/nn/clip.py).

The patch embedding is the paper's stride-P convolution written as a reshape and a Dense layer:
the same linear map, its kernel the conv weight [D, C, P, P] transposed to [P, P, C, D] and
flattened (tfjax/hf/models/vit.py). Shape letters as in tfjax/nn/axes.py; N = patches, K = P*P*C.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig
from tfjax.nn.layers import LayerStack
from tfjax.nn.norms import Norm


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """image_size, patch_size (square), channels; d_model, num_layers, num_heads, d_ff of the
  encoder; ffn: its activation (tfjax/nn/ffn.py: gelu, gelu_tanh, quick_gelu, ...); norm_eps
  (HF ViT 1e-12, CLIP 1e-5); qkv_bias; patch_bias (ViT True, CLIP False); pre_norm: a LayerNorm
  on the embeddings before the first layer (CLIP's pre_layrnorm); num_classes: 0 = no head;
  pooler: HF ViTModel's pooler, tanh(Dense(h[:, 0])) as 'pooler_output' (off for the
  classifier, which reads h[:, 0] itself)."""
  image_size: int = 32
  patch_size: int = 8
  channels: int = 3
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  d_ff: int = 128
  ffn: str = "gelu"
  norm_eps: float = 1e-12
  qkv_bias: bool = True
  patch_bias: bool = True
  pre_norm: bool = False
  num_classes: int = 10
  pooler: bool = False
  init_std: float = 0.02
  dtype: str = "float32"
  attention_impl: str = "xla"

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def num_patches(self) -> int:
    return self.grid ** 2

  def validated(self) -> "ViTConfig":
    if self.image_size % self.patch_size:
      raise ValueError(f"vision image_size={self.image_size} is not a multiple of "
                       f"patch_size={self.patch_size}; change one so patches tile the image")
    for key in ("image_size", "patch_size", "channels", "d_model", "num_layers", "num_heads",
                "d_ff"):
      if getattr(self, key) < 1:
        raise ValueError(f"vision {key}={getattr(self, key)} must be a positive integer")
    if self.num_classes < 0:
      raise ValueError(f"vision num_classes={self.num_classes} must be >= 0 (0: no head)")
    self.blocks()  # the encoder blocks' own checks (heads divide d_model, the activation)
    return self

  def blocks(self) -> ModelConfig:
    """The ModelConfig of the encoder layers: pre-LN LayerNorm, bidirectional, no positions in
    attention (the learned table is added to the embeddings here)."""
    return ModelConfig.from_flat(dict(
        family="encoder", vocab_size=1, d_model=self.d_model, num_layers=self.num_layers,
        num_heads=self.num_heads, d_ff=self.d_ff, ffn=self.ffn, ffn_bias=True,
        attention_bias=self.qkv_bias, attention_out_bias=True, norm="layernorm",
        norm_eps=self.norm_eps, norm_placement="pre", position="none",
        max_len=self.num_patches + 1, mlm_head=False, init_std=self.init_std, dtype=self.dtype,
        attention_impl=self.attention_impl)).validated()


def patchify(images_BxHxWxC, patch: int):
  """[B, H, W, C] -> [B, N, P*P*C]: patches in row-major order, each flattened (row, col, ch)."""
  b, h, w, c = images_BxHxWxC.shape
  x = images_BxHxWxC.reshape(b, h // patch, patch, w // patch, patch, c)
  x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, gh, gw, P, P, C]
  return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


class VisionEncoder(nn.Module):
  """images [B, H, W, C] -> (tokens [B, N+1, D] after the final norm, pooled [B, D] = token 0)."""
  config: ViTConfig

  @nn.compact
  def __call__(self, images_BxHxWxC):
    cfg = self.config
    blocks = cfg.blocks()
    expected = (cfg.image_size, cfg.image_size, cfg.channels)
    if tuple(images_BxHxWxC.shape[1:]) != expected:
      raise ValueError(f"images of shape {tuple(images_BxHxWxC.shape)}: this model reads "
                       f"[batch, {expected[0]}, {expected[1]}, {expected[2]}] (channels last); "
                       "resize the images or build the config with their size")
    patches_BxNxK = patchify(images_BxHxWxC.astype(blocks.compute_dtype), cfg.patch_size)
    init = nn.initializers.normal(cfg.init_std)
    logical = nn.with_logical_partitioning  # every parameter's axes (tfjax/nn/axes.py)
    x_BxNxD = nn.Dense(cfg.d_model, use_bias=cfg.patch_bias, dtype=blocks.compute_dtype,
                       kernel_init=logical(init, (None, axes.EMBED)),
                       bias_init=logical(nn.initializers.zeros, (axes.EMBED,)),
                       name="patch_embed")(patches_BxNxK)
    cls_D = self.param("cls_token", logical(init, (axes.EMBED,)), (cfg.d_model,))
    cls_Bx1xD = jnp.broadcast_to(cls_D.astype(x_BxNxD.dtype), (x_BxNxD.shape[0], 1, cfg.d_model))
    x_BxNxD = jnp.concatenate([cls_Bx1xD, x_BxNxD], axis=1)
    positions_NxD = self.param("positions", logical(init, (None, axes.EMBED)),
                               (cfg.num_patches + 1, cfg.d_model))
    x_BxNxD = x_BxNxD + positions_NxD.astype(x_BxNxD.dtype)
    if cfg.pre_norm:
      x_BxNxD = Norm(blocks, name="pre_norm")(x_BxNxD)
    h_BxNxD = LayerStack(blocks, cfg.num_layers, name="encoder")(x_BxNxD)
    return h_BxNxD, h_BxNxD[:, 0]


class ViTClassifier(nn.Module):
  """ViT image classifier: {'hidden' [B, N+1, D], 'pooled' [B, D], 'logits' [B, classes]}
  (with num_classes), 'pooler_output' [B, D] (with pooler)."""
  config: ViTConfig

  @nn.compact
  def __call__(self, images_BxHxWxC):
    cfg = self.config
    hidden, pooled = VisionEncoder(cfg, name="vision")(images_BxHxWxC)
    out = {"hidden": hidden, "pooled": pooled}
    if cfg.pooler:
      dense = nn.Dense(cfg.d_model, dtype=cfg.blocks().compute_dtype,
                       kernel_init=nn.with_logical_partitioning(
                           nn.initializers.normal(cfg.init_std), (axes.EMBED, None)),
                       bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
                       name="pooler")
      out["pooler_output"] = jnp.tanh(dense(pooled)).astype(jnp.float32)
    if cfg.num_classes:
      head = nn.Dense(cfg.num_classes, dtype=cfg.blocks().compute_dtype,
                      kernel_init=nn.with_logical_partitioning(
                          nn.initializers.normal(cfg.init_std), (axes.EMBED, None)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
                      name="classifier")
      out["logits"] = head(pooled).astype(jnp.float32)
    return out
