"""Multi-head attention (MHA / GQA / MQA), self and cross, with an optional cache for decoding.

W_Q: [embed, heads, head_dim], W_K and W_V: [embed, kv_heads, head_dim], W_O: [heads, head_dim,
embed]; shape letters as in tfjax/nn/axes.py (E = head_dim). W_K and W_V always carry the kv_heads
logical axis, also when kv_heads == heads (the sharding rules map kv_heads as they map heads).

`MultiHeadAttention` reads as four steps: projections (and qk norms), positions (the position
kind's hooks, tfjax/nn/positions.py), cache (decoding) and attention. The last two belong to the
attention kind (model.attention_kind, tfjax/nn/attention_kinds.py): softmax attention by default
(tfjax/nn/softmax_attention.py, whose scores, masks and biases are all computed by
`tfjax.nn.ops.dot_product_attention`), so the module never changes when the kind or the
attention implementation does.

Decoding (config.decode=True): causal self-attention and cross-attention read and write their
cache through the kind's `cache` hook (softmax: tfjax/nn/kv_cache.py); which attention
implementation a decode step uses is the decode config's `attention_impl`
(tfjax/inference/cached_model.py sets it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar, Optional

import flax.linen as nn

from tfjax.nn import axes
from tfjax.nn.attention_kinds import ATTENTION_KINDS, AttentionKind, attention_kind, kind_sections
from tfjax.nn.choices import one_of
from tfjax.nn.inits import kernel_init
from tfjax.nn.masks import LogitsBias, Visibility, default_positions
from tfjax.nn.norms import NORMS, Norm
from tfjax.nn.positions import POSITION_KINDS, position_kind
from tfjax.nn.sections import Section, flat_key, internal
# Importing softmax_attention registers the default kind, model.attention_kind='softmax'.
from tfjax.nn import softmax_attention  # pylint: disable=unused-import

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
  kind: a registered AttentionKind (tfjax/nn/attention_kinds.py; softmax); scale, softcap and
  dropout are softmax's. kind_sections: (kind name, its section) of every registered kind that
  declares config keys (AttentionKind.section), at their defaults unless given; `kind_config` is
  the chosen kind's.
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
  kind: str = flat_key("attention_kind", "softmax")
  kind_sections: tuple = internal(())

  # Keys read by the attention kinds that list them in AttentionKind.reads only.
  KIND_KEYS: ClassVar = ("attention_scale", "attention_softcap", "attention_dropout")

  def __post_init__(self):
    object.__setattr__(self, "kind_sections", self.all_kind_sections())

  def all_kind_sections(self) -> tuple:
    """(name, section) of every registered kind with a section: the given ones, defaults for
    the others (a kind registered after this config was built included), so flat() holds every
    config.model key; a tuple of frozen sections keeps the config hashable."""
    given = dict(self.kind_sections)
    return tuple((name, given.get(name) or section()) for name, section in kind_sections())

  @classmethod
  def flat_fields(cls):
    """The attention keys, then each registered kind's (read as cfg.attention.kind_config.X)."""
    out = super().flat_fields()
    for _, section in kind_sections():
      out += tuple(f._replace(path=("kind_config",) + f.path) for f in section.flat_fields())
    return out

  @classmethod
  def from_flat(cls, items) -> "AttentionConfig":
    base = super().from_flat(items)
    return dataclasses.replace(base, kind_sections=tuple(
        (name, section.from_flat(items)) for name, section in kind_sections()))

  def flat(self) -> dict:
    out = super().flat()
    for _, section in self.all_kind_sections():
      out.update(section.flat())
    return out

  @property
  def kind_config(self) -> Optional[Section]:
    """The chosen kind's own config section (AttentionKind.section), None if it declares none."""
    return dict(self.all_kind_sections()).get(self.kind)

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
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.attention_dropout={self.dropout} must be in [0, 1)")
    self._validate_kind(model)

  def _validate_kind(self, model) -> None:
    one_of("model.attention_kind", self.kind, tuple(ATTENTION_KINDS),
           registered="an attention kind")
    kind = ATTENTION_KINDS[self.kind]
    values, defaults = self.flat(), self.flat_defaults()
    for key in self.KIND_KEYS:
      if values[key] != defaults[key] and key not in kind.reads:
        raise ValueError(f"model.{key}={values[key]!r} is not read by "
                         f"model.attention_kind={self.kind!r}; leave it at {defaults[key]!r}")
    position = POSITION_KINDS.get(model.positions.kind)  # unknown: the positions' error
    if position is not None and position.logits_bias is not None and not kind.logits_bias:
      raise ValueError(
          f"model.position={position.name!r} adds to the attention logits, which "
          f"model.attention_kind={self.kind!r} does not take; choose another position kind")
    if model.decode and kind.cache is None:
      raise ValueError(f"model.attention_kind={self.kind!r} has no decoding cache, so "
                       "decode=True (generation) is not available for it")
    for name, section in self.all_kind_sections():
      if name != self.kind:
        given, defaults = section.flat(), section.flat_defaults()
        for key, value in given.items():
          if value != defaults[key]:
            raise ValueError(
                f"model.{key}={value!r} is read by model.attention_kind={name!r} only, not "
                f"{self.kind!r}; leave it at {defaults[key]!r} or set attention_kind={name!r}")
    if self.kind_config is not None:
      self.kind_config.validate(model)
    kind.check(model)

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
def head_projection(cfg: ModelConfig, heads: int, heads_axis: str, name: str, d_model: int,
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
  """Projections, positions, cache and attention (see the module docstring); causal
  self-attention slides over model.window when `sliding`."""
  config: ModelConfig
  causal: bool = False
  cross: bool = False  # keys/values from another sequence (no positions, no causal mask)
  sliding: bool = True  # False: a global layer of model.window_pattern

  @property
  def window(self):
    """The sliding window of this module (None: every earlier key is visible)."""
    return self.config.attention.window if self.causal and self.sliding else None

  @property
  def kind(self) -> AttentionKind:
    return attention_kind(self.config)

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD=None, *, q_segment_ids=None, kv_segment_ids=None,
               positions=None, relative_table=None):
    """positions [B, T]: absolute positions of the queries (default 0..T-1; needed by RoPE and
    decoding). relative_table: the layer stack's position table (the position kind's
    `stack_table` hook: T5's [buckets, heads])."""
    batch, q_len, d_model = x_BxTxD.shape
    positions_BxT = default_positions(q_len, batch=batch) if positions is None else positions
    visibility = Visibility(causal=self.causal, window=self.window,
                            q_segment_ids_BxT=q_segment_ids, kv_segment_ids_BxS=kv_segment_ids)
    q_BxTxHxE, k_BxSxKxE, v_BxSxKxE = self.projections(x_BxTxD, kv_BxSxD)
    q_BxTxHxE, k_BxSxKxE = self.rotate(q_BxTxHxE, k_BxSxKxE, positions_BxT)
    k_BxSxKxE, v_BxSxKxE, visibility = self.cache(k_BxSxKxE, v_BxSxKxE, positions_BxT,
                                                  visibility)
    logits_bias = self.logits_bias(relative_table, visibility, q_len, k_BxSxKxE.shape[1])
    inputs = {"x_BxTxD": x_BxTxD} if self.kind.inputs else {}  # AttentionKind.inputs
    if self.kind.lengths:  # AttentionKind.lengths: the actual n, not model.max_len
      inputs["seq_len_BxT"] = visibility.sequence_lengths(q_len, k_BxSxKxE.shape[1])
    out_BxTxHxE = self.kind.attend(self, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility,
                                   logits_bias, **inputs)
    return self.output_projection(out_BxTxHxE, d_model)

  def projections(self, x_BxTxD, kv_BxSxD):
    """q [B, T, H, E] from x; k, v [B, S, K, E] from x (self) or kv (cross; None when decoding
    reads the cached encoder keys); q and k normalized per head by model.qk_norm."""
    cfg = self.config
    attention = cfg.attention
    q_BxTxHxE = head_projection(cfg, attention.num_heads, axes.HEADS, "query",
                            x_BxTxD.shape[-1])(x_BxTxD)
    k_BxSxKxE = v_BxSxKxE = None
    if not (self.cross and cfg.decode and kv_BxSxD is None):
      source_BxSxD = x_BxTxD if not self.cross else kv_BxSxD
      k_BxSxKxE = head_projection(cfg, attention.kv_heads, axes.KV_HEADS, "key",
                              source_BxSxD.shape[-1])(source_BxSxD)
      v_BxSxKxE = head_projection(cfg, attention.kv_heads, axes.KV_HEADS, "value",
                              source_BxSxD.shape[-1],
                              init_gain=cfg.norms.init_gain)(source_BxSxD)  # DeepNorm beta
    if attention.qk_norm != "none":  # per head over head_dim, before RoPE
      q_BxTxHxE = Norm(cfg, kind=attention.qk_norm, axis=axes.HEAD_DIM,
                       name="query_norm")(q_BxTxHxE)
      if k_BxSxKxE is not None:
        k_BxSxKxE = Norm(cfg, kind=attention.qk_norm, axis=axes.HEAD_DIM,
                         name="key_norm")(k_BxSxKxE)
    return q_BxTxHxE, k_BxSxKxE, v_BxSxKxE

  def rotate(self, q_BxTxHxE, k_BxSxKxE, positions_BxT):
    """The position kind's `rotate` hook on self-attention (RoPE); cross-attention relates two
    sequences, so it has no positions."""
    rotate = position_kind(self.config).rotate
    if self.cross or rotate is None:
      return q_BxTxHxE, k_BxSxKxE
    return rotate(self.config, q_BxTxHxE, k_BxSxKxE, positions_BxT, local=self.window is not None)

  def cache(self, k_BxSxKxE, v_BxSxKxE, positions_BxT, visibility: Visibility):
    """The attention kind's `cache` hook while decoding. Only causal self-attention and
    cross-attention see the sequence grow; a bidirectional encoder (e.g. the encoder of an
    encoder-decoder run with decode=True) recomputes in full."""
    if not (self.config.decode and (self.causal or self.cross)):
      return k_BxSxKxE, v_BxSxKxE, visibility
    return self.kind.cache(self, k_BxSxKxE, v_BxSxKxE, positions_BxT, visibility,
                           cross=self.cross)

  def logits_bias(self, table, visibility: Visibility, q_len: int, kv_len: int) -> LogitsBias:
    """The position kind's `logits_bias` hook on self-attention (ALiBi, T5's bias)."""
    logits_bias = position_kind(self.config).logits_bias
    if self.cross or logits_bias is None:
      return LogitsBias()
    return logits_bias(self.config, table, visibility, q_len, kv_len)

  def output_projection(self, out_BxTxHxE, d_model: int):
    """W_O: [B, T, H, E] -> [B, T, D], its init scaled by the stack's DeepNorm beta."""
    cfg = self.config
    out_BxTxHxE = nn.with_logical_constraint(
        out_BxTxHxE, (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM))
    return nn.Einsum(
        (cfg.attention.num_heads, cfg.dim_per_head, d_model), "bthk,hkd->btd",
        use_bias=cfg.attention.uses_out_bias, dtype=cfg.compute_dtype, name="out",
        kernel_init=nn.with_logical_partitioning(
            kernel_init(cfg, cfg.residual_init_std, gain=cfg.norms.init_gain, in_axis=(0, 1),
                        out_axis=2),
            (axes.HEADS, axes.HEAD_DIM, axes.EMBED)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axes.EMBED,)))(out_BxTxHxE)
