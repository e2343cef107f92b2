"""Argument handling shared by the blockwise attention implementations (chunked, pallas).

Both kernels mask with a single rule, "visible iff q_id == kv_id and kv_id != 0", plus the
position rules (causal / window). `kernel_segment_ids` rewrites every segment-id case of the
contract into that rule, and uses kv id 0 to hide the keys added to pad kv_len to a block multiple.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def unsupported(feature: str, implementation: str, supported: str) -> ValueError:
  return ValueError(
      f"{feature} is only supported by implementation={supported}, not {implementation!r}")


def check_dropout(rate, seed) -> float:
  """The dropout rate as a float after checking it (in [0, 1), with a seed when > 0)."""
  rate = float(rate)
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
  if rate and seed is None:
    raise ValueError("dropout_rate > 0 needs a dropout_seed (an int32 scalar, e.g. "
                     "tfjax.nn.dropout_hash.seed_from_key(rng))")
  return rate


def check_softcap(softcap):
  """The logit cap as a static float (None: off) after checking it is positive."""
  if softcap is None:
    return None
  if not float(softcap) > 0:
    raise ValueError(f"softcap must be a positive number (the bound of the capped scores), "
                     f"got {softcap}")
  return float(softcap)


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


# jax_default_matmul_precision values that ask for full fp32 products.
_FP32_PRECISIONS = ("highest", "float32", "F32_F32_F32")


def matmul_precision() -> lax.Precision:
  """The precision of the kernels' dots, following `jax_default_matmul_precision` as XLA's own
  matmuls do, so that 'pallas' and 'xla' compute the same function: by default Triton (like XLA
  on NVIDIA GPUs) multiplies fp32 operands in TF32; under `jax.default_matmul_precision("highest")`
  both use full fp32. bf16 / fp16 operands are unaffected."""
  setting = jax.config.jax_default_matmul_precision
  return lax.Precision.HIGHEST if setting in _FP32_PRECISIONS else lax.Precision.DEFAULT
