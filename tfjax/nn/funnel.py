"""Funnel Transformer (Dai et al. 2020, "Funnel-Transformer: Filtering out Sequential Redundancy
for Efficient Language Processing"), as transformers' FunnelModel / FunnelBaseModel compute it.

  ids [B, L] -> x = LayerNorm(E[ids])                                      (no position table)
  encoder: blocks b = 0..K-1 of block_sizes[b] post-LN layers (each applied block_repeats[b]
    times, sharing weights); before block b > 0 the sequence is pooled by 2 (mean or max over
    pairs; separate_cls keeps [CLS] out of the pairs, truncate_seq drops the last token so the
    pairs tile). Only the first layer of a pooled block sees the pooled sequence as its query;
    with pool_q_only its keys/values are the unpooled sequence (the layer's attention is then
    [L/2 x L]), without it they are pooled too. Lengths: L, ~L/2, ~L/4, ...
  base model (FunnelBaseModel): the encoder's output [B, ~L/2^(K-1), D].
  decoder (FunnelModel): h = upsample(encoder output, 2^(K-1)) + the output of the first
    block (its first block_sizes[0] layer applications), then num_decoder_layers full-length
    layers -> [B, L, D] token-level outputs.
A layer is the relative attention of tfjax/nn/funnel_attention.py (out = LayerNorm(x_q +
attn)) and tfjax's FeedForward (W2 act(W1 x), act = gelu_tanh for the released checkpoints)
with a post-LN residual (tfjax/nn/norms.py Norm). Cost: a layer of block b attends over
~L/2^b tokens, so attention FLOPs fall 4x and the rest 2x per block (docs/modalities.md).
Optional heads for training: mlm_head (FunnelForMaskedLM's tied projection + bias, on the
token-level output) and num_classes (FunnelForSequenceClassification's tanh MLP on token 0).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn import funnel_attention as fa
from tfjax.nn.config import ModelConfig
from tfjax.nn.ffn import FeedForward
from tfjax.nn.norms import Norm


@dataclasses.dataclass(frozen=True)
class FunnelConfig:
  """vocab_size; block_sizes (layers per block), block_repeats (applications of each layer of a
  block; () = all 1); decoder: FunnelModel's up-sampling decoder of num_decoder_layers layers
  (False: FunnelBaseModel); d_model, n_head, d_head, d_inner; ffn: the activation (gelu_tanh =
  HF gelu_new); norm_eps; pooling: mean | max; attention_type: relative_shift | factorized;
  separate_cls, truncate_seq, pool_q_only (module docstring); init_range: the uniform init bound
  of the relative-attention biases; init_std: the dense layers' init std (None: HF's
  1/sqrt(fan_in + fan_out)); mlm_head: FunnelForMaskedLM's output layer; num_classes:
  FunnelForSequenceClassification's head on token 0 of `hidden` (0 / False: none). No dropout:
  the model computes transformers' eval-mode forward."""
  vocab_size: int = 64
  block_sizes: tuple = (2, 2, 2)
  block_repeats: tuple = ()
  decoder: bool = True
  num_decoder_layers: int = 2
  d_model: int = 32
  n_head: int = 4
  d_head: int = 8
  d_inner: int = 64
  ffn: str = "gelu_tanh"
  norm_eps: float = 1e-9
  pooling: str = "mean"
  attention_type: str = "relative_shift"
  separate_cls: bool = True
  truncate_seq: bool = True
  pool_q_only: bool = True
  mlm_head: bool = False
  num_classes: int = 0
  init_range: float = 0.1
  init_std: Optional[float] = None
  dtype: str = "float32"

  def __post_init__(self):
    # Lists from JSON / ConfigDicts become tuples (the config is hashable, a static argument).
    object.__setattr__(self, "block_sizes", tuple(self.block_sizes))
    repeats = tuple(self.block_repeats) or (1,) * len(self.block_sizes)
    object.__setattr__(self, "block_repeats", repeats)

  def validated(self) -> "FunnelConfig":
    if not self.block_sizes or min(self.block_sizes) < 1:
      raise ValueError(f"funnel block_sizes={list(self.block_sizes)} must be one or more "
                       "positive layer counts, e.g. [4, 4, 4]")
    if len(self.block_repeats) != len(self.block_sizes) or min(self.block_repeats) < 1:
      raise ValueError(f"funnel block_repeats={list(self.block_repeats)} must give a positive "
                       f"count for each of the {len(self.block_sizes)} blocks (or be empty)")
    for key in ("vocab_size", "d_model", "n_head", "d_head", "d_inner"):
      if getattr(self, key) < 1:
        raise ValueError(f"funnel {key}={getattr(self, key)} must be a positive integer")
    if self.d_model % 2:
      raise ValueError(f"funnel d_model={self.d_model} must be even (sin/cos position halves)")
    choices = {"pooling": ("mean", "max"), "attention_type": ("relative_shift", "factorized")}
    for key, allowed in choices.items():
      if getattr(self, key) not in allowed:
        raise ValueError(f"funnel {key}={getattr(self, key)!r}: choose one of {list(allowed)}")
    if self.num_decoder_layers < 0 or self.num_classes < 0:
      raise ValueError("funnel num_decoder_layers and num_classes must be >= 0")
    if self.mlm_head and not self.decoder:
      raise ValueError("funnel mlm_head=True predicts every token, which needs the decoder's "
                       "token-level output; set decoder=True")
    self.blocks()  # the FFN and norm checks (activation name)
    return self

  def blocks(self) -> ModelConfig:
    """The ModelConfig of the shared blocks a layer reuses: FeedForward and LayerNorm."""
    return ModelConfig.from_flat(dict(
        family="encoder", vocab_size=self.vocab_size, d_model=self.d_model, num_layers=1,
        num_heads=self.n_head, head_dim=self.d_head, d_ff=self.d_inner, ffn=self.ffn,
        ffn_bias=True, norm="layernorm", norm_eps=self.norm_eps, norm_placement="post",
        position="none", mlm_head=False, scaled_residual_init=False,
        init_std=self.init_std or (self.d_model + self.d_inner) ** -0.5,  # HF's FFN init
        dtype=self.dtype)).validated()

  def lengths(self, seq_len: int) -> list:
    """The sequence length each block runs at (what pooling leaves of `seq_len`); raises where
    an input is too short to pool before every block (transformers would then skip the pooling
    but keep the pooled position tables, which no longer fit the sequence)."""
    lengths = self._lengths(seq_len)
    if lengths is None:
      shortest = next(n for n in range(1, 2 ** len(self.block_sizes) + 2) if self._lengths(n))
      raise ValueError(
          f"a sequence of {seq_len} tokens is too short for {len(self.block_sizes)} funnel "
          f"blocks: it cannot be pooled before each block; give at least {shortest} tokens "
          "(pad them with attention_mask 0) or use fewer blocks")
    return lengths

  def _lengths(self, seq_len: int) -> Optional[list]:
    lengths = [seq_len]
    for _ in range(1, len(self.block_sizes)):
      length = lengths[-1]
      if length <= (2 if self.separate_cls else 1):
        return None
      # [CLS] + the rest in pairs (ceil), with truncate_seq the last token dropped first.
      grow = 2 if self.separate_cls and not self.truncate_seq else 1
      lengths.append((length + grow) // 2)
    return lengths


def pool_inputs(cfg: FunnelConfig, inputs: fa.AttentionInputs, before: bool):
  """The attention inputs pooled around the first layer of a pooled block: `before` the layer
  (queries; with pool_q_only=False the keys too), else after it (the keys under pool_q_only)."""
  sp = lambda x, axis: fa.stride_pool(x, axis, cfg.separate_cls, cfg.truncate_seq)
  position, types, mask, cls = inputs
  factorized = cfg.attention_type == "factorized"
  if cfg.pool_q_only and before:  # the query side: rows of token types / cls, phi and pi
    if factorized:
      position = tuple(sp(p, 0) for p in position[:2]) + position[2:]
    return fa.AttentionInputs(position, sp(types, 1), mask, None if cls is None else sp(cls, 0))
  if cfg.pool_q_only:  # after: the key side
    if factorized:
      position = position[:2] + tuple(sp(p, 0) for p in position[2:])
    return fa.AttentionInputs(position, sp(types, 2), pool_mask(cfg, mask),
                              None if cls is None else sp(cls, 1))
  if not before:
    return inputs
  if factorized:
    position = tuple(sp(p, 0) for p in position)
  return fa.AttentionInputs(position, sp(sp(types, 1), 2), pool_mask(cfg, mask),
                            None if cls is None else sp(sp(cls, 0), 1))


def pool_mask(cfg: FunnelConfig, mask_BxL):
  """A pooled key is padding if either of its pair is (min pooling)."""
  return fa.pool(mask_BxL, "min", cfg.separate_cls, cfg.truncate_seq)


class FunnelLayer(nn.Module):
  config: FunnelConfig
  block_index: int

  @nn.compact
  def __call__(self, xq_BxTxD, xkv_BxSxD, inputs: fa.AttentionInputs):
    blocks = self.config.blocks()
    h_BxTxD = fa.FunnelAttention(self.config, self.block_index, name="attention")(
        xq_BxTxD, xkv_BxSxD, inputs)
    return Norm(blocks, name="ffn_norm")(h_BxTxD + FeedForward(blocks, name="ffn")(h_BxTxD))


class Funnel(nn.Module):
  """ids [B, L] (+ attention_mask [B, L] 1 = token, token_type_ids [B, L]) -> {'hidden': the
  decoder's [B, L, D] (decoder=True) or the encoder's [B, L', D], 'encoder_hidden' [B, L', D],
  'mlm_logits' [B, L, V] (mlm_head), 'logits' [B, classes] (num_classes)}."""
  config: FunnelConfig

  @nn.compact
  def __call__(self, ids_BxL, attention_mask=None, token_type_ids=None):
    cfg = self.config
    blocks = cfg.blocks()
    if ids_BxL.ndim != 2:
      raise ValueError(f"funnel token ids of shape {tuple(ids_BxL.shape)}: give [batch, length]")
    for name, x in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
      if x is not None and tuple(x.shape) != tuple(ids_BxL.shape):
        raise ValueError(f"funnel {name} of shape {tuple(x.shape)} differs from the ids' "
                         f"{tuple(ids_BxL.shape)}; give one entry per token")
    seq_len = ids_BxL.shape[1]
    cfg.lengths(seq_len)  # the clear error for inputs too short to pool
    mask_BxL = jnp.ones(ids_BxL.shape) if attention_mask is None else attention_mask
    types_BxL = jnp.zeros_like(ids_BxL) if token_type_ids is None else token_type_ids
    tokens = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=blocks.compute_dtype,
                      embedding_init=nn.with_logical_partitioning(
                          nn.initializers.normal(cfg.init_std or 1.0), (axes.VOCAB, axes.EMBED)),
                      name="tokens")
    x_BxLxD = Norm(blocks, name="embed_norm")(tokens(ids_BxL))
    first_block, hidden = None, x_BxLxD
    inputs = fa.attention_inputs(cfg, seq_len, mask_BxL, types_BxL)
    applied = 0
    for b, size in enumerate(cfg.block_sizes):
      if b:  # lengths() has checked that the sequence can be pooled
        pooled = fa.pool(hidden, cfg.pooling, cfg.separate_cls, cfg.truncate_seq)
        inputs = pool_inputs(cfg, inputs, before=True)
      for i in range(size):
        layer = FunnelLayer(cfg, b, name=f"blocks_{b}_{i}")
        for r in range(cfg.block_repeats[b]):
          pooling = b > 0 and i == 0 and r == 0
          query = pooled if pooling else hidden
          hidden = layer(query, hidden if pooling and cfg.pool_q_only else query, inputs)
          if pooling:
            inputs = pool_inputs(cfg, inputs, before=False)
          applied += 1
          if applied == cfg.block_sizes[0]:  # transformers' hidden_states[block_sizes[0]]
            first_block = hidden
    out = {"encoder_hidden": hidden}
    if cfg.decoder:
      up_BxLxD = fa.upsample(hidden, 2 ** (len(cfg.block_sizes) - 1), seq_len, cfg.separate_cls,
                             cfg.truncate_seq)
      hidden = up_BxLxD + first_block
      inputs = fa.attention_inputs(cfg, seq_len, mask_BxL, types_BxL)
      for i in range(cfg.num_decoder_layers):
        hidden = FunnelLayer(cfg, 0, name=f"decoder_{i}")(hidden, hidden, inputs)
    out["hidden"] = hidden
    if cfg.mlm_head:
      bias_V = self.param("mlm_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, (axes.VOCAB,)), (cfg.vocab_size,))
      out["mlm_logits"] = tokens.attend(hidden).astype(jnp.float32) + bias_V
    if cfg.num_classes:
      dense = lambda n, name: nn.Dense(  # noqa: E731
          n, dtype=blocks.compute_dtype, name=name,
          kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init,
                                                   (axes.EMBED, None)),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))
      pooled_BxD = jnp.tanh(dense(cfg.d_model, "classifier_hidden")(hidden[:, 0]))
      out["logits"] = dense(cfg.num_classes, "classifier")(pooled_BxD).astype(jnp.float32)
    return out
