"""Position encodings: sinusoidal, learned, RoPE (two pairings), ALiBi slopes. `none` is NoPE.

Shape letters as in tfjax/nn/axes.py (A: rotation angles per position).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import axes
from tfjax.nn.config import ModelConfig


def has_learned_table(cfg: ModelConfig) -> bool:
  """Whether positions are a learned table of `model.max_len` rows (so sequences are capped at
  max_len, and the table's parameters count)."""
  return cfg.position == "learned"


def sinusoidal_table(positions_BxL, d_model: int) -> jax.Array:
  """Vaswani et al. 3.5: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same); [B, L, D]."""
  inv_freq_A = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
  angles_BxLxA = positions_BxL[..., None].astype(jnp.float32) * inv_freq_A
  # Interleave so that even channels hold sin and odd channels cos, as in the formula.
  table_BxLxAx2 = jnp.stack([jnp.sin(angles_BxLxA), jnp.cos(angles_BxLxA)], axis=-1)
  return table_BxLxAx2.reshape(*positions_BxL.shape, d_model)


class LearnedPositions(nn.Module):
  """Absolute position table [max_len, d_model] (GPT-2, BERT).

  A sequence longer than the table is rejected when traced. Explicit `positions` values are data,
  not shapes, so they cannot be checked under jit: an out-of-table position reads NaN (jnp.take's
  fill mode), loudly poisoning the output instead of silently clamping. Decoding checks prompt +
  new tokens against the table before it starts (tfjax/training/decode.py).
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
    table = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), (None, axes.EMBED)),
        (cfg.max_len, cfg.d_model))
    return jnp.take(table, positions_BxL, axis=0).astype(cfg.compute_dtype)


def rope_frequencies(head_dim: int, base: float) -> jax.Array:
  """[E / 2] rotation frequencies base^(-2i/E)."""
  return 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def apply_rope(x_BxLxHxE, positions_BxL, *, base: float = 10000.0,
               interleaved: bool = False) -> jax.Array:
  """Rotary embedding (Su et al.) on the head dimension.

  interleaved=False: rotate-half pairing (i, i + D/2), as GPT-NeoX / Hugging Face LLaMA.
  interleaved=True:  adjacent pairing (2i, 2i+1), as RoFormer / Meta's LLaMA reference.
  Both rotate pair i by angle p * base^(-2i/D); they differ only in which channels form a pair.
  """
  head_dim = x_BxLxHxE.shape[-1]
  angles_BxLxA = positions_BxL[..., None].astype(jnp.float32) * rope_frequencies(head_dim, base)
  cos = jnp.cos(angles_BxLxA)[:, :, None, :]
  sin = jnp.sin(angles_BxLxA)[:, :, None, :]
  x = x_BxLxHxE.astype(jnp.float32)
  if interleaved:
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    out = out.reshape(x.shape)
  else:
    x_first, x_second = jnp.split(x, 2, axis=-1)
    out = jnp.concatenate([x_first * cos - x_second * sin, x_second * cos + x_first * sin], -1)
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
