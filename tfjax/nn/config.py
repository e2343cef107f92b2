"""The one frozen model config every module receives, built (and validated) from `config.model`.

`ModelConfig.from_config(config.model)` is the only way a ConfigDict becomes a model: an unknown key
or an invalid value fails there, naming the key, the bad value and the valid choices. Train, eval
and decode are `.replace(deterministic=..., decode=...)` variants of the same config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

from tfjax.nn.choices import one_of

FAMILIES = ("encoder", "decoder", "encoder_decoder")
POSITIONS = ("sinusoidal", "learned", "rope", "rope_interleaved", "alibi", "t5_bias", "none")
ROPE_POSITIONS = ("rope", "rope_interleaved")
# RoPE frequency scaling for long contexts; see tfjax/nn/positions.py.
ROPE_SCALINGS = ("none", "linear", "dynamic", "yarn", "llama3")
NORMS = ("layernorm", "rmsnorm")
QK_NORMS = ("none",) + NORMS
PLACEMENTS = ("pre", "post", "sandwich", "deepnorm")
# Two-matrix FFNs: W2 act(W1 x). Gated (three matrices, Shazeer 2020): W2 (act(W_gate x) * W1 x);
# glu's act is the sigmoid (Dauphin et al. 2017), bilinear's the identity (no nonlinearity).
FFNS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh", "reglu", "glu",
        "bilinear")
GATED_FFNS = ("swiglu", "geglu", "geglu_tanh", "reglu", "glu", "bilinear")
# Init of the dense matrices (tfjax/nn/inits.py).
INITS = ("normal", "xavier_uniform")
REMATS = ("none", "full", "dots")
# tfjax.nn.ops.dot_product_attention's `implementation` values (xla is ops' reference, auto picks one
# per backend and length, the others are tfjax/nn/kernels/).
ATTENTION_IMPLS = ("xla", "chunked", "pallas", "cudnn", "auto")
SINUSOID_LAYOUTS = ("interleaved", "halves")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Every architectural switch of tfjax. Field comments give the choices."""
  family: str = "decoder"            # encoder | decoder | encoder_decoder
  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2                # encoder layers, or decoder layers for `decoder`
  num_decoder_layers: Optional[int] = None  # encoder_decoder only; None = num_layers
  num_heads: int = 4
  num_kv_heads: Optional[int] = None  # None = num_heads (MHA); 1 = MQA; in between = GQA
  head_dim: Optional[int] = None     # None = d_model // num_heads
  d_ff: int = 512
  ffn: str = "gelu"                  # relu | gelu (exact erf) | gelu_tanh (GPT-2 gelu_new) | silu
                                     # | gated (three matrices): swiglu | geglu | geglu_tanh | reglu
                                     # | glu (sigmoid gate) | bilinear (no activation)
  ffn_bias: bool = True
  attention_bias: bool = True        # biases of W_Q, W_K, W_V, W_O
  attention_out_bias: Optional[bool] = None  # bias of W_O; None = attention_bias (Qwen2: False)
  norm: str = "layernorm"            # layernorm | rmsnorm
  norm_eps: float = 1e-5
  norm_bias: bool = True             # LayerNorm's beta (RMSNorm never has one)
  norm_unit_offset: bool = False     # every norm's gain is (1 + w), w initialized to 0 (Gemma)
  qk_norm: str = "none"              # none | rmsnorm | layernorm: normalize q and k per head over
                                     # head_dim, before RoPE (OLMo 2-style per head, Qwen3, Gemma 3)
  norm_placement: str = "pre"        # pre: x + f(norm(x)), final norm | post: norm(x + f(x))
                                     # | sandwich: x + norm(f(norm(x))), final norm (Gemma 2)
                                     # | deepnorm: norm(alpha x + f(x)), init gain beta on W_V, W_O,
                                     # FFN (Wang et al. 2022; tfjax/nn/layers.py)
  parallel_block: bool = False       # x + attn(norm(x)) + ffn(norm(x)) (GPT-J, NeoX, Falcon, PaLM);
                                     # pre placement, no cross-attention
  parallel_shared_norm: bool = True  # parallel_block: one norm feeds both (GPT-J, Falcon-7B);
                                     # False: attention and FFN norms (NeoX, Falcon-40B)
  embed_norm: bool = False           # BERT normalizes the embedding sum
  position: str = "learned"          # sinusoidal | learned | rope | rope_interleaved | alibi |
                                     # t5_bias (bucketed relative bias, tfjax/nn/relative_bias.py)
                                     # | none
  relative_buckets: int = 32         # t5_bias: buckets of the relative offsets
  relative_max_distance: int = 128   # t5_bias: offsets from here on share the last bucket
  max_len: int = 512                 # size of the learned position table
  position_offset: int = 0           # learned positions read row pos + offset of a table of
                                     # max_len + offset rows (BART, mBART: 2)
  sinusoid_layout: str = "interleaved"  # interleaved: [sin, cos] per pair (Vaswani et al.) |
                                     # halves: [sin ... | cos ...] (Marian, Pegasus)
  rope_base: float = 10000.0
  rope_local_base: Optional[float] = None  # RoPE base of the sliding-window layers, which also
                                     # skip rope_scaling (Gemma 3: 10000 local, 1e6 global);
                                     # None = rope_base and the scaling on every layer
  # RoPE frequency scaling (tfjax/nn/positions.py): none | linear (position interpolation, Chen et
  # al. 2023) | dynamic (NTK-aware base growing with the sequence) | yarn (Peng et al. 2023) |
  # llama3 (Llama 3.1's banded rescale), by rope_scaling_factor (>= 1).
  rope_scaling: str = "none"
  rope_scaling_factor: float = 1.0
  rope_original_max_len: Optional[int] = None  # training context of the unscaled model
                                               # (dynamic, yarn, llama3)
  rope_low_freq_factor: float = 1.0  # llama3: wavelengths above original_max_len / low are scaled
  rope_high_freq_factor: float = 4.0  # llama3: wavelengths below original_max_len / high are kept
  rope_beta_fast: float = 32.0       # yarn: rotations where the ramp to extrapolation ends
  rope_beta_slow: float = 1.0        # yarn: rotations where the ramp starts
  rope_attention_factor: Optional[float] = None  # yarn: cos/sin gain; None = 0.1 ln(factor) + 1
  rotary_fraction: float = 1.0       # rotate the first int(head_dim * fraction) dims of each head
                                     # (partial rotary: GPT-NeoX, Phi); the rest pass unchanged
  window: Optional[int] = None       # sliding causal window (keys visible incl. self); decoders
  window_pattern: Optional[int] = None  # with window: layer i (0-based) is global iff
                                     # (i + 1) % window_pattern == 0, else sliding (Gemma 2: 2,
                                     # Gemma 3: 6); None = every layer slides (Mistral)
  attention_scale: Optional[float] = None  # score scale; None = 1/sqrt(head_dim) (T5: 1.0,
                                     # Gemma 2: query_pre_attn_scalar^-0.5)
  attention_softcap: Optional[float] = None  # scores = cap * tanh(scores / cap) before biases and
                                     # masks (Gemma 2: 50); needs attention_impl xla or auto
  logits_softcap: Optional[float] = None  # output logits = cap * tanh(logits / cap) (Gemma 2: 30)
  embed_scale: bool = False          # multiply embeddings by sqrt(d_model) (Vaswani et al.)
  tie_embeddings: bool = True        # output projection = input embedding^T (decoder's table)
  share_embeddings: bool = True      # encoder_decoder: one token table for encoder and decoder;
                                     # False: separate token tables, position tables, embed norms
  share_positions: Optional[bool] = None  # encoder_decoder: one position table and embedding norm
                                     # for both; None = share_embeddings; False with
                                     # share_embeddings=True: shared tokens only (BART, mBART)
  final_logits_bias: bool = False    # a [vocab] bias added to the LM logits (BART, Marian,
                                     # Pegasus; HF keeps it as a buffer, here a zero-init param)
  scale_tied_logits: bool = False    # tied head reads h * d_model^-0.5 (T5 v1.0)
  type_vocab_size: int = 0           # encoder token-type (segment A/B) embeddings; 0 = none
  mlm_head: bool = True              # encoder: dense+act+norm, then (tied) decoder with bias
  pooler: bool = False               # encoder: tanh(dense(h_[CLS]))
  num_classes: int = 0               # encoder: sequence classifier on the pooled output
  dropout: float = 0.0               # embeddings and every residual branch
  attention_dropout: float = 0.0     # on attention weights (xla implementation only)
  init: str = "normal"               # dense matrices: normal (N(0, init_std^2)) | xavier_uniform
                                     # (Glorot; the original Transformer); tfjax/nn/inits.py
  init_std: float = 0.02             # normal init's std; also every embedding table's (below)
  position_init_std: Optional[float] = None  # learned position table's init std; None = init_std.
                                     # With embed_scale, 2^-0.5 matches the sinusoid table's RMS
                                     # (other positions ignore it, so ablation arms can share it)
  scaled_residual_init: bool = False  # GPT-2: W_O, FFN W_2 init std init_std / sqrt(2 * layers)
  scan_layers: bool = False          # nn.scan over layers: compile time flat in depth
  remat: str = "none"                # none | full | dots (save matmul outputs only)
  attention_impl: str = "xla"        # xla | chunked | pallas | cudnn | auto
  dtype: str = "float32"             # compute dtype; params stay float32
  deterministic: bool = True         # False enables dropout (needs a 'dropout' rng)
  decode: bool = False               # KV-cache decoding (see tfjax/inference/decode.py)

  # ---- derived ----
  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def dim_per_head(self) -> int:
    return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

  @property
  def decoder_layers(self) -> int:
    return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

  @property
  def residual_init_std(self) -> float:
    """Init std of the projections that write into the residual stream (W_O, FFN W_2)."""
    if not self.scaled_residual_init:
      return self.init_std
    layers = self.num_layers + (self.decoder_layers if self.family == "encoder_decoder" else 0)
    return self.init_std / (2.0 * layers) ** 0.5

  @property
  def shares_positions(self) -> bool:
    """Whether encoder and decoder share position tables and embedding norms."""
    return self.share_embeddings if self.share_positions is None else self.share_positions

  @property
  def position_table_rows(self) -> int:
    """Rows of a learned position table (model.max_len + model.position_offset)."""
    return self.max_len + self.position_offset

  @property
  def has_final_norm(self) -> bool:
    """Whether each layer stack ends with a norm (pre-norm placements leave the stream unnormed)."""
    return self.norm_placement in ("pre", "sandwich")

  def is_sliding_layer(self, layer: int) -> bool:
    """Whether causal self-attention of layer `layer` (0-based) uses model.window."""
    if self.window is None:
      return False
    return self.window_pattern is None or (layer + 1) % self.window_pattern != 0

  @property
  def rotary_dim(self) -> int:
    """Channels of each head that RoPE rotates (the first ones)."""
    return int(self.dim_per_head * self.rotary_fraction)

  @property
  def out_bias(self) -> bool:
    """Whether W_O has a bias (model.attention_out_bias, else model.attention_bias)."""
    return self.attention_bias if self.attention_out_bias is None else self.attention_out_bias

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs).validated()

  @classmethod
  def from_config(cls, model_config: Any) -> "ModelConfig":
    """Builds from an ml_collections ConfigDict (or a dict), rejecting unknown keys."""
    items = dict(model_config.items()) if hasattr(model_config, "items") else dict(model_config)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(
          f"unknown model config key(s) {unknown}; valid keys are: {sorted(known)}")
    return cls(**items).validated()

  def validated(self) -> "ModelConfig":
    def choice(key, valid):
      one_of(f"model.{key}", getattr(self, key), valid)

    choice("family", FAMILIES)
    choice("position", POSITIONS)
    choice("norm", NORMS)
    choice("norm_placement", PLACEMENTS)
    choice("qk_norm", QK_NORMS)
    choice("ffn", FFNS)
    choice("init", INITS)
    choice("remat", REMATS)
    choice("attention_impl", ATTENTION_IMPLS)
    choice("dtype", tuple(DTYPES))
    for key in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
      if getattr(self, key) < 1:
        raise ValueError(f"model.{key}={getattr(self, key)} must be a positive integer")
    for key, unset in (("num_kv_heads", "num_heads"), ("head_dim", "d_model // num_heads"),
                       ("num_decoder_layers", "num_layers")):
      if getattr(self, key) is not None and getattr(self, key) < 1:
        raise ValueError(f"model.{key}={getattr(self, key)} must be a positive integer, or None "
                         f"for {unset}")
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
          f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}; "
          "change one of them or set model.head_dim explicitly")
    if self.num_heads % self.kv_heads:
      raise ValueError(
          f"model.num_heads={self.num_heads} is not a multiple of "
          f"model.num_kv_heads={self.kv_heads}; GQA needs heads to split evenly into kv groups")
    if self.position.startswith("rope") and self.dim_per_head % 2:
      raise ValueError(
          f"model.position={self.position!r} needs an even head dimension, got {self.dim_per_head}")
    self._validate_rope()
    if self.position == "sinusoidal" and self.d_model % 2:
      raise ValueError(f"model.position='sinusoidal' needs an even d_model, got {self.d_model}")
    if self.window is not None:
      if self.window < 1:
        raise ValueError(f"model.window={self.window} must be a positive number of keys or None")
      if self.family == "encoder":
        raise ValueError(
            f"model.window={self.window} is a causal sliding window and model.family='encoder' is "
            "bidirectional; set model.window=None")
    if self.window_pattern is not None:
      if self.window is None or self.window_pattern < 1:
        raise ValueError(
            f"model.window_pattern={self.window_pattern} makes every window_pattern-th layer "
            f"global and the others slide over model.window={self.window}; set a window and a "
            "pattern >= 1, or window_pattern=None")
      if self.scan_layers:
        raise ValueError(
            f"model.window_pattern={self.window_pattern} gives layers different attention (and "
            "cache sizes), which nn.scan's identical layers cannot express; set "
            "model.scan_layers=False")
    self._validate_t5_bias()
    self._validate_embeddings()
    self._validate_residual()
    if self.scale_tied_logits and not self.tie_embeddings:
      raise ValueError("model.scale_tied_logits=True rescales the tied output layer's input but "
                       "model.tie_embeddings=False; set tie_embeddings=True or leave it False")
    for key in ("attention_scale", "attention_softcap", "logits_softcap"):
      value = getattr(self, key)
      if value is not None and not value > 0:
        raise ValueError(f"model.{key}={value} must be a positive number or None")
    if self.attention_softcap is not None and self.attention_impl not in ("xla", "auto"):
      raise ValueError(
          f"model.attention_softcap={self.attention_softcap} is computed by the xla attention "
          f"only, not model.attention_impl={self.attention_impl!r}; set attention_impl='xla' "
          "or 'auto'")
    for key in ("dropout", "attention_dropout"):
      if not 0.0 <= getattr(self, key) < 1.0:
        raise ValueError(f"model.{key}={getattr(self, key)} must be in [0, 1)")
    if self.family != "encoder" and (self.pooler or self.num_classes or self.type_vocab_size):
      raise ValueError(
          f"model.pooler/num_classes/type_vocab_size are encoder options; "
          f"model.family={self.family!r} does not use them")
    if self.num_classes and not self.pooler:
      raise ValueError("model.num_classes > 0 classifies the pooled output: set model.pooler=True")
    if self.num_decoder_layers is not None and self.family != "encoder_decoder":
      raise ValueError("model.num_decoder_layers is only used by family='encoder_decoder'")
    return self

  def _validate_residual(self):
    if self.parallel_block:
      if self.norm_placement != "pre":
        raise ValueError(f"model.parallel_block=True is a pre-norm block (x + attn(norm(x)) + "
                         f"ffn(norm(x))), not norm_placement={self.norm_placement!r}; set "
                         "model.norm_placement='pre'")
      if self.family == "encoder_decoder":
        raise ValueError("model.parallel_block=True has no cross-attention branch; use it with "
                         "family='decoder' or 'encoder'")
    elif not self.parallel_shared_norm:
      raise ValueError("model.parallel_shared_norm=False chooses the norms of a parallel block; "
                       "set model.parallel_block=True or leave it True")
    if self.init == "xavier_uniform" and self.scaled_residual_init:
      raise ValueError("model.scaled_residual_init=True shrinks the normal init's std "
                       "(init_std / sqrt(2 layers)); model.init='xavier_uniform' has no std: set "
                       "scaled_residual_init=False or init='normal'")
    if self.position_init_std is not None and not self.position_init_std > 0:
      raise ValueError(f"model.position_init_std={self.position_init_std} must be a positive std "
                       "or None (= model.init_std)")
    if self.norm_placement == "deepnorm" and self.scaled_residual_init:
      raise ValueError("model.norm_placement='deepnorm' sets its own residual init gain (beta); "
                       "set model.scaled_residual_init=False")

  def _validate_embeddings(self):
    one_of("model.sinusoid_layout", self.sinusoid_layout, SINUSOID_LAYOUTS)
    if self.sinusoid_layout != "interleaved" and self.position != "sinusoidal":
      raise ValueError(f"model.sinusoid_layout={self.sinusoid_layout!r} arranges the sinusoidal "
                       f"table but model.position={self.position!r}; leave it 'interleaved'")
    if self.position_offset < 0 or (self.position_offset and self.position != "learned"):
      raise ValueError(
          f"model.position_offset={self.position_offset} shifts the rows of the learned position "
          f"table (model.position={self.position!r}); use position='learned' and an offset >= 0, "
          "or position_offset=0")
    if self.family != "encoder_decoder" and not (
        self.share_embeddings and self.share_positions is None):
      raise ValueError(
          f"model.share_embeddings / share_positions choose between encoder and decoder tables; "
          f"model.family={self.family!r} has one stack: leave them at True / None")
    if not self.share_embeddings and self.share_positions:
      raise ValueError("model.share_positions=True with share_embeddings=False (separate token "
                       "tables, one position table) is no published model; set share_positions="
                       "None (separate too) or share_embeddings=True")
    if self.final_logits_bias and self.family == "encoder":
      raise ValueError("model.final_logits_bias is a bias on LM logits; the encoder MLM head "
                       "already has its own (mlm_bias): set final_logits_bias=False")

  def _validate_t5_bias(self):
    if self.position != "t5_bias":
      for key in ("relative_buckets", "relative_max_distance"):
        default = next(f.default for f in dataclasses.fields(self) if f.name == key)
        if getattr(self, key) != default:
          raise ValueError(f"model.{key}={getattr(self, key)} is read by position='t5_bias' "
                           f"only, but model.position={self.position!r}; leave it at {default}")
      return
    if self.relative_buckets < 4:
      raise ValueError(f"model.relative_buckets={self.relative_buckets} must be >= 4 (half for "
                       "each direction, half of those exact offsets)")
    if self.relative_max_distance <= self.relative_buckets // 2:
      raise ValueError(
          f"model.relative_max_distance={self.relative_max_distance} must exceed "
          f"relative_buckets // 2 = {self.relative_buckets // 2} (the exact offsets)")
    if self.attention_impl not in ("xla", "auto"):
      raise ValueError(
          f"model.position='t5_bias' adds a dense [T, S] bias that only the xla attention "
          f"takes, not model.attention_impl={self.attention_impl!r}; set attention_impl='xla' "
          "or 'auto'")

  def _validate_rope(self):
    one_of("model.rope_scaling", self.rope_scaling, ROPE_SCALINGS)
    rope = self.position in ROPE_POSITIONS
    if self.rope_scaling != "none" and not rope:
      raise ValueError(
          f"model.rope_scaling={self.rope_scaling!r} scales RoPE frequencies but "
          f"model.position={self.position!r}; set model.position='rope' (or 'rope_interleaved') "
          "or model.rope_scaling='none'")
    defaults = {f.name: f.default for f in dataclasses.fields(self)}
    for key, users in _ROPE_SCALING_KEYS.items():
      if getattr(self, key) != defaults[key] and self.rope_scaling not in users:
        raise ValueError(
            f"model.{key}={getattr(self, key)!r} is only read by model.rope_scaling in {users}, "
            f"but model.rope_scaling={self.rope_scaling!r}; set it to {defaults[key]!r} or "
            "choose a scaling that uses it")
    if self.rope_scaling != "none" and not self.rope_scaling_factor >= 1.0:
      raise ValueError(f"model.rope_scaling_factor={self.rope_scaling_factor} must be >= 1 "
                       "(the context extension ratio)")
    if self.rope_scaling in ("dynamic", "yarn", "llama3") and not (
        self.rope_original_max_len and self.rope_original_max_len > 0):
      raise ValueError(
          f"model.rope_scaling={self.rope_scaling!r} needs model.rope_original_max_len, the "
          f"context length the unscaled model was trained at (got {self.rope_original_max_len})")
    if self.rope_scaling == "llama3" and not (
        0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      raise ValueError(
          f"model.rope_low_freq_factor={self.rope_low_freq_factor} must be positive and below "
          f"model.rope_high_freq_factor={self.rope_high_freq_factor}")
    if self.rope_scaling == "yarn":
      if not 0 < self.rope_beta_slow < self.rope_beta_fast:
        raise ValueError(f"model.rope_beta_slow={self.rope_beta_slow} must be positive and below "
                         f"model.rope_beta_fast={self.rope_beta_fast}")
      if self.rope_attention_factor is not None and not self.rope_attention_factor > 0:
        raise ValueError(f"model.rope_attention_factor={self.rope_attention_factor} must be > 0 "
                         "or None (0.1 ln(factor) + 1)")
    if self.rope_local_base is not None and not (
        rope and self.window is not None and self.rope_local_base > 0):
      raise ValueError(
          f"model.rope_local_base={self.rope_local_base} is the RoPE base of sliding-window "
          f"layers; it needs model.position='rope' (got {self.position!r}), a model.window (got "
          f"{self.window}) and a positive base, or rope_local_base=None")
    if self.rotary_fraction != 1.0:
      if not rope:
        raise ValueError(
            f"model.rotary_fraction={self.rotary_fraction} is partial RoPE but "
            f"model.position={self.position!r}; set model.position='rope' or rotary_fraction=1")
      if not 0.0 < self.rotary_fraction <= 1.0 or self.rotary_dim < 2 or self.rotary_dim % 2:
        raise ValueError(
            f"model.rotary_fraction={self.rotary_fraction} must be in (0, 1] and rotate an even, "
            f"nonzero number of channels; int({self.dim_per_head} * {self.rotary_fraction}) = "
            f"{self.rotary_dim}")


# The rope_* keys each scaling reads (any other kind must leave them at their defaults).
_ROPE_SCALING_KEYS = {
    "rope_scaling_factor": ("linear", "dynamic", "yarn", "llama3"),
    "rope_original_max_len": ("dynamic", "yarn", "llama3"),
    "rope_low_freq_factor": ("llama3",), "rope_high_freq_factor": ("llama3",),
    "rope_beta_fast": ("yarn",), "rope_beta_slow": ("yarn",), "rope_attention_factor": ("yarn",),
}

# Optional fields (default None) and their type, for typed command-line placeholders.
_OPTIONAL_FIELDS = {"num_decoder_layers": int, "num_kv_heads": int, "head_dim": int, "window": int,
                    "attention_out_bias": bool, "rope_original_max_len": int,
                    "rope_attention_factor": float, "window_pattern": int,
                    "attention_scale": float, "attention_softcap": float,
                    "logits_softcap": float, "share_positions": bool,
                    "position_init_std": float, "rope_local_base": float}


def default_model_config(**overrides):
  """`config.model` as an ml_collections ConfigDict holding every ModelConfig field.

  Optional fields are typed placeholders so `--config.model.window=256` works from the command
  line; values not given here keep the ModelConfig defaults.
  """
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  values = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  values.update(overrides)
  unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)})
  if unknown:
    raise ValueError(f"unknown model config key(s) {unknown}")
  cfg = config_dict.ConfigDict()
  for key, value in values.items():
    if key in _OPTIONAL_FIELDS and value is None:
      value = config_dict.placeholder(_OPTIONAL_FIELDS[key])
    setattr(cfg, key, value)
  return cfg
