"""Positions, visibility masks and the ALiBi bias of attention: the rules every implementation
(tfjax/nn/ops.py's reference and tfjax/nn/kernels/) applies, in a leaf module that both import.

See tfjax/nn/ops.py for the contract these implement; shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

# Large finite negative instead of -inf: keeps exp() and its gradient NaN-free on masked rows, and
# exp(MASK_VALUE - m) underflows to exactly 0 for any row that sees a key.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


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
  """Boolean mask [B or 1, 1, T, S]: True where query t may attend to key s. None if all visible."""
  q_pos, kv_pos = query_key_positions(q_len, kv_len, q_positions, kv_positions)
  mask = None

  def _and(m, new):
    return new if m is None else jnp.logical_and(m, new)

  if causal or window is not None:
    rel_BxTxS = q_pos[:, :, None] - kv_pos[:, None, :]  # i - j
    mask = _and(mask, rel_BxTxS >= 0)
    if window is not None:
      mask = _and(mask, rel_BxTxS < window)
  if q_segment_ids is not None and kv_segment_ids is not None:
    same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    mask = _and(mask, jnp.logical_and(same, kv_segment_ids[:, None, :] != 0))
  elif kv_segment_ids is not None:
    mask = _and(mask, (kv_segment_ids != 0)[:, None, :])
  elif q_segment_ids is not None:
    mask = _and(mask, (q_segment_ids != 0)[:, :, None])
  if mask is None:
    return None
  return mask[:, None, :, :]


def alibi_bias(alibi_slopes, *, q_len: int, kv_len: int, q_positions=None,
               kv_positions=None) -> jax.Array:
  """ALiBi additive bias -m * |i - j| as [B or 1, H, T, S] float32."""
  q_pos, kv_pos = query_key_positions(q_len, kv_len, q_positions, kv_positions)
  dist_BxTxS = jnp.abs(q_pos[:, :, None] - kv_pos[:, None, :]).astype(jnp.float32)
  slopes_BxH = alibi_slopes_BxH(alibi_slopes)
  return -slopes_BxH[:, :, None, None] * dist_BxTxS[:, None, :, :]


def alibi_slopes_BxH(alibi_slopes, batch: Optional[int] = None) -> jax.Array:
  """ALiBi slopes given as [H] or [B, H] (any float dtype) as float32 [B or 1, H], or broadcast
  to [batch, H] when `batch` is given."""
  slopes = jnp.asarray(alibi_slopes, jnp.float32)
  slopes = slopes[None, :] if slopes.ndim == 1 else slopes
  return slopes if batch is None else jnp.broadcast_to(slopes, (batch, slopes.shape[-1]))
