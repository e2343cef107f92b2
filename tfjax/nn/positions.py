"""Position encodings: sinusoidal, learned, RoPE (two pairings, partial, frequency scaling), ALiBi
slopes. `none` is NoPE.

The registry of position kinds (`POSITION_KINDS`) is the one list of `model.position` values:
config validation, decoding past max_len (tfjax/inference/decode_window.py), parameter counts
(tfjax/training/accounting/params.py) and length evaluation (tfjax/research/length_eval.py) ask a
kind's `PositionKind` instead of listing names, and the model applies a kind through its hooks (add
to the embeddings, rotate q and k, add to the attention logits), never by its name.
`PositionConfig` is the positions' config section.

Shape letters as in tfjax/nn/axes.py (A: rotation angles per position).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Callable, ClassVar, Dict, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import axes
from tfjax.nn.attention_kinds import no_check, no_params
from tfjax.nn.choices import one_of
from tfjax.nn.masks import LogitsBias, Visibility
from tfjax.nn.relative_bias import t5_logits_bias, t5_stack_table
from tfjax.nn.rope_config import RopeConfig
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class PositionKind:
  """What the library needs to know about one `model.position` value.

  absolute: position p means "p tokens after the start of the context" (a table added to the
    embeddings), so decoding past max_len re-runs the last max_len tokens instead of sliding a
    KV-cache window. learned_table: the positions are a [max_len + offset, D] parameter table, so
    no sequence is longer than max_len. rotary: RoPE (the rope_* keys apply). reads: the
    PositionConfig keys beyond rope_* it reads (others must keep their defaults).
  embedding_params(cfg) / stack_params(cfg): its parameters per embedder (one per side when
    encoder and decoder have their own) and per layer stack. check(cfg): its own validation.

  Hooks (None: the kind does not act there), each called without naming the kind:
    embedding(cfg) -> module m, m(positions_BxL, seq_len) -> [B, L, D] added to the token
      embeddings (tfjax/nn/models.py's Embedder holds it as 'positions').
    rotate(cfg, q_BxTxHxE, k_BxSxKxE, positions_BxT, *, local) -> (q, k): self-attention's
      queries and keys before the KV cache; local: a sliding-window layer.
    stack_table(cfg) -> named module t, t() -> the one table of a layer stack, shared by its
      layers (tfjax/nn/layers.py) and handed to logits_bias.
    logits_bias(cfg, table, visibility, q_len, kv_len) -> LogitsBias added to self-attention's
      scores (masks.py's Visibility gives the queries' and keys' absolute positions).
  """
  name: str
  absolute: bool = False
  learned_table: bool = False
  rotary: bool = False
  reads: tuple = ()
  embedding_params: Callable[[ModelConfig], int] = no_params
  stack_params: Callable[[ModelConfig], int] = no_params
  check: Callable[[ModelConfig], None] = no_check
  embedding: Optional[Callable[[ModelConfig], nn.Module]] = None
  rotate: Optional[Callable[..., tuple]] = None
  stack_table: Optional[Callable[[ModelConfig], nn.Module]] = None
  logits_bias: Optional[Callable[..., LogitsBias]] = None


POSITION_KINDS: Dict[str, PositionKind] = {}


def register_position_kind(kind: PositionKind) -> PositionKind:
  """Adds `kind` to the registry (validation and every consumer see it at once)."""
  POSITION_KINDS[kind.name] = kind
  return kind


def position_kind(cfg: ModelConfig) -> PositionKind:
  """The registry entry of `cfg`'s model.position."""
  return cfg.positions.kind_info


def has_learned_table(cfg: ModelConfig) -> bool:
  """Whether positions are a learned table of `model.max_len` rows (so sequences are capped at
  max_len, and the table's parameters count)."""
  return position_kind(cfg).learned_table


def _even_head_dim(cfg: ModelConfig) -> None:
  if cfg.dim_per_head % 2:
    raise ValueError(f"model.position={cfg.positions.kind!r} needs an even head dimension, got "
                     f"{cfg.dim_per_head}")


def _even_d_model(cfg: ModelConfig) -> None:
  if cfg.d_model % 2:
    raise ValueError(f"model.position='sinusoidal' needs an even d_model, got {cfg.d_model}")


def _check_t5_bias(cfg: ModelConfig) -> None:
  buckets, distance = cfg.positions.relative_buckets, cfg.positions.relative_max_distance
  if buckets < 4:
    raise ValueError(f"model.relative_buckets={buckets} must be >= 4 (half for each direction, "
                     "half of those exact offsets)")
  if distance <= buckets // 2:
    raise ValueError(f"model.relative_max_distance={distance} must exceed relative_buckets // 2 "
                     f"= {buckets // 2} (the exact offsets)")
  if cfg.attention_impl not in ("xla", "auto"):
    raise ValueError(
        f"model.position='t5_bias' adds a dense [T, S] bias that only the xla attention takes, "
        f"not model.attention_impl={cfg.attention_impl!r}; set attention_impl='xla' or 'auto'")


def _rotate_rope(cfg: ModelConfig, q_BxTxHxE, k_BxSxKxE, positions_BxT, *, local: bool,
                 interleaved: bool):
  """RoPE on q and k at `positions_BxT`; a local (sliding) layer with model.rope_local_base set
  rotates with that base, unscaled (Gemma 3)."""
  local_base = cfg.positions.rope.local_base
  if local and local_base is not None:
    inv_freq_A, gain = rope_frequencies(cfg.rotary_dim, local_base), 1.0
  else:
    inv_freq_A, gain = scaled_rope_frequencies(cfg, positions_BxT)
  rope = dict(interleaved=interleaved, inv_freq=inv_freq_A, rotary_dim=cfg.rotary_dim, gain=gain)
  return (apply_rope(q_BxTxHxE, positions_BxT, **rope),
          apply_rope(k_BxSxKxE, positions_BxT, **rope))


def _alibi_logits_bias(cfg: ModelConfig, table, visibility: Visibility, q_len: int,
                       kv_len: int) -> LogitsBias:
  """ALiBi's slopes; every attention implementation turns them into -m * |i - j|."""
  del table, visibility, q_len, kv_len
  return LogitsBias(alibi_slopes_H=alibi_slopes(cfg.attention.num_heads))


def _register_builtin_kinds():
  for kind in (
      PositionKind("sinusoidal", absolute=True, reads=("sinusoid_layout",), check=_even_d_model,
                   embedding=SinusoidalPositions),
      PositionKind("learned", absolute=True, learned_table=True, reads=("position_offset",),
                   embedding_params=lambda cfg: cfg.position_table_rows * cfg.d_model,
                   embedding=LearnedPositions),
      PositionKind("rope", rotary=True, check=_even_head_dim,
                   rotate=functools.partial(_rotate_rope, interleaved=False)),
      PositionKind("rope_interleaved", rotary=True, check=_even_head_dim,
                   rotate=functools.partial(_rotate_rope, interleaved=True)),
      PositionKind("alibi", logits_bias=_alibi_logits_bias),
      PositionKind("t5_bias", reads=("relative_buckets", "relative_max_distance"),
                   stack_params=lambda cfg: (cfg.positions.relative_buckets
                                             * cfg.attention.num_heads),
                   check=_check_t5_bias, stack_table=t5_stack_table, logits_bias=t5_logits_bias),
      PositionKind("none")):
    register_position_kind(kind)


SINUSOID_LAYOUTS = ("interleaved", "halves")


@dataclasses.dataclass(frozen=True)
class PositionConfig(Section):
  """kind: a registered PositionKind (sinusoidal | learned | rope | rope_interleaved | alibi |
  t5_bias (bucketed relative bias, tfjax/nn/relative_bias.py) | none).
  relative_buckets / relative_max_distance: t5_bias's buckets of the relative offsets; offsets
  from max_distance on share the last bucket. offset: learned positions read row pos + offset of
  a table of max_len + offset rows (BART, mBART: 2). sinusoid_layout: interleaved ([sin, cos] per
  pair, Vaswani et al.) | halves ([sin ... | cos ...], Marian, Pegasus). init_std: the learned
  table's init std; None = model.init_std (with embed_scale, 2^-0.5 matches the sinusoid table's
  RMS; other kinds ignore it, so ablation arms can share it). rope: RoPE's section.
  """
  kind: str = flat_key("position", "learned")
  relative_buckets: int = 32
  relative_max_distance: int = 128
  offset: int = flat_key("position_offset", 0)
  sinusoid_layout: str = "interleaved"
  init_std: Optional[float] = flat_key("position_init_std", None)
  rope: RopeConfig = RopeConfig()
  # Keys read by the kinds that list them in PositionKind.reads only.
  KIND_KEYS: ClassVar = ("relative_buckets", "relative_max_distance", "position_offset",
                         "sinusoid_layout")

  @property
  def kind_info(self) -> PositionKind:
    """The registry entry of `kind`."""
    return POSITION_KINDS[self.kind]

  def validate(self, model) -> None:
    one_of("model.position", self.kind, tuple(POSITION_KINDS), registered="a position kind")
    one_of("model.sinusoid_layout", self.sinusoid_layout, SINUSOID_LAYOUTS)
    kind = POSITION_KINDS[self.kind]
    values, defaults = self.flat(), self.flat_defaults()
    for key in self.KIND_KEYS:
      if values[key] != defaults[key] and key not in kind.reads:
        users = tuple(k.name for k in POSITION_KINDS.values() if key in k.reads)
        readers = f"position={users[0]!r}" if len(users) == 1 else f"position in {users}"
        raise ValueError(f"model.{key}={values[key]!r} is read by {readers} only, but "
                         f"model.position={self.kind!r}; leave it at {defaults[key]!r}")
    if self.offset < 0:
      raise ValueError(f"model.position_offset={self.offset} shifts the rows of the learned "
                       "position table; use an offset >= 0")
    if self.init_std is not None and not self.init_std > 0:
      raise ValueError(f"model.position_init_std={self.init_std} must be a positive std "
                       "or None (= model.init_std)")
    kind.check(model)
    self.rope.validate(model)


def sinusoidal_table(positions_BxL, d_model: int, layout: str = "interleaved") -> jax.Array:
  """Vaswani et al. 3.5 with w_i = 10000^(-2i/d), [B, L, D]:
  interleaved: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i) (the paper's formula);
  halves:      PE[p, i] = sin(p w_i), PE[p, d/2 + i] = cos(p w_i) (Marian, Pegasus)."""
  inv_freq_A = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
  angles_BxLxA = positions_BxL[..., None].astype(jnp.float32) * inv_freq_A
  if layout == "halves":
    return jnp.concatenate([jnp.sin(angles_BxLxA), jnp.cos(angles_BxLxA)], axis=-1)
  # Interleave so that even channels hold sin and odd channels cos, as in the formula.
  table_BxLxAx2 = jnp.stack([jnp.sin(angles_BxLxA), jnp.cos(angles_BxLxA)], axis=-1)
  return table_BxLxAx2.reshape(*positions_BxL.shape, d_model)


class SinusoidalPositions(nn.Module):
  """The fixed sinusoid table of model.sinusoid_layout, [B, L, D] float32 (no parameters)."""
  config: ModelConfig

  def __call__(self, positions_BxL, seq_len: int):
    del seq_len  # any length: the table is a formula
    cfg = self.config
    return sinusoidal_table(positions_BxL, cfg.d_model, cfg.positions.sinusoid_layout)


class LearnedPositions(nn.Module):
  """Absolute position table [max_len + position_offset, d_model] (GPT-2, BERT; BART reads row
  p + 2 for position p).

  A sequence longer than the table is rejected when traced. Explicit `positions` values are data,
  not shapes, so they cannot be checked under jit: an out-of-table position reads NaN (jnp.take's
  fill mode), loudly poisoning the output instead of silently clamping. Decoding checks prompt +
  new tokens against the table before it starts (tfjax/inference/decode.py).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, positions_BxL, seq_len: int):
    cfg = self.config
    if seq_len > cfg.max_len:
      raise ValueError(
          f"sequence length {seq_len} exceeds the learned position table "
          f"(model.max_len={cfg.max_len}); raise model.max_len or use a relative encoding "
          "(rope, alibi, none) to run longer sequences")
    std = cfg.init_std if cfg.positions.init_std is None else cfg.positions.init_std
    table = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(std), (None, axes.EMBED)),
        (cfg.position_table_rows, cfg.d_model))
    if cfg.positions.offset:  # BART: position p reads row p + 2
      positions_BxL = positions_BxL + cfg.positions.offset
    return jnp.take(table, positions_BxL, axis=0).astype(cfg.compute_dtype)


def rope_frequencies(head_dim: int, base: float) -> jax.Array:
  """[E / 2] rotation frequencies base^(-2i/E)."""
  return 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


# ---- RoPE frequency scaling (model.rope_scaling, tfjax/nn/rope_config.py) --------------------
def linear_scaled_frequencies(inv_freq, factor: float):
  """Position interpolation (Chen et al. 2023): every frequency divided by the factor, so position
  p rotates as p / factor did."""
  return inv_freq / factor


def dynamic_ntk_base(base: float, dim: int, factor: float, original_max_len: int, seq_len):
  """Dynamic NTK-aware scaling: the base grows with the sequence once it exceeds the trained
  context, base * (factor * L / L_orig - (factor - 1))^(dim / (dim - 2)) with L = max(seq_len,
  L_orig) (so the base is unchanged within the trained context). seq_len may be traced."""
  seq_len = jnp.maximum(jnp.asarray(seq_len, jnp.float32), float(original_max_len))
  return base * (factor * seq_len / original_max_len - (factor - 1.0)) ** (dim / (dim - 2))


def llama3_scaled_frequencies(inv_freq, factor: float, low_freq_factor: float,
                              high_freq_factor: float, original_max_len: int):
  """Llama 3.1: wavelengths 2 pi / f longer than L_orig / low_freq_factor are divided by the
  factor (interpolated), shorter than L_orig / high_freq_factor kept, and in between blended with
  s = (L_orig / wavelength - low) / (high - low): (1 - s) f / factor + s f."""
  wavelen = 2.0 * math.pi / inv_freq
  low_wavelen = original_max_len / low_freq_factor
  high_wavelen = original_max_len / high_freq_factor
  smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
  return jnp.where(wavelen > low_wavelen, inv_freq / factor,
                   jnp.where(wavelen < high_wavelen, inv_freq, blended))


def yarn_scaled_frequencies(dim: int, base: float, factor: float, original_max_len: int,
                            beta_fast: float, beta_slow: float):
  """YaRN (Peng et al. 2023), "NTK-by-parts": dimension d has r(d) = L_orig / (2 pi base^(2d/dim))
  rotations over the trained context; the dimensions d(beta) = dim ln(L_orig / (2 pi beta)) /
  (2 ln base) for beta_fast and beta_slow (floor and ceil, clipped to [0, dim - 1]) bound a linear
  ramp gamma from 1 (fast: keep f, extrapolate) to 0 (slow: f / factor, interpolate):
  f' = f / factor * (1 - gamma) + f * gamma."""
  def correction_dim(rotations):
    return dim * math.log(original_max_len / (rotations * 2.0 * math.pi)) / (2.0 * math.log(base))

  low = max(math.floor(correction_dim(beta_fast)), 0)
  high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
  if low == high:
    high += 0.001  # avoids a zero-width ramp
  ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0)
  extrapolate = 1.0 - ramp
  inv_freq = rope_frequencies(dim, base)
  return inv_freq / factor * (1.0 - extrapolate) + inv_freq * extrapolate


def yarn_attention_factor(factor: float) -> float:
  """YaRN's default gain on cos and sin (so on q.k as its square): 0.1 ln(factor) + 1."""
  return 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0


def scaled_rope_frequencies(cfg: ModelConfig, positions_BxL=None):
  """(inverse frequencies [rotary_dim / 2], gain on cos/sin) of the config's RoPE.

  `dynamic` reads the longest position in `positions_BxL` (seq_len = max + 1, as Hugging Face
  does per forward call); in KV-cache decoding, keys cached earlier keep the frequencies they were
  rotated with, so past the trained context cached and full-forward logits differ (as in HF).
  """
  rope = cfg.positions.rope
  dim, base, factor = cfg.rotary_dim, rope.base, rope.scaling_factor
  kind = rope.scaling
  if kind == "dynamic":
    seq_len = jnp.max(positions_BxL) + 1
    base = dynamic_ntk_base(base, dim, factor, rope.original_max_len, seq_len)
    return 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)), 1.0
  if kind == "yarn":
    gain = rope.attention_factor
    gain = yarn_attention_factor(factor) if gain is None else gain
    return yarn_scaled_frequencies(dim, base, factor, rope.original_max_len,
                                   rope.beta_fast, rope.beta_slow), gain
  inv_freq = rope_frequencies(dim, base)
  if kind == "linear":
    return linear_scaled_frequencies(inv_freq, factor), 1.0
  if kind == "llama3":
    return llama3_scaled_frequencies(inv_freq, factor, rope.low_freq_factor,
                                     rope.high_freq_factor, rope.original_max_len), 1.0
  return inv_freq, 1.0


def apply_rope(x_BxLxHxE, positions_BxL, *, base: float = 10000.0,
               interleaved: bool = False, inv_freq=None, rotary_dim: int | None = None,
               gain: float = 1.0) -> jax.Array:
  """Rotary embedding (Su et al.) on the head dimension.

  interleaved=False: rotate-half pairing (i, i + R/2), as GPT-NeoX / Hugging Face LLaMA.
  interleaved=True:  adjacent pairing (2i, 2i+1), as RoFormer / GPT-J / Meta's LLaMA reference.
  Both rotate pair i by angle p * f_i, f_i = inv_freq[i] (default base^(-2i/R)); they differ only
  in which channels form a pair. Only the first R = rotary_dim channels (default all) rotate; the
  rest pass unchanged (partial rotary, GPT-NeoX / Phi). cos and sin are multiplied by `gain`
  (YaRN's attention factor).
  """
  head_dim = x_BxLxHxE.shape[-1]
  rotary_dim = head_dim if rotary_dim is None else rotary_dim
  if inv_freq is None:
    inv_freq = rope_frequencies(rotary_dim, base)
  angles_BxLxA = positions_BxL[..., None].astype(jnp.float32) * inv_freq
  cos = jnp.cos(angles_BxLxA)[:, :, None, :]
  sin = jnp.sin(angles_BxLxA)[:, :, None, :]
  if gain != 1.0:
    cos, sin = cos * gain, sin * gain
  x = x_BxLxHxE.astype(jnp.float32)
  x, passed = x[..., :rotary_dim], x[..., rotary_dim:]
  if interleaved:
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    out = out.reshape(x.shape)
  else:
    x_first, x_second = jnp.split(x, 2, axis=-1)
    out = jnp.concatenate([x_first * cos - x_second * sin, x_second * cos + x_first * sin], -1)
  if rotary_dim < head_dim:
    out = jnp.concatenate([out, passed], axis=-1)
  return out.astype(x_BxLxHxE.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. (2021): geometric slopes 2^(-8h/n); for n not a power of two, the slopes of the
  closest smaller power of two followed by every other slope of the next power of two."""
  def power_of_two_slopes(n):
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

  if math.log2(num_heads).is_integer():
    return np.asarray(power_of_two_slopes(num_heads), np.float32)
  closest = 2 ** math.floor(math.log2(num_heads))
  extra = power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
  return np.asarray(power_of_two_slopes(closest) + extra, np.float32)


_register_builtin_kinds()  # here: the kinds' modules and math are defined above
