"""Transformer layers and layer stacks.

One `TransformerLayer` covers the three layer kinds of the families:
  encoder layer       self-attention (bidirectional) -> FFN
  decoder-only block  causal self-attention -> FFN
  decoder layer       causal self-attention -> cross-attention -> FFN
Each sublayer f is one `TransformerLayer.sublayer(name, x, f)` call, x being the residual stream:
  pre: x + dropout(f(norm(x)))   post: norm(x + dropout(f(x)))
  sandwich: x + dropout(post_norm(f(pre_norm(x))))  (Gemma 2)
  deepnorm: norm(alpha * x + dropout(f(x)))  (DeepNet, Wang et al. 2022; alpha and the init gain
            beta of W_V, W_O and the FFN are the stack's, set by tfjax/nn/norms.py's
            `stack_config` on model.norms).
model.parallel_block replaces the sequence by one residual step (GPT-J, GPT-NeoX, Falcon, PaLM):
  x + dropout(attn(norm(x))) + dropout(ffn(norm'(x))), norm' = norm if parallel_shared_norm.
With model.window_pattern, layer i's causal self-attention is global iff (i + 1) % pattern == 0.
`LayerStack` runs N layers as a Python loop or under `nn.scan` (params stacked on a leading
'layers' axis; compile time flat in depth), optionally recomputing activations in the backward
pass (`model.remat`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import flax.linen as nn
import jax

from tfjax.nn import axes
from tfjax.nn.attention import MultiHeadAttention
from tfjax.nn.ffn import FeedForward
from tfjax.nn.norms import Norm, stack_config
from tfjax.nn.positions import position_kind

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


class TransformerLayer(nn.Module):
  config: ModelConfig
  causal: bool = False
  cross_attention: bool = False
  sliding: bool = True  # self-attention uses model.window (False: a global layer)

  def sublayer(self, name: str, x_BxLxD, fn: Callable):
    """One residual sublayer around `fn`, with its norm named `{name}_norm`."""
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)
    norm = Norm(cfg, name=f"{name}_norm")
    placement = cfg.norms.placement
    if placement == "pre":
      y_BxLxD = x_BxLxD + dropout(fn(norm(x_BxLxD)))
    elif placement == "sandwich":
      y_BxLxD = x_BxLxD + dropout(Norm(cfg, name=f"{name}_post_norm")(fn(norm(x_BxLxD))))
    elif placement == "deepnorm":
      y_BxLxD = norm(x_BxLxD * cfg.norms.residual_alpha + dropout(fn(x_BxLxD)))
    else:
      y_BxLxD = norm(x_BxLxD + dropout(fn(x_BxLxD)))
    return nn.with_logical_constraint(y_BxLxD, axes.RESIDUAL_STREAM)

  def parallel(self, x_BxLxD, attention: Callable, ffn: Callable):
    """x + dropout(attn(norm(x))) + dropout(ffn(norm'(x))): both branches read the block input."""
    cfg = self.config
    dropout = nn.Dropout(cfg.dropout, deterministic=cfg.deterministic)
    h_BxLxD = Norm(cfg, name="self_attention_norm")(x_BxLxD)
    h_ffn_BxLxD = h_BxLxD if cfg.norms.parallel_shared_norm else Norm(cfg, name="ffn_norm")(x_BxLxD)
    y_BxLxD = x_BxLxD + dropout(attention(h_BxLxD)) + dropout(ffn(h_ffn_BxLxD))
    return nn.with_logical_constraint(y_BxLxD, axes.RESIDUAL_STREAM)

  @nn.compact
  def __call__(self, x_BxLxD, segment_ids=None, positions=None, encoded_BxSxD=None,
               encoder_segment_ids=None, relative_table=None):
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, causal=self.causal, sliding=self.sliding,
                                        name="self_attention")
    attend = lambda h: self_attention(
        h, q_segment_ids=segment_ids, kv_segment_ids=segment_ids, positions=positions,
        relative_table=relative_table)
    ffn = FeedForward(cfg, name="ffn")
    if cfg.parallel_block:
      return self.parallel(x_BxLxD, attend, ffn)
    x_BxLxD = self.sublayer("self_attention", x_BxLxD, attend)
    if self.cross_attention:
      cross = MultiHeadAttention(cfg, cross=True, name="cross_attention")
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

  @nn.compact
  def __call__(self, x_BxLxD, broadcast_args):
    layer = _maybe_remat(TransformerLayer, self.config)
    y = layer(self.config, self.causal, self.cross_attention, name="layer")(x_BxLxD,
                                                                            *broadcast_args)
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
    cfg = stack_config(self.config, decoder_stack=self.cross_attention)
    # One position table per stack, shared by its layers (T5's relative bias).
    stack_table = position_kind(cfg).stack_table
    table = None if stack_table is None else stack_table(cfg)()
    args = (segment_ids, positions, encoded_BxSxD, encoder_segment_ids, table)
    if cfg.scan_layers:
      scanned = nn.scan(
          _ScannedLayer, variable_axes={"params": 0, "cache": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
          length=self.num_layers, metadata_params={nn.PARTITION_NAME: axes.LAYERS})
      x_BxLxD, _ = scanned(cfg, self.causal, self.cross_attention, name="layers")(x_BxLxD, args)
    else:
      layer_cls = _maybe_remat(TransformerLayer, cfg)
      for i in range(self.num_layers):
        x_BxLxD = layer_cls(cfg, self.causal, self.cross_attention,
                            sliding=cfg.attention.is_sliding_layer(i),
                            name=f"layers_{i}")(x_BxLxD, *args)
    if cfg.norms.has_final_norm:
      x_BxLxD = Norm(cfg, name="final_norm")(x_BxLxD)
    return x_BxLxD
