"""Multi-head attention (MHA / GQA / MQA), self and cross, with an optional KV cache for decoding.

W_Q: [embed, heads, head_dim], W_K and W_V: [embed, kv_heads, head_dim], W_O: [heads, head_dim,
embed]; shape letters as in tfjax/nn/axes.py (E = head_dim). W_K and W_V always carry the kv_heads
logical axis, also when kv_heads == heads (the sharding rules map kv_heads as they map heads).
Scores, masks and biases are all computed by `tfjax.nn.ops.dot_product_attention`, so the module
never changes when the attention implementation does.

Attention weights for visualization: apply with `mutable=['intermediates']` and each attention
module sows its [batch, heads, q_len, kv_len] probabilities as 'attention_weights'.

Decoding (config.decode=True): causal self-attention and cross-attention read and write their KV
cache through tfjax/nn/kv_cache.py; which attention implementation a decode step uses is the
decode config's `attention_impl` (tfjax/inference/cached_model.py sets it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import flax.linen as nn

from tfjax.nn import axes, kv_cache, ops
from tfjax.nn.choices import one_of
from tfjax.nn.inits import kernel_init
from tfjax.nn.masks import default_positions, query_key_positions
from tfjax.nn.norms import NORMS, Norm
from tfjax.nn.relative_bias import t5_bias
from tfjax.nn.positions import (alibi_slopes, apply_rope, position_kind, rope_frequencies,
                                 scaled_rope_frequencies)
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

QK_NORMS = ("none",) + NORMS


@dataclasses.dataclass(frozen=True)
class AttentionConfig(Section):
  """num_heads; num_kv_heads: None = num_heads (MHA), 1 = MQA, in between = GQA; head_dim: None =
  d_model // num_heads. bias: biases of W_Q, W_K, W_V, W_O; out_bias: W_O's, None = bias (Qwen2:
  False). qk_norm: none | rmsnorm | layernorm, normalizing q and k per head over head_dim before
  RoPE (OLMo 2-style per head, Qwen3, Gemma 3). window: sliding causal window (keys visible incl.
  self; decoders). window_pattern: with a window, layer i (0-based) is global iff (i + 1) %
  window_pattern == 0, else sliding (Gemma 2: 2, Gemma 3: 6); None = every layer slides
  (Mistral). scale: score scale, None = 1/sqrt(head_dim) (T5: 1.0, Gemma 2:
  query_pre_attn_scalar^-0.5). softcap: scores = cap * tanh(scores / cap) before biases and masks
  (Gemma 2: 50; xla attention only). dropout: on the attention weights (xla attention only).
  """
  num_heads: int = 4
  num_kv_heads: Optional[int] = None
  head_dim: Optional[int] = None
  bias: bool = flat_key("attention_bias", True)
  out_bias: Optional[bool] = flat_key("attention_out_bias", None)
  qk_norm: str = "none"
  window: Optional[int] = None
  window_pattern: Optional[int] = None
  scale: Optional[float] = flat_key("attention_scale", None)
  softcap: Optional[float] = flat_key("attention_softcap", None)
  dropout: float = flat_key("attention_dropout", 0.0)

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def uses_out_bias(self) -> bool:
    """Whether W_O has a bias (model.attention_out_bias, else model.attention_bias)."""
    return self.bias if self.out_bias is None else self.out_bias

  def is_sliding_layer(self, layer: int) -> bool:
    """Whether causal self-attention of layer `layer` (0-based) uses model.window."""
    if self.window is None:
      return False
    return self.window_pattern is None or (layer + 1) % self.window_pattern != 0

  def validate(self, model) -> None:
    one_of("model.qk_norm", self.qk_norm, QK_NORMS)
    if self.num_heads < 1:
      raise ValueError(f"model.num_heads={self.num_heads} must be a positive integer")
    for key, value, unset in (("num_kv_heads", self.num_kv_heads, "num_heads"),
                              ("head_dim", self.head_dim, "d_model // num_heads")):
      if value is not None and value < 1:
        raise ValueError(f"model.{key}={value} must be a positive integer, or None for {unset}")
    if self.head_dim is None and model.d_model % self.num_heads:
      raise ValueError(
          f"model.d_model={model.d_model} is not divisible by model.num_heads={self.num_heads}; "
          "change one of them or set model.head_dim explicitly")
    if self.num_heads % self.kv_heads:
      raise ValueError(
          f"model.num_heads={self.num_heads} is not a multiple of "
          f"model.num_kv_heads={self.kv_heads}; GQA needs heads to split evenly into kv groups")
    self._validate_window(model)
    for key, value in (("attention_scale", self.scale), ("attention_softcap", self.softcap)):
      if value is not None and not value > 0:
        raise ValueError(f"model.{key}={value} must be a positive number or None")
    if self.softcap is not None and model.attention_impl not in ("xla", "auto"):
      raise ValueError(
          f"model.attention_softcap={self.softcap} is computed by the xla attention "
          f"only, not model.attention_impl={model.attention_impl!r}; set attention_impl='xla' "
          "or 'auto'")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.attention_dropout={self.dropout} must be in [0, 1)")

  def _validate_window(self, model) -> None:
    if self.window is not None:
      if self.window < 1:
        raise ValueError(f"model.window={self.window} must be a positive number of keys or None")
      if model.family == "encoder":
        raise ValueError(
            f"model.window={self.window} is a causal sliding window and model.family='encoder' "
            "is bidirectional; set model.window=None")
    if self.window_pattern is not None:
      if self.window is None or self.window_pattern < 1:
        raise ValueError(
            f"model.window_pattern={self.window_pattern} makes every window_pattern-th layer "
            f"global and the others slide over model.window={self.window}; set a window and a "
            "pattern >= 1, or window_pattern=None")
      if model.scan_layers:
        raise ValueError(
            f"model.window_pattern={self.window_pattern} gives layers different attention (and "
            "cache sizes), which nn.scan's identical layers cannot express; set "
            "model.scan_layers=False")


# nn.Einsum, not nn.DenseGeneral: DenseGeneral initializes a flattened 2-D kernel and applies the
# 3-D logical sharding constraint to it when a mesh is active, which fails (flax issue #3676).
# Same parameters (kernel [embed, heads, head_dim], bias [heads, head_dim]), same values.
def _projection(cfg: ModelConfig, heads: int, heads_axis: str, name: str, d_model: int,
                init_gain: float = 1.0):
  """x [B, L, D] -> [B, L, heads, E]; `heads_axis` is the logical axis of the heads dimension."""
  return nn.Einsum(
      (d_model, heads, cfg.dim_per_head), "btd,dhk->bthk", use_bias=cfg.attention.bias,
      dtype=cfg.compute_dtype, name=name,
      kernel_init=nn.with_logical_partitioning(
          kernel_init(cfg, cfg.init_std, gain=init_gain, in_axis=0, out_axis=(1, 2)),
          (axes.EMBED, heads_axis, axes.HEAD_DIM)),
      bias_init=nn.with_logical_partitioning(
          nn.initializers.zeros, (heads_axis, axes.HEAD_DIM)))


class MultiHeadAttention(nn.Module):
  """Scores scaled by model.attention_scale (default 1/sqrt(head_dim)), soft-capped by
  model.attention_softcap; q and k normalized per head by model.qk_norm; causal self-attention
  slides over model.window when `sliding`."""
  config: ModelConfig
  causal: bool = False
  cross: bool = False  # keys/values from another sequence (no RoPE/ALiBi, no causal mask)
  sliding: bool = True  # False: a global layer of model.window_pattern

  @property
  def window(self):
    """The sliding window of this module (None: every earlier key is visible)."""
    return self.config.attention.window if self.causal and self.sliding else None

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD=None, *, q_segment_ids=None, kv_segment_ids=None,
               positions=None, relative_table=None):
    """positions [B, T]: absolute positions of the queries (needed by RoPE and decoding).
    relative_table [buckets, heads]: the stack's T5 bias table (position='t5_bias')."""
    cfg = self.config
    attention, position = cfg.attention, cfg.positions.kind
    init_gain = cfg.norms.init_gain  # the stack's DeepNorm beta on W_V and W_O (norms.py)
    batch, q_len = x_BxTxD.shape[:2]
    q_BxTxHxE = _projection(cfg, attention.num_heads, axes.HEADS, "query",
                            x_BxTxD.shape[-1])(x_BxTxD)
    k_BxSxKxE = v_BxSxKxE = None
    if not (self.cross and cfg.decode and kv_BxSxD is None):
      source = x_BxTxD if not self.cross else kv_BxSxD
      k_BxSxKxE = _projection(cfg, attention.kv_heads, axes.KV_HEADS, "key",
                              source.shape[-1])(source)
      v_BxSxKxE = _projection(cfg, attention.kv_heads, axes.KV_HEADS, "value", source.shape[-1],
                              init_gain)(source)

    if attention.qk_norm != "none":  # per head over head_dim, before RoPE
      q_BxTxHxE = Norm(cfg, kind=attention.qk_norm, axis=axes.HEAD_DIM,
                       name="query_norm")(q_BxTxHxE)
      if k_BxSxKxE is not None:
        k_BxSxKxE = Norm(cfg, kind=attention.qk_norm, axis=axes.HEAD_DIM,
                         name="key_norm")(k_BxSxKxE)

    relative = not self.cross
    if positions is None:
      positions = default_positions(q_len, batch=batch)
    if relative and position_kind(cfg).rotary:
      local_base = cfg.positions.rope.local_base
      if self.window is not None and local_base is not None:  # Gemma 3's local layers
        inv_freq, gain = rope_frequencies(cfg.rotary_dim, local_base), 1.0
      else:
        inv_freq, gain = scaled_rope_frequencies(cfg, positions)
      rope = dict(interleaved=position == "rope_interleaved", inv_freq=inv_freq,
                  rotary_dim=cfg.rotary_dim, gain=gain)
      q_BxTxHxE = apply_rope(q_BxTxHxE, positions, **rope)
      k_BxSxKxE = apply_rope(k_BxSxKxE, positions, **rope)
    slopes = alibi_slopes(attention.num_heads) if relative and position == "alibi" else None

    kwargs = dict(causal=self.causal, window=self.window, alibi_slopes=slopes,
                  q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  scale=attention.scale, softcap=attention.softcap)
    # Only causal self-attention and cross-attention see the sequence grow; a bidirectional
    # encoder (e.g. the encoder of an encoder-decoder run with decode=True) recomputes in full.
    uses_cache = cfg.decode and (self.causal or self.cross)
    if uses_cache and self.is_initializing():
      kv_cache.init(self, k_BxSxKxE, cross=self.cross, window=self.window,
                    dtype=cfg.compute_dtype)
    elif uses_cache and self.cross:
      k_BxSxKxE, v_BxSxKxE, kwargs = kv_cache.cross_attention(self, k_BxSxKxE, v_BxSxKxE, kwargs)
    elif uses_cache:
      k_BxSxKxE, v_BxSxKxE, kwargs = kv_cache.self_attention(
          self, k_BxSxKxE, v_BxSxKxE, positions, kwargs, window=self.window)

    if relative and position == "t5_bias":
      q_pos, kv_pos = query_key_positions(q_len, k_BxSxKxE.shape[1], kwargs.get("q_positions"),
                                          kwargs.get("kv_positions"))
      kwargs["bias"] = t5_bias(relative_table, q_pos, kv_pos, bidirectional=not self.causal,
                               max_distance=cfg.positions.relative_max_distance)

    if self.is_mutable_collection("intermediates"):
      weights = ops.attention_weights(q_BxTxHxE, k_BxSxKxE, **kwargs)
      self.sow("intermediates", "attention_weights", weights)
    dropout = 0.0 if cfg.deterministic else attention.dropout
    out_BxTxHxE = ops.dot_product_attention(
        q_BxTxHxE, k_BxSxKxE, v_BxSxKxE,
        implementation=cfg.attention_impl,
        dropout_rate=dropout, dropout_rng=self.make_rng("dropout") if dropout else None, **kwargs)
    out_BxTxHxE = nn.with_logical_constraint(
        out_BxTxHxE, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM))
    return nn.Einsum(
        (attention.num_heads, cfg.dim_per_head, x_BxTxD.shape[-1]), "bthk,hkd->btd",
        use_bias=attention.uses_out_bias, dtype=cfg.compute_dtype, name="out",
        kernel_init=nn.with_logical_partitioning(
            kernel_init(cfg, cfg.residual_init_std, gain=init_gain, in_axis=(0, 1),
                        out_axis=2),
            (axes.HEADS, axes.HEAD_DIM, axes.EMBED)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axes.EMBED,)))(out_BxTxHxE)
