"""Transformer layers and layer stacks.

One `TransformerLayer` covers the three layer kinds of the families:
  encoder layer       self-attention (bidirectional) -> FFN
  decoder-only block  causal self-attention -> FFN
  decoder layer       causal self-attention -> cross-attention -> FFN
Each sublayer f is one `TransformerLayer.sublayer(name, x, f)` call, x being the residual stream:
  pre: x + dropout(f(norm(x)))   post: norm(x + dropout(f(x)))
  sandwich: x + dropout(post_norm(f(pre_norm(x))))  (Gemma 2)
  deepnorm: norm(alpha * x + dropout(f(x)))  (DeepNet, Wang et al. 2022; alpha and the init gain
            beta of W_V, W_O and the FFN from `deepnorm_constants`).
model.parallel_block replaces the sequence by one residual step (GPT-J, GPT-NeoX, Falcon, PaLM):
  x + dropout(attn(norm(x))) + dropout(ffn(norm'(x))), norm' = norm if parallel_shared_norm.
With model.window_pattern, layer i's causal self-attention is global iff (i + 1) % pattern == 0.
`LayerStack` runs N layers as a Python loop or under `nn.scan` (params stacked on a leading
'layers' axis; compile time flat in depth), optionally recomputing activations in the backward
pass (`model.remat`).
"""

from __future__ import annotations

from typing import Callable, Tuple

import flax.linen as nn
import jax

from tfjax.nn import axes
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.config import ModelConfig
from tfjax.nn.ffn import FeedForward
from tfjax.nn.norms import Norm
from tfjax.nn.relative_bias import RelativePositionTable


def deepnorm_constants(cfg: ModelConfig, decoder_stack: bool) -> Tuple[float, float]:
  """DeepNet's (alpha, beta) for a stack (Wang et al. 2022, table 1), N encoder / M decoder layers.

  decoder-only or encoder-only (N layers): alpha = (2N)^(1/4), beta = (8N)^(-1/4);
  encoder-decoder: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16),
                   decoder alpha = (3M)^(1/4),         beta = (12M)^(-1/4).
  (1, 1) for every other norm placement.
  """
  if cfg.norm_placement != "deepnorm":
    return 1.0, 1.0
  n, m = cfg.num_layers, cfg.decoder_layers
  if cfg.family != "encoder_decoder":
    return (2.0 * n) ** 0.25, (8.0 * n) ** -0.25
  if decoder_stack:
    return (3.0 * m) ** 0.25, (12.0 * m) ** -0.25
  return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)


class TransformerLayer(nn.Module):
  config: ModelConfig
  causal: bool = False
  cross_attention: bool = False
  sliding: bool = True  # self-attention uses model.window (False: a global layer)
  residual_alpha: float = 1.0  # deepnorm: the residual stream's weight
  init_gain: float = 1.0  # deepnorm: beta on the init std of W_V, W_O and the FFN

  def sublayer(self, name: str, x_BxLxD, fn: Callable):
    """One residual sublayer around `fn`, with its norm named `{name}_norm`."""
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)
    norm = Norm(cfg, name=f"{name}_norm")
    if cfg.norm_placement == "pre":
      y_BxLxD = x_BxLxD + dropout(fn(norm(x_BxLxD)))
    elif cfg.norm_placement == "sandwich":
      y_BxLxD = x_BxLxD + dropout(Norm(cfg, name=f"{name}_post_norm")(fn(norm(x_BxLxD))))
    elif cfg.norm_placement == "deepnorm":
      y_BxLxD = norm(x_BxLxD * self.residual_alpha + dropout(fn(x_BxLxD)))
    else:
      y_BxLxD = norm(x_BxLxD + dropout(fn(x_BxLxD)))
    return nn.with_logical_constraint(y_BxLxD, axes.RESIDUAL_STREAM)

  def parallel(self, x_BxLxD, attention: Callable, ffn: Callable):
    """x + dropout(attn(norm(x))) + dropout(ffn(norm'(x))): both branches read the block input."""
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)
    h_BxLxD = Norm(cfg, name="self_attention_norm")(x_BxLxD)
    h_ffn_BxLxD = h_BxLxD if cfg.parallel_shared_norm else Norm(cfg, name="ffn_norm")(x_BxLxD)
    y_BxLxD = x_BxLxD + dropout(attention(h_BxLxD)) + dropout(ffn(h_ffn_BxLxD))
    return nn.with_logical_constraint(y_BxLxD, axes.RESIDUAL_STREAM)

  @nn.compact
  def __call__(self, x_BxLxD, segment_ids=None, positions=None, encoded_BxSxD=None,
               encoder_segment_ids=None, relative_table=None):
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, causal=self.causal, sliding=self.sliding,
                                        init_gain=self.init_gain, name="self_attention")
    attend = lambda h: self_attention(
        h, q_segment_ids=segment_ids, kv_segment_ids=segment_ids, positions=positions,
        relative_table=relative_table)
    ffn = FeedForward(cfg, init_gain=self.init_gain, name="ffn")
    if cfg.parallel_block:
      return self.parallel(x_BxLxD, attend, ffn)
    x_BxLxD = self.sublayer("self_attention", x_BxLxD, attend)
    if self.cross_attention:
      cross = MultiHeadAttention(cfg, cross=True, init_gain=self.init_gain,
                                 name="cross_attention")
      # Cross-attention only needs padding masks: decoder rows vs encoder keys.
      dec_ids = None if segment_ids is None or encoder_segment_ids is None else segment_ids
      x_BxLxD = self.sublayer("cross_attention", x_BxLxD, lambda h: cross(
          h, encoded_BxSxD, q_segment_ids=dec_ids, kv_segment_ids=encoder_segment_ids))
    return self.sublayer("ffn", x_BxLxD, ffn)


class _ScannedLayer(nn.Module):
  """Adapts TransformerLayer to nn.scan's (carry, xs) -> (carry, ys) calling convention."""
  config: ModelConfig
  causal: bool
  cross_attention: bool
  residual_alpha: float = 1.0
  init_gain: float = 1.0

  @nn.compact
  def __call__(self, x_BxLxD, broadcast_args):
    layer = _maybe_remat(TransformerLayer, self.config)
    y = layer(self.config, self.causal, self.cross_attention, residual_alpha=self.residual_alpha,
              init_gain=self.init_gain, name="layer")(x_BxLxD, *broadcast_args)
    return y, None


def _maybe_remat(layer_cls, cfg: ModelConfig):
  if cfg.remat == "none":
    return layer_cls
  policy = None if cfg.remat == "full" else jax.checkpoint_policies.checkpoint_dots
  return nn.remat(layer_cls, policy=policy, prevent_cse=not cfg.scan_layers)


class LayerStack(nn.Module):
  """N layers, then the final norm when norms are pre-sublayer (pre, sandwich)."""
  config: ModelConfig
  num_layers: int
  causal: bool = False
  cross_attention: bool = False

  @nn.compact
  def __call__(self, x_BxLxD, segment_ids=None, positions=None, encoded_BxSxD=None,
               encoder_segment_ids=None):
    cfg = self.config
    # T5: one relative position table per stack, shared by its layers.
    table = None
    if cfg.position == "t5_bias":
      table = RelativePositionTable(cfg, name="relative_bias")()
    args = (segment_ids, positions, encoded_BxSxD, encoder_segment_ids, table)
    alpha, beta = deepnorm_constants(cfg, decoder_stack=self.cross_attention)
    if cfg.scan_layers:
      scanned = nn.scan(
          _ScannedLayer, variable_axes={"params": 0, "cache": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
          length=self.num_layers, metadata_params={nn.PARTITION_NAME: axes.LAYERS})
      x_BxLxD, _ = scanned(cfg, self.causal, self.cross_attention, alpha, beta,
                           name="layers")(x_BxLxD, args)
    else:
      layer_cls = _maybe_remat(TransformerLayer, cfg)
      for i in range(self.num_layers):
        x_BxLxD = layer_cls(cfg, self.causal, self.cross_attention,
                            sliding=cfg.is_sliding_layer(i), residual_alpha=alpha,
                            init_gain=beta, name=f"layers_{i}")(x_BxLxD, *args)
    if cfg.has_final_norm:
      x_BxLxD = Norm(cfg, name="final_norm")(x_BxLxD)
    return x_BxLxD
