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


import flax.linen as nn

from tfjax.nn import axes, kv_cache, ops
from tfjax.nn.config import ROPE_POSITIONS, ModelConfig
from tfjax.nn.inits import kernel_init
from tfjax.nn.masks import default_positions, query_key_positions
from tfjax.nn.norms import Norm
from tfjax.nn.relative_bias import t5_bias
from tfjax.nn.positions import (alibi_slopes, apply_rope, rope_frequencies,
                                 scaled_rope_frequencies)


# nn.Einsum, not nn.DenseGeneral: DenseGeneral initializes a flattened 2-D kernel and applies the
# 3-D logical sharding constraint to it when a mesh is active, which fails (flax issue #3676).
# Same parameters (kernel [embed, heads, head_dim], bias [heads, head_dim]), same values.
def _projection(cfg: ModelConfig, heads: int, heads_axis: str, name: str, d_model: int,
                init_gain: float = 1.0):
  """x [B, L, D] -> [B, L, heads, E]; `heads_axis` is the logical axis of the heads dimension."""
  return nn.Einsum(
      (d_model, heads, cfg.dim_per_head), "btd,dhk->bthk", use_bias=cfg.attention_bias,
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
  init_gain: float = 1.0  # multiplies the init std of W_V and W_O (DeepNet's beta)

  @property
  def window(self):
    """The sliding window of this module (None: every earlier key is visible)."""
    return self.config.window if self.causal and self.sliding else None

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD=None, *, q_segment_ids=None, kv_segment_ids=None,
               positions=None, relative_table=None):
    """positions [B, T]: absolute positions of the queries (needed by RoPE and decoding).
    relative_table [buckets, heads]: the stack's T5 bias table (position='t5_bias')."""
    cfg = self.config
    batch, q_len = x_BxTxD.shape[:2]
    q_BxTxHxE = _projection(cfg, cfg.num_heads, axes.HEADS, "query", x_BxTxD.shape[-1])(x_BxTxD)
    k_BxSxKxE = v_BxSxKxE = None
    if not (self.cross and cfg.decode and kv_BxSxD is None):
      source = x_BxTxD if not self.cross else kv_BxSxD
      k_BxSxKxE = _projection(cfg, cfg.kv_heads, axes.KV_HEADS, "key", source.shape[-1])(source)
      v_BxSxKxE = _projection(cfg, cfg.kv_heads, axes.KV_HEADS, "value", source.shape[-1],
                              self.init_gain)(source)

    if cfg.qk_norm != "none":  # per head over head_dim, before RoPE
      q_BxTxHxE = Norm(cfg, kind=cfg.qk_norm, axis=axes.HEAD_DIM, name="query_norm")(q_BxTxHxE)
      if k_BxSxKxE is not None:
        k_BxSxKxE = Norm(cfg, kind=cfg.qk_norm, axis=axes.HEAD_DIM, name="key_norm")(k_BxSxKxE)

    relative = not self.cross
    if positions is None:
      positions = default_positions(q_len, batch=batch)
    if relative and cfg.position in ROPE_POSITIONS:
      if self.window is not None and cfg.rope_local_base is not None:  # Gemma 3's local layers
        inv_freq, gain = rope_frequencies(cfg.rotary_dim, cfg.rope_local_base), 1.0
      else:
        inv_freq, gain = scaled_rope_frequencies(cfg, positions)
      rope = dict(interleaved=cfg.position == "rope_interleaved", inv_freq=inv_freq,
                  rotary_dim=cfg.rotary_dim, gain=gain)
      q_BxTxHxE = apply_rope(q_BxTxHxE, positions, **rope)
      k_BxSxKxE = apply_rope(k_BxSxKxE, positions, **rope)
    slopes = alibi_slopes(cfg.num_heads) if relative and cfg.position == "alibi" else None

    kwargs = dict(causal=self.causal, window=self.window, alibi_slopes=slopes,
                  q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  scale=cfg.attention_scale, softcap=cfg.attention_softcap)
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

    if relative and cfg.position == "t5_bias":
      q_pos, kv_pos = query_key_positions(q_len, k_BxSxKxE.shape[1], kwargs.get("q_positions"),
                                          kwargs.get("kv_positions"))
      kwargs["bias"] = t5_bias(relative_table, q_pos, kv_pos, bidirectional=not self.causal,
                               max_distance=cfg.relative_max_distance)

    if self.is_mutable_collection("intermediates"):
      weights = ops.attention_weights(q_BxTxHxE, k_BxSxKxE, **kwargs)
      self.sow("intermediates", "attention_weights", weights)
    dropout = 0.0 if cfg.deterministic else cfg.attention_dropout
    out_BxTxHxE = ops.dot_product_attention(
        q_BxTxHxE, k_BxSxKxE, v_BxSxKxE,
        implementation=cfg.attention_impl,
        dropout_rate=dropout, dropout_rng=self.make_rng("dropout") if dropout else None, **kwargs)
    out_BxTxHxE = nn.with_logical_constraint(
        out_BxTxHxE, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM))
    return nn.Einsum(
        (cfg.num_heads, cfg.dim_per_head, x_BxTxD.shape[-1]), "bthk,hkd->btd",
        use_bias=cfg.out_bias, dtype=cfg.compute_dtype, name="out",
        kernel_init=nn.with_logical_partitioning(
            kernel_init(cfg, cfg.residual_init_std, gain=self.init_gain, in_axis=(0, 1),
                        out_axis=2),
            (axes.HEADS, axes.HEAD_DIM, axes.EMBED)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axes.EMBED,)))(out_BxTxHxE)
