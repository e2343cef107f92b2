"""The one frozen model config every module receives, built (and validated) from `config.model`.

ModelConfig holds the model-wide fields (family, sizes, embeddings, heads, dropout, init, dtype,
execution) and composes the sections each block owns, validated next to its math:
`attention` (tfjax/nn/attention.py), `feed_forward` (ffn.py), `norms` (norms.py) and `positions`
(positions.py, with RoPE's `positions.rope` in rope_config.py). Users spell every field as one
flat `config.model.<key>`: `ModelConfig.from_config(config.model)` routes each flat key to its
owner (an unknown key or an invalid value fails there, naming the key, the bad value and the valid
choices), `cfg.to_flat()` gives them back, and `cfg.replace(<flat key>=...)` makes a variant
(train, eval and decode are `.replace(deterministic=..., decode=...)` variants). Code reads a
field from its owner (`cfg.attention.num_heads`), the one spelling: `cfg.num_heads` is an error
naming it. Each field's flat key, default and command-line type are its dataclass declaration
(tfjax/nn/sections.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from tfjax.nn.attention import QK_NORMS, AttentionConfig
from tfjax.nn import kinds  # pylint: disable=unused-import  # registers the built-in kinds
from tfjax.nn.choices import import_hint, one_of
from tfjax.nn.ffn import FFNS, GATED_FFNS, FfnConfig
from tfjax.nn.norms import NORMS, PLACEMENTS, NormConfig
from tfjax.nn.ops import ATTENTION_IMPLS
from tfjax.nn.positions import POSITION_KINDS, SINUSOID_LAYOUTS, PositionConfig
from tfjax.nn.rope_config import ROPE_SCALINGS
from tfjax.nn.sections import Section

__all__ = ["ATTENTION_IMPLS", "DTYPES", "FAMILIES", "FFNS", "GATED_FFNS", "INITS", "NORMS",
           "PLACEMENTS", "POSITIONS", "QK_NORMS", "REMATS", "ROPE_SCALINGS", "SINUSOID_LAYOUTS",
           "ModelConfig", "default_model_config", "one_of"]

FAMILIES = ("encoder", "decoder", "encoder_decoder")
# The built-in position kinds (tfjax/nn/positions.py's registry is the live list).
POSITIONS = tuple(POSITION_KINDS)
# Init of the dense matrices (tfjax/nn/inits.py).
INITS = ("normal", "xavier_uniform")
REMATS = ("none", "full", "dots")
MLM_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")  # tfjax/nn/ffn.py's ACTIVATIONS
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
AUTO = "auto"  # config.model.dtype / attention_impl: chosen for the platform (resolve_auto)


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
  """The model-wide switches of tfjax and the blocks' sections. Field comments give the choices.

  A Section whose fields are its own flat keys and whose nested sections own the others."""
  family: str = "decoder"            # encoder | decoder | encoder_decoder
  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2                # encoder layers, or decoder layers for `decoder`
  num_decoder_layers: Optional[int] = None  # encoder_decoder only; None = num_layers
  max_len: int = 512                 # longest sequence (the learned position table's rows)
  parallel_block: bool = False       # x + attn(norm(x)) + ffn(norm(x)) (GPT-J, NeoX, Falcon, PaLM);
                                     # pre placement, no cross-attention
  embed_norm: bool = False           # BERT normalizes the embedding sum
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
  mlm_activation: str = "gelu"       # the MLM head's act: gelu (BERT) | gelu_tanh | relu | silu;
                                     # HF's hidden_act sets it with the FFN's (BigBird: gelu_new)
  pooler: bool = False               # encoder: tanh(dense(h_[CLS]))
  num_classes: int = 0               # encoder: sequence classifier on the pooled output
  dropout: float = 0.0               # embeddings and every residual branch
  init: str = "normal"               # dense matrices: normal (N(0, init_std^2)) | xavier_uniform
                                     # (Glorot; the original Transformer); tfjax/nn/inits.py
  init_std: float = 0.02             # normal init's std; also every embedding table's
  scaled_residual_init: bool = False  # GPT-2: W_O, FFN W_2 init std init_std / sqrt(2 * layers)
  scan_layers: bool = False          # nn.scan over layers: compile time flat in depth
  remat: str = "none"                # none | full | dots (save matmul outputs only)
  attention_impl: str = "xla"        # xla | chunked | pallas | cudnn | auto (tfjax.nn.ops)
  dtype: str = "float32"             # compute dtype; params stay float32. config.model default:
                                     # 'auto' (resolve_auto: bfloat16 on GPU/TPU, float32 on CPU)
  deterministic: bool = True         # False enables dropout (needs a 'dropout' rng)
  decode: bool = False               # KV-cache decoding (see tfjax/inference/decode.py)
  # ---- the blocks' sections (their fields declare their flat keys) ----
  attention: AttentionConfig = AttentionConfig()
  feed_forward: FfnConfig = FfnConfig()
  norms: NormConfig = NormConfig()
  positions: PositionConfig = PositionConfig()

  def __getattr__(self, name: str):
    """Only missing attributes land here: a section's flat key names its one spelling."""
    path = _section_paths().get(name)
    if path is None:
      raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
    raise AttributeError(
        f"ModelConfig has no attribute {name!r}: read cfg.{path} (model.{name} is the flat "
        f"config.model spelling, for from_config, to_flat and replace)")

  # ---- derived ----
  @property
  def dim_per_head(self) -> int:
    head_dim = self.attention.head_dim
    return self.d_model // self.attention.num_heads if head_dim is None else head_dim

  @property
  def rotary_dim(self) -> int:
    """Channels of each head that RoPE rotates (the first ones)."""
    return self.positions.rope.rotary_dim(self.dim_per_head)

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
    return self.max_len + self.positions.offset

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  # ---- flat keys ----
  def to_flat(self) -> dict:
    """{flat key: value} of every field: the `config.model` this config is built from."""
    return self.flat()

  @classmethod
  def from_flat(cls, items: dict) -> "ModelConfig":
    """The config of flat keys `items` (missing ones at their defaults), not yet validated."""
    keys = flat_keys()
    unknown = sorted(set(items) - set(keys))
    if unknown:
      raise ValueError(
          f"unknown model config key(s) {unknown}; valid keys are: {sorted(keys)} "
          f"({import_hint('a key of a kind or position')})")
    return super().from_flat(items)

  def replace(self, **kwargs) -> "ModelConfig":
    """A validated variant: flat keys (`window=8`, `decode=True`) or whole sections."""
    sections = {k: kwargs.pop(k) for k in list(kwargs) if k in SECTIONS}
    base = dataclasses.replace(self, **sections) if sections else self
    if not kwargs:
      return base.validated()
    return ModelConfig.from_flat({**base.to_flat(), **kwargs}).validated()

  @classmethod
  def from_config(cls, model_config: Any, platform: Optional[str] = None) -> "ModelConfig":
    """Builds from an ml_collections ConfigDict (or a dict) of flat keys, rejecting unknown keys;
    dtype / attention_impl 'auto' are resolved for `platform` (resolve_auto)."""
    items = dict(model_config.items()) if hasattr(model_config, "items") else dict(model_config)
    return cls.from_flat(resolve_auto(items, platform)).validated()

  def validated(self) -> "ModelConfig":
    one_of("model.family", self.family, FAMILIES)
    one_of("model.init", self.init, INITS)
    one_of("model.remat", self.remat, REMATS)
    one_of("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    one_of("model.dtype", self.dtype, tuple(DTYPES))
    for key in ("vocab_size", "d_model", "num_layers", "max_len"):
      if getattr(self, key) < 1:
        raise ValueError(f"model.{key}={getattr(self, key)} must be a positive integer")
    if self.num_decoder_layers is not None and self.num_decoder_layers < 1:
      raise ValueError(f"model.num_decoder_layers={self.num_decoder_layers} must be a positive "
                       "integer, or None for num_layers")
    for name in SECTIONS:
      getattr(self, name).validate(self)
    self._validate_embeddings()
    self._validate_residual()
    if self.logits_softcap is not None and not self.logits_softcap > 0:
      raise ValueError(f"model.logits_softcap={self.logits_softcap} must be a positive number "
                       "or None")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.dropout={self.dropout} must be in [0, 1)")
    if self.family != "encoder" and (self.pooler or self.num_classes or self.type_vocab_size):
      raise ValueError(
          f"model.pooler/num_classes/type_vocab_size are encoder options; "
          f"model.family={self.family!r} does not use them")
    one_of("model.mlm_activation", self.mlm_activation, MLM_ACTIVATIONS)
    if self.num_classes and not self.pooler:
      raise ValueError("model.num_classes > 0 classifies the pooled output: set model.pooler=True")
    if self.num_decoder_layers is not None and self.family != "encoder_decoder":
      raise ValueError("model.num_decoder_layers is only used by family='encoder_decoder'")
    return self

  def _validate_residual(self):
    if self.parallel_block and self.family == "encoder_decoder":
      raise ValueError("model.parallel_block=True has no cross-attention branch; use it with "
                       "family='decoder' or 'encoder'")
    if self.init == "xavier_uniform" and self.scaled_residual_init:
      raise ValueError("model.scaled_residual_init=True shrinks the normal init's std "
                       "(init_std / sqrt(2 layers)); model.init='xavier_uniform' has no std: set "
                       "scaled_residual_init=False or init='normal'")

  def _validate_embeddings(self):
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
    if self.scale_tied_logits and not self.tie_embeddings:
      raise ValueError("model.scale_tied_logits=True rescales the tied output layer's input but "
                       "model.tie_embeddings=False; set tie_embeddings=True or leave it False")


# The sections of ModelConfig and their classes.
SECTIONS = dict(ModelConfig.nested_sections())


def flat_keys() -> tuple:
  """Every config.model key: the model-wide fields, then each section's, then each registered
  attention kind's (a kind registered later, e.g. from a test, joins at once). `FLAT_KEYS` (a
  module attribute) is the same tuple."""
  keys = ModelConfig.flat_keys()
  if len(set(keys)) != len(keys):  # two fields spelled alike: give one a flat_key(...)
    raise TypeError(f"config.model keys declared twice: "
                    f"{sorted({k for k in keys if keys.count(k) > 1})}")
  return keys


def _section_paths() -> dict:
  """A section's flat key -> its field's path (`num_heads` -> 'attention.num_heads')."""
  return {f.key: ".".join(f.path) for f in ModelConfig.flat_fields() if len(f.path) > 1}


def __getattr__(name: str):
  if name == "FLAT_KEYS":
    return flat_keys()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


flat_keys()  # the built-in keys are checked at import


def platform_kind(platform: Optional[str] = None) -> str:
  """'gpu', 'tpu' or 'cpu' for a JAX platform or compile target name ('cuda', 'rocm', 'tpu',
  'cpu', ...); None: the platform this process runs on."""
  platform = (platform or jax.default_backend()).lower()
  return "gpu" if platform in ("gpu", "cuda", "rocm") else ("tpu" if platform == "tpu" else "cpu")


def xla_only_attention(items: dict) -> Optional[str]:
  """Why attention must (today) run on xla for these flat model keys, or None: what
  tfjax.nn.ops passes as its `xla_only` (a dense T5 bias). Attention dropout and soft-capping
  are not among them: the Pallas kernels apply both (tfjax/nn/dropout_hash.py, _blocks.soft_cap)."""
  if items.get("position") == "t5_bias":
    return "position='t5_bias' (a dense bias)"
  return None


def resolve_auto(items: dict, platform: Optional[str] = None,
                 num_devices: Optional[int] = None, context: int = 1) -> dict:
  """The flat model keys `items` with dtype / attention_impl 'auto' made concrete for `platform`
  (None: this process's) and a mesh whose context axis has `context` devices. The one place they
  are resolved. (`num_devices` is accepted for callers that pass it; the choice no longer depends
  on it: on every mesh the kernels run per device, tfjax/nn/sharded_attention.py.)

  GPU and TPU: bfloat16 compute (params and optimizer state stay float32: nanoGPT's autocast
  precision) and the Pallas attention kernels, a context axis included. Where an xla-only
  attention feature is on (xla_only_attention), attention_impl stays 'auto' and tfjax.nn.ops picks
  per call (its rule says which implementation takes that feature). CPU: float32 and xla, the
  values the CPU tables (docs/benchmarks/cpu_training.md) were measured with, so new runs compare
  to them; 'chunked' over a context axis (xla there would form each device's T/C x T logits)."""
  del num_devices
  kind = platform_kind(platform)
  out = dict(items)
  if out.get("dtype") == AUTO:
    out["dtype"] = "float32" if kind == "cpu" else "bfloat16"
  if out.get("attention_impl") == AUTO and (kind == "cpu" or xla_only_attention(out) is None):
    if kind != "cpu":
      out["attention_impl"] = "pallas"
    else:
      out["attention_impl"] = "chunked" if context > 1 and xla_only_attention(out) is None \
          else "xla"
  return out


def default_model_config(**overrides):
  """`config.model` as an ml_collections ConfigDict holding every flat key.

  Optional fields are typed placeholders so `--config.model.window=256` works from the command
  line; values not given here keep the ModelConfig defaults.
  """
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(overrides) - set(flat_keys()))
  if unknown:
    raise ValueError(f"unknown model config key(s) {unknown}")
  # Optional keys (default None) and their type, for typed command-line placeholders.
  optional = ModelConfig.optional_types()
  # dtype and attention_impl default to 'auto' (resolve_auto: the platform's fast path); a
  # ModelConfig built directly keeps its concrete float32 / xla defaults.
  values = {**ModelConfig().to_flat(), "dtype": AUTO, "attention_impl": AUTO, **overrides}
  cfg = config_dict.ConfigDict()
  for key, value in values.items():
    if key in optional and value is None:
      value = config_dict.placeholder(optional[key])
    setattr(cfg, key, value)
  return cfg
