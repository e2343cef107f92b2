"""RoPE's config section: base, partial rotation and frequency scaling (the model.rope_* keys),
their validation and their Hugging Face spelling. The math is tfjax/nn/positions.py.

`rope_scaling` (none | linear | dynamic | yarn | llama3) chooses which of the other rope_* keys
are read; a key set for a scaling that does not read it is an error naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from tfjax.nn.choices import one_of
from tfjax.nn.sections import Section, UnsupportedError, flat_key

# RoPE frequency scaling for long contexts; see tfjax/nn/positions.py.
ROPE_SCALINGS = ("none", "linear", "dynamic", "yarn", "llama3")
# The rope_* keys each scaling reads (any other scaling must leave them at their defaults).
SCALING_KEYS = {
    "rope_scaling_factor": ("linear", "dynamic", "yarn", "llama3"),
    "rope_original_max_len": ("dynamic", "yarn", "llama3"),
    "rope_low_freq_factor": ("llama3",), "rope_high_freq_factor": ("llama3",),
    "rope_beta_fast": ("yarn",), "rope_beta_slow": ("yarn",), "rope_attention_factor": ("yarn",),
}
# Hugging Face rope_type -> the rope_scaling / rope_parameters fields it reads.
_HF_SCALING_FIELDS = {
    "default": (), "linear": ("factor",), "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "truncate")}


@dataclasses.dataclass(frozen=True)
class RopeConfig(Section):
  """base: the frequency base. local_base: the base of sliding-window layers, which also skip the
  scaling (Gemma 3: 10000 local, 1e6 global); None = base and the scaling on every layer.
  fraction: rotate the first int(head_dim * fraction) dims of each head (partial rotary: GPT-NeoX,
  Phi); the rest pass unchanged.
  scaling: none | linear (position interpolation, Chen et al. 2023) | dynamic (NTK-aware base
  growing with the sequence) | yarn (Peng et al. 2023) | llama3 (Llama 3.1's banded rescale), by
  scaling_factor (>= 1); original_max_len: training context of the unscaled model (dynamic, yarn,
  llama3). llama3: wavelengths above original_max_len / low_freq_factor are scaled, below
  original_max_len / high_freq_factor kept. yarn: the ramp to extrapolation runs from beta_slow to
  beta_fast rotations; attention_factor is the cos/sin gain (None = 0.1 ln(factor) + 1).
  """
  base: float = flat_key("rope_base", 10000.0)
  local_base: Optional[float] = flat_key("rope_local_base", None)
  fraction: float = flat_key("rotary_fraction", 1.0)
  scaling: str = flat_key("rope_scaling", "none")
  scaling_factor: float = flat_key("rope_scaling_factor", 1.0)
  original_max_len: Optional[int] = flat_key("rope_original_max_len", None)
  low_freq_factor: float = flat_key("rope_low_freq_factor", 1.0)
  high_freq_factor: float = flat_key("rope_high_freq_factor", 4.0)
  beta_fast: float = flat_key("rope_beta_fast", 32.0)
  beta_slow: float = flat_key("rope_beta_slow", 1.0)
  attention_factor: Optional[float] = flat_key("rope_attention_factor", None)

  def rotary_dim(self, head_dim: int) -> int:
    """Channels of each head that RoPE rotates (the first ones)."""
    return int(head_dim * self.fraction)

  def validate(self, model) -> None:
    one_of("model.rope_scaling", self.scaling, ROPE_SCALINGS)
    rope = model.positions.kind_info.rotary
    position = model.positions.kind
    if self.scaling != "none" and not rope:
      raise ValueError(
          f"model.rope_scaling={self.scaling!r} scales RoPE frequencies but "
          f"model.position={position!r}; set model.position='rope' (or 'rope_interleaved') "
          "or model.rope_scaling='none'")
    values, defaults = self.flat(), self.flat_defaults()
    for key, users in SCALING_KEYS.items():
      if values[key] != defaults[key] and self.scaling not in users:
        raise ValueError(
            f"model.{key}={values[key]!r} is only read by model.rope_scaling in {users}, "
            f"but model.rope_scaling={self.scaling!r}; set it to {defaults[key]!r} or "
            "choose a scaling that uses it")
    if self.scaling != "none" and not self.scaling_factor >= 1.0:
      raise ValueError(f"model.rope_scaling_factor={self.scaling_factor} must be >= 1 "
                       "(the context extension ratio)")
    if self.scaling in ("dynamic", "yarn", "llama3") and not (
        self.original_max_len and self.original_max_len > 0):
      raise ValueError(
          f"model.rope_scaling={self.scaling!r} needs model.rope_original_max_len, the "
          f"context length the unscaled model was trained at (got {self.original_max_len})")
    if self.scaling == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
      raise ValueError(
          f"model.rope_low_freq_factor={self.low_freq_factor} must be positive and below "
          f"model.rope_high_freq_factor={self.high_freq_factor}")
    if self.scaling == "yarn":
      if not 0 < self.beta_slow < self.beta_fast:
        raise ValueError(f"model.rope_beta_slow={self.beta_slow} must be positive and below "
                         f"model.rope_beta_fast={self.beta_fast}")
      if self.attention_factor is not None and not self.attention_factor > 0:
        raise ValueError(f"model.rope_attention_factor={self.attention_factor} must be > 0 "
                         "or None (0.1 ln(factor) + 1)")
    if self.local_base is not None and not (
        rope and model.attention.window is not None and self.local_base > 0):
      raise ValueError(
          f"model.rope_local_base={self.local_base} is the RoPE base of sliding-window "
          f"layers; it needs model.position='rope' (got {position!r}), a model.window (got "
          f"{model.attention.window}) and a positive base, or rope_local_base=None")
    if self.fraction != 1.0:
      if not rope:
        raise ValueError(
            f"model.rotary_fraction={self.fraction} is partial RoPE but "
            f"model.position={position!r}; set model.position='rope' or rotary_fraction=1")
      head_dim = model.dim_per_head
      rotary_dim = self.rotary_dim(head_dim)
      if not 0.0 < self.fraction <= 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"model.rotary_fraction={self.fraction} must be in (0, 1] and rotate an even, "
            f"nonzero number of channels; int({head_dim} * {self.fraction}) = {rotary_dim}")

  # ---- Hugging Face config.json ----------------------------------------------------------------
  @classmethod
  def from_hf(cls, f, max_len: int, *, theta_key: str = "rope_theta",
              fraction_key: str = "partial_rotary_factor", fraction_default: float = 1.0) -> dict:
    """model.rope_* (and rotary_fraction) keys from `rope_parameters` (transformers 5) or the
    legacy top-level fields of config.json (`f`: tfjax.hf.mapping.Fields): `theta_key`
    (GPT-NeoX: rotary_emb_base), `rope_scaling`, and `fraction_key` (GPT-NeoX: rotary_pct, Phi:
    partial_rotary_factor; `fraction_default` when absent, as each transformers config sets it)."""
    params = f.get("rope_parameters") or {}
    legacy = f.get("rope_scaling") or {}
    theta = params.get("rope_theta", f.get(theta_key, 10000.0))
    scaling = dict(legacy, **{k: v for k, v in params.items() if k != "rope_theta"})
    fraction = float(scaling.pop("partial_rotary_factor", f.get(fraction_key, fraction_default)))
    kind = scaling.pop("rope_type", scaling.pop("type", "default"))
    out = {"rope_base": float(theta)}
    if fraction != 1.0:
      out["rotary_fraction"] = fraction
    if kind not in _HF_SCALING_FIELDS:
      raise UnsupportedError(f"{f.arch} config.json rope_scaling / rope_parameters type {kind!r} "
                             f"is not supported (supported: {list(_HF_SCALING_FIELDS)})")
    extra = sorted(set(scaling) - set(_HF_SCALING_FIELDS[kind]))
    if extra:
      raise UnsupportedError(f"{f.arch} rope scaling {kind!r} has field(s) {extra} that tfjax "
                             "does not implement")
    if kind == "default":
      return out
    if kind == "yarn" and not scaling.get("truncate", True):
      raise UnsupportedError(f"{f.arch} yarn rope scaling with truncate=False is not supported")
    out.update(rope_scaling=kind, rope_scaling_factor=float(scaling["factor"]))
    if kind != "linear":
      out["rope_original_max_len"] = int(scaling.get("original_max_position_embeddings", max_len))
    if kind == "llama3":
      out.update(rope_low_freq_factor=float(scaling["low_freq_factor"]),
                 rope_high_freq_factor=float(scaling["high_freq_factor"]))
    if kind == "yarn":
      out.update(rope_beta_fast=float(scaling.get("beta_fast", 32.0)),
                 rope_beta_slow=float(scaling.get("beta_slow", 1.0)))
      if scaling.get("attention_factor") is not None:
        out["rope_attention_factor"] = float(scaling["attention_factor"])
    return out

  def to_hf(self, with_fraction: bool = False) -> dict:
    """{"rope_parameters": ...} of config.json; `with_fraction` writes partial_rotary_factor
    (families whose default is not 1)."""
    params = {"rope_theta": self.base, "rope_type": "default"}
    if with_fraction or self.fraction != 1.0:
      params["partial_rotary_factor"] = self.fraction
    if self.scaling != "none":
      params.update(rope_type=self.scaling, factor=self.scaling_factor)
    if self.scaling in ("dynamic", "llama3", "yarn"):
      params["original_max_position_embeddings"] = self.original_max_len
    if self.scaling == "llama3":
      params.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor)
    if self.scaling == "yarn":
      params.update(beta_fast=self.beta_fast, beta_slow=self.beta_slow)
      if self.attention_factor is not None:
        params["attention_factor"] = self.attention_factor
    return {"rope_parameters": params}
