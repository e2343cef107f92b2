"""Positions, visibility masks and the ALiBi bias of attention: the rules every implementation
(tfjax/nn/ops.py's reference and tfjax/nn/kernels/) applies, in a leaf module that both import.

`Visibility` (which keys each query sees) and `LogitsBias` (what a position kind adds to the
scores) are what MultiHeadAttention hands an attention kind (tfjax/nn/attention_kinds.py).
See tfjax/nn/ops.py for the contract these implement; shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

# Large finite negative instead of -inf: keeps exp() and its gradient NaN-free on masked rows, and
# exp(MASK_VALUE - m) underflows to exactly 0 for any row that sees a key.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class Visibility:
  """Which keys each query sees, by tfjax/nn/ops.py's rules: causal, a sliding window, segment
  ids (0 = padding) and absolute positions (None: the end-aligned defaults)."""
  causal: bool = False
  window: Optional[int] = None
  q_segment_ids_BxT: Any = None
  kv_segment_ids_BxS: Any = None
  q_positions_BxT: Any = None
  kv_positions_BxS: Any = None

  def replace(self, **changes) -> "Visibility":
    return dataclasses.replace(self, **changes)

  def positions(self, q_len: int, kv_len: int):
    """([B or 1, T], [B or 1, S]) absolute query and key positions (`query_key_positions`)."""
    return query_key_positions(q_len, kv_len, self.q_positions_BxT, self.kv_positions_BxS)

  def sequence_lengths(self, q_len: int, kv_len: int) -> jax.Array:
    """int32 [B or 1, T]: the length n of the sequence each query belongs to, counted in keys:
    the keys of its segment (packed rows), padding (segment id 0) and empty cache slots left out,
    at least 1. Causality and the window do not shorten it: every query of a row of n tokens
    gets n. While decoding it is the tokens cached so far (at most `window` with a ring buffer).
    The `seq_len_BxT` an attention kind with `lengths=True` receives
    (tfjax/nn/attention_kinds.py)."""
    q_ids_BxT, kv_ids_BxS = self.q_segment_ids_BxT, self.kv_segment_ids_BxS
    if kv_ids_BxS is None:
      return jnp.full((1, q_len), kv_len, jnp.int32)
    real_BxS = kv_ids_BxS != 0
    if q_ids_BxT is None:
      count_BxT = jnp.broadcast_to(jnp.sum(real_BxS, axis=-1, keepdims=True),
                                   (kv_ids_BxS.shape[0], q_len))
    else:
      same_BxTxS = (q_ids_BxT[:, :, None] == kv_ids_BxS[:, None, :]) & real_BxS[:, None, :]
      count_BxT = jnp.sum(same_BxTxS, axis=-1)
    return jnp.maximum(count_BxT, 1).astype(jnp.int32)

  def as_kwargs(self) -> dict:
    """The keyword arguments of tfjax.nn.ops.dot_product_attention (and visibility_mask)."""
    return dict(causal=self.causal, window=self.window, q_segment_ids=self.q_segment_ids_BxT,
                kv_segment_ids=self.kv_segment_ids_BxS, q_positions=self.q_positions_BxT,
                kv_positions=self.kv_positions_BxS)


@dataclasses.dataclass(frozen=True)
class LogitsBias:
  """Terms a position kind adds to the attention scores: ALiBi slopes (fused by the kernels) and
  a dense bias broadcastable to [B, H, T, S] (xla only). Both None: nothing added."""
  alibi_slopes_H: Any = None
  bias_BxHxTxS: Any = None

  def as_kwargs(self) -> dict:
    """The keyword arguments of tfjax.nn.ops.dot_product_attention."""
    return dict(alibi_slopes=self.alibi_slopes_H, bias=self.bias_BxHxTxS)


def default_positions(length: int, *, batch: int = 1, offset: int = 0) -> jax.Array:
  """int32 [batch, length]: positions offset, offset + 1, ..., the same in every row.

  Tokens of a sequence are at 0..L-1; attention queries are aligned to the end of the keys
  (offset = S - T, see tfjax/nn/ops.py).
  """
  positions = jnp.arange(length, dtype=jnp.int32)
  if offset:
    positions = positions + offset
  return jnp.broadcast_to(positions, (batch, length))


def query_key_positions(q_len: int, kv_len: int, q_positions=None, kv_positions=None):
  """([B or 1, T], [B or 1, S]): the given positions, or the defaults: keys at 0..S-1 and queries
  aligned to the end of the keys."""
  if q_positions is None:
    q_positions = default_positions(q_len, offset=kv_len - q_len)
  if kv_positions is None:
    kv_positions = default_positions(kv_len)
  return q_positions, kv_positions


def visibility_mask(*, q_len: int, kv_len: int, causal: bool = False,
                    window: Optional[int] = None, q_segment_ids=None, kv_segment_ids=None,
                    q_positions=None, kv_positions=None) -> Optional[jax.Array]:
  """Boolean mask [B or 1, 1, T, S]: True where query t may attend to key s. None if all
  visible."""
  q_pos_BxT, kv_pos_BxS = query_key_positions(q_len, kv_len, q_positions, kv_positions)
  mask_BxTxS = None

  def _and(m, new):
    return new if m is None else jnp.logical_and(m, new)

  if causal or window is not None:
    rel_BxTxS = q_pos_BxT[:, :, None] - kv_pos_BxS[:, None, :]  # i - j
    mask_BxTxS = _and(mask_BxTxS, rel_BxTxS >= 0)
    if window is not None:
      mask_BxTxS = _and(mask_BxTxS, rel_BxTxS < window)
  if q_segment_ids is not None and kv_segment_ids is not None:
    same_BxTxS = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    mask_BxTxS = _and(mask_BxTxS, jnp.logical_and(same_BxTxS, kv_segment_ids[:, None, :] != 0))
  elif kv_segment_ids is not None:
    mask_BxTxS = _and(mask_BxTxS, (kv_segment_ids != 0)[:, None, :])
  elif q_segment_ids is not None:
    mask_BxTxS = _and(mask_BxTxS, (q_segment_ids != 0)[:, :, None])
  if mask_BxTxS is None:
    return None
  return mask_BxTxS[:, None, :, :]


def alibi_bias(alibi_slopes, *, q_len: int, kv_len: int, q_positions=None,
               kv_positions=None) -> jax.Array:
  """ALiBi additive bias -m * |i - j| as [B or 1, H, T, S] float32."""
  q_pos_BxT, kv_pos_BxS = query_key_positions(q_len, kv_len, q_positions, kv_positions)
  dist_BxTxS = jnp.abs(q_pos_BxT[:, :, None] - kv_pos_BxS[:, None, :]).astype(jnp.float32)
  slopes_BxH = alibi_slopes_BxH(alibi_slopes)
  return -slopes_BxH[:, :, None, None] * dist_BxTxS[:, None, :, :]


def alibi_slopes_BxH(alibi_slopes, batch: Optional[int] = None) -> jax.Array:
  """ALiBi slopes given as [H] or [B, H] (any float dtype) as float32 [B or 1, H], or broadcast
  to [batch, H] when `batch` is given."""
  slopes = jnp.asarray(alibi_slopes, jnp.float32)
  slopes = slopes[None, :] if slopes.ndim == 1 else slopes
  return slopes if batch is None else jnp.broadcast_to(slopes, (batch, slopes.shape[-1]))
