"""CLIP (Radford et al. 2021): an image tower and a text tower over tfjax's pre-LN blocks, linear
projections into one embedding space, and the symmetric contrastive loss with a learned
temperature.

  image tower  the ViT front-end (tfjax/nn/vision.py) with a LayerNorm on the embeddings
               (pre_norm), no patch bias; pooled = final_norm(h)[:, 0]
  text tower   tokens + learned positions -> causal pre-LN layers -> final norm; pooled at the
               first EOS token (HF CLIP; with the legacy eos_token_id == 2 of early configs, at
               the largest token id, which was EOS in CLIP's vocabulary)
  embeddings   i = W_i pooled_image / |.|, t = W_t pooled_text / |.|   (W_i, W_t bias-free)
  logits       logits_per_image [B_img, B_txt] = exp(s) i t^T, s learned (init ln(1/0.07))
  loss         (CE(logits_per_image, arange) + CE(logits_per_image^T, arange)) / 2

The text tower is causal, so a position attends only to itself and earlier tokens: padding
after EOS cannot change the pooled EOS state, and no padding mask is needed for it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp
import optax

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig
from tfjax.nn.layers import LayerStack
from tfjax.nn.vision import VisionEncoder, ViTConfig

LOGIT_SCALE_INIT = 2.6592  # ln(1 / 0.07), the paper's initial temperature 0.07


@dataclasses.dataclass(frozen=True)
class TextConfig:
  """vocab_size, max_len (position table rows), d_model, num_layers, num_heads, d_ff, ffn
  (quick_gelu for OpenAI's CLIP), norm_eps; eos_id: the pooled token (module docstring)."""
  vocab_size: int = 64
  max_len: int = 16
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  d_ff: int = 128
  ffn: str = "quick_gelu"
  norm_eps: float = 1e-5
  eos_id: int = 2
  init_std: float = 0.02
  dtype: str = "float32"
  attention_impl: str = "xla"

  def blocks(self) -> ModelConfig:
    return ModelConfig.from_flat(dict(
        family="decoder", vocab_size=self.vocab_size, d_model=self.d_model,
        num_layers=self.num_layers, num_heads=self.num_heads, d_ff=self.d_ff, ffn=self.ffn,
        ffn_bias=True, attention_bias=True, norm="layernorm", norm_eps=self.norm_eps,
        norm_placement="pre", position="none", max_len=self.max_len, init_std=self.init_std,
        dtype=self.dtype, attention_impl=self.attention_impl)).validated()


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
  """text: TextConfig; vision: ViTConfig (pre_norm, no patch bias, no classes); projection_dim:
  the shared embedding width; logit_scale_init: s at init (exp(s) = 1 / temperature)."""
  text: TextConfig = TextConfig()
  vision: ViTConfig = ViTConfig(pre_norm=True, patch_bias=False, num_classes=0, norm_eps=1e-5,
                                ffn="quick_gelu")
  projection_dim: int = 32
  logit_scale_init: float = LOGIT_SCALE_INIT

  @classmethod
  def from_dict(cls, values: dict) -> "CLIPConfig":
    """From nested dicts ({'text': {...}, 'vision': {...}, ...}), e.g. an ml_collections config."""
    values = dict(values)
    text = TextConfig(**dict(values.pop("text", {})))
    vision = dataclasses.replace(cls.vision, **dict(values.pop("vision", {})))
    return cls(text=text, vision=vision, **values).validated()

  def validated(self) -> "CLIPConfig":
    self.text.blocks()
    self.vision.validated()
    if not (self.vision.pre_norm and not self.vision.num_classes):
      raise ValueError("CLIP's image tower has a pre-norm and no classifier: set "
                       "vision pre_norm=True and num_classes=0")
    if self.projection_dim < 1:
      raise ValueError(f"clip projection_dim={self.projection_dim} must be a positive integer")
    if not 0 <= self.text.eos_id < self.text.vocab_size:
      raise ValueError(f"clip text eos_id={self.text.eos_id} is not a token id of the "
                       f"vocabulary of {self.text.vocab_size}")
    return self


def eos_positions(token_ids_BxL, eos_id: int):
  """The pooled position of each row: its first `eos_id`, or with eos_id == 2 (the configs
  written before transformers PR #24773) its largest token id's first position."""
  if eos_id == 2:
    return jnp.argmax(token_ids_BxL, axis=-1)
  return jnp.argmax(token_ids_BxL == eos_id, axis=-1)


class TextEncoder(nn.Module):
  """token ids [B, L] -> (tokens [B, L, D] after the final norm, pooled [B, D] at EOS)."""
  config: TextConfig

  @nn.compact
  def __call__(self, token_ids_BxL):
    cfg = self.config
    blocks = cfg.blocks()
    length = token_ids_BxL.shape[1]
    if length > cfg.max_len:
      raise ValueError(f"text of length {length} exceeds the position table (max_len="
                       f"{cfg.max_len}); truncate the text or raise max_len")
    init = nn.initializers.normal(cfg.init_std)
    logical = nn.with_logical_partitioning  # every parameter's axes (tfjax/nn/axes.py)
    table = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=blocks.compute_dtype,
                     embedding_init=logical(init, (axes.VOCAB, axes.EMBED)), name="tokens")
    positions_LxD = self.param("positions", logical(init, (None, axes.EMBED)),
                               (cfg.max_len, cfg.d_model))
    x_BxLxD = table(token_ids_BxL) + positions_LxD[:length].astype(blocks.compute_dtype)
    h_BxLxD = LayerStack(blocks, cfg.num_layers, causal=True, name="encoder")(x_BxLxD)
    rows = jnp.arange(h_BxLxD.shape[0])
    return h_BxLxD, h_BxLxD[rows, eos_positions(token_ids_BxL, cfg.eos_id)]


def _normalized(x_BxP):
  return x_BxP / jnp.linalg.norm(x_BxP, axis=-1, keepdims=True)


class CLIP(nn.Module):
  """(images [B, H, W, C], token ids [B', L]) -> {'image_embeds' [B, P], 'text_embeds' [B', P]
  (unit length), 'logits_per_image' [B, B'], 'logits_per_text' [B', B], 'logit_scale' s}."""
  config: CLIPConfig

  def setup(self):
    cfg = self.config
    init = nn.with_logical_partitioning(nn.initializers.normal(0.02), (axes.EMBED, None))
    self.vision = VisionEncoder(cfg.vision)
    self.text = TextEncoder(cfg.text)
    self.visual_projection = nn.Dense(cfg.projection_dim, use_bias=False, kernel_init=init)
    self.text_projection = nn.Dense(cfg.projection_dim, use_bias=False, kernel_init=init)
    self.logit_scale = self.param("logit_scale", nn.with_logical_partitioning(
        nn.initializers.constant(cfg.logit_scale_init), ()), ())

  def encode_image(self, images_BxHxWxC):
    return _normalized(self.visual_projection(self.vision(images_BxHxWxC)[1]))

  def encode_text(self, token_ids_BxL):
    return _normalized(self.text_projection(self.text(token_ids_BxL)[1]))

  def __call__(self, images_BxHxWxC, token_ids_BxL):
    image_BxP = self.encode_image(images_BxHxWxC).astype(jnp.float32)
    text_BxP = self.encode_text(token_ids_BxL).astype(jnp.float32)
    logits_per_image = jnp.exp(self.logit_scale) * image_BxP @ text_BxP.T
    return {"image_embeds": image_BxP, "text_embeds": text_BxP,
            "logits_per_image": logits_per_image, "logits_per_text": logits_per_image.T,
            "logit_scale": self.logit_scale}


def contrastive_loss(logits_per_image, labels: Optional[jnp.ndarray] = None):
  """The symmetric InfoNCE loss: mean of the image->text and text->image cross-entropies, pair
  i matching pair `labels[i]` (default i)."""
  if labels is None:
    labels = jnp.arange(logits_per_image.shape[0])
  image_loss = optax.softmax_cross_entropy_with_integer_labels(logits_per_image, labels)
  text_loss = optax.softmax_cross_entropy_with_integer_labels(logits_per_image.T, labels)
  return (image_loss.mean() + text_loss.mean()) / 2
