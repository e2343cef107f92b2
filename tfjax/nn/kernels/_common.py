"""Argument handling shared by the blockwise attention implementations (chunked, pallas).

Both kernels mask with a single rule, "visible iff q_id == kv_id and kv_id != 0", plus the
position rules (causal / window). `kernel_segment_ids` rewrites every segment-id case of the
contract into that rule, and uses kv id 0 to hide the keys added to pad kv_len to a block multiple.
"""

from __future__ import annotations

import jax.numpy as jnp


def unsupported(feature: str, implementation: str, supported: str) -> ValueError:
  return ValueError(
      f"{feature} is only supported by implementation={supported}, not {implementation!r}")


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pad_axis(x, axis: int, new_size: int, mode: str = "constant"):
  """Pads `x` at the end of `axis` to `new_size` (zeros, or repeating the edge with mode='edge')."""
  extra = new_size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, mode=mode)


def kernel_segment_ids(q_segment_ids, kv_segment_ids, *, batch, q_len, kv_len, q_len_padded,
                       kv_len_padded):
  """int32 ids [B, Tp], [B, Sp] whose "equal and nonzero" rule reproduces the contract, or None.

  None (no segment masking at all) only when no ids are given and kv_len needs no padding.
  """
  if q_segment_ids is None and kv_segment_ids is None and kv_len == kv_len_padded:
    return None, None
  ones_q = jnp.ones((batch, q_len), jnp.int32)
  ones_kv = jnp.ones((batch, kv_len), jnp.int32)
  if q_segment_ids is not None and kv_segment_ids is not None:
    q_ids, kv_ids = q_segment_ids, kv_segment_ids
  elif kv_segment_ids is not None:  # Only keys with id 0 are hidden.
    q_ids, kv_ids = ones_q, (kv_segment_ids != 0)
  elif q_segment_ids is not None:  # Query rows with id 0 see nothing.
    q_ids, kv_ids = (q_segment_ids != 0), ones_kv
  else:  # Only the padded keys need hiding.
    q_ids, kv_ids = ones_q, ones_kv
  q_ids = jnp.broadcast_to(jnp.asarray(q_ids, jnp.int32), (batch, q_len))
  kv_ids = jnp.broadcast_to(jnp.asarray(kv_ids, jnp.int32), (batch, kv_len))
  # Padding gets id 0: padded keys are hidden from every query, padded queries see nothing.
  return pad_axis(q_ids, 1, q_len_padded), pad_axis(kv_ids, 1, kv_len_padded)
