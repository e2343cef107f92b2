"""Attention-dropout keep mask as a counter-based hash of (seed, batch, head, query, key).

One definition for the plain-JAX reference (tfjax.nn.ops, implementation='xla') and every Pallas
kernel (tfjax/nn/kernels/): the same seed gives the same mask in all of them, and a kernel's
backward regenerates its forward's mask from the indices instead of storing a T x S array.

  key[b, h]   = fmix32(fmix32(seed ^ b * C_BATCH) ^ h * C_HEAD)       (per batch and query head)
  row[b,h,t]  = fmix32(key[b, h] ^ t * C_QUERY)
  bits        = fmix32(row[b, h, t] ^ s * C_KEY)
  keep        = (bits >>> 8) < round((1 - rate) * 2^24)
fmix32 is MurmurHash3's 32-bit finaliser (a bijection with full avalanche). t and s are the
query's and key's indices in the (unpadded) sequence, h the query head (GQA heads sharing a kv
head get different masks). The per-(batch, head) keys are computed outside the kernels
(`head_keys`), so in-kernel code needs only elementwise 32-bit multiply, xor and logical shift.
Everything is int32 with wrapping multiplies (the same bits as uint32 arithmetic): Triton, Mosaic
TPU and XLA all lower int32 vector multiply, xor and logical right shift, while unsigned vectors
are not lowered everywhere. The top 24 bits compared as non-negative int32 avoid an unsigned
compare; the keep probability is then (1 - rate) to within 2^-25.

This module imports only jax (no Pallas), so tfjax.nn.ops can use it without importing kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# NumPy scalars, not jax arrays: in-kernel code may not capture array constants.
I32 = np.int32


def _i32(c: int) -> int:
  """A uint32 constant as the int32 with the same bits."""
  return c - (1 << 32) if c >= 1 << 31 else c


C_BATCH = _i32(0x9E3779B1)  # odd multipliers: each is a bijection of the 32-bit index
C_HEAD = _i32(0x85EBCA77)
C_QUERY = _i32(0xC2B2AE3D)
C_KEY = _i32(0x27D4EB2F)
_M1, _M2 = _i32(0x85EBCA6B), _i32(0xC2B2AE35)  # MurmurHash3 fmix32
KEEP_BITS = 24


def fmix32(x):
  """MurmurHash3's finaliser on int32 bits: x ^= x >>> 16; x *= M1; x ^= x >>> 13; x *= M2;
  x ^= x >>> 16 (logical shifts, wrapping multiplies)."""
  x = x ^ lax.shift_right_logical(x, I32(16))
  x = x * I32(_M1)
  x = x ^ lax.shift_right_logical(x, I32(13))
  x = x * I32(_M2)
  return x ^ lax.shift_right_logical(x, I32(16))


def seed_from_key(rng) -> jax.Array:
  """An int32 dropout seed drawn from a PRNG key (the caller's dropout rng)."""
  return lax.bitcast_convert_type(jax.random.bits(rng, (), jnp.uint32), I32)


def as_seed(seed) -> jax.Array:
  """A Python int or an integer scalar (int32 or uint32) as an int32 scalar with the same bits."""
  if isinstance(seed, int):
    return jnp.asarray(_i32(seed % (1 << 32)), I32)
  seed = jnp.asarray(seed)
  if seed.shape != () or not jnp.issubdtype(seed.dtype, jnp.integer) or seed.dtype.itemsize > 4:
    raise ValueError(f"dropout_seed must be a 32-bit integer scalar (e.g. from "
                     f"tfjax.nn.dropout_hash.seed_from_key); got {seed.dtype}{list(seed.shape)}")
  if seed.dtype == jnp.uint32:
    return lax.bitcast_convert_type(seed, I32)
  return seed.astype(I32)


def head_keys(seed, batch: int, heads: int) -> jax.Array:
  """int32 [batch, heads]: the per-(batch, query head) key the kernels read as a scalar.

  `seed` may also be such keys already ([batch, heads] int32): a device's block of the whole
  batch's keys, which tfjax/nn/sharded_attention.py hands each shard so that the mask reads
  global batch and head indices."""
  if jnp.ndim(seed) == 2:
    if jnp.shape(seed) != (batch, heads) or jnp.asarray(seed).dtype != jnp.int32:
      raise ValueError(f"dropout keys must be int32 [{batch}, {heads}] (dropout_hash.head_keys); "
                       f"got {jnp.asarray(seed).dtype}{list(jnp.shape(seed))}")
    return seed
  b = lax.broadcasted_iota(I32, (batch, heads), 0)
  h = lax.broadcasted_iota(I32, (batch, heads), 1)
  return fmix32(fmix32(as_seed(seed) ^ (b * I32(C_BATCH))) ^ (h * I32(C_HEAD)))


def keep_threshold(rate: float) -> int:
  """Keep iff the hash's top 24 bits < this."""
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
  return int(round((1.0 - rate) * (1 << KEEP_BITS)))


def keep(key, q_idx, kv_idx, rate: float):
  """bool keep mask from a head key and query / key indices that broadcast against each other
  (e.g. a [bq, 1] column and a [1, bk] row, or a [bq] vector's [:, None] and [None, :])."""
  row = fmix32(key ^ (q_idx.astype(I32) * I32(C_QUERY)))
  bits = fmix32(row ^ (kv_idx.astype(I32) * I32(C_KEY)))
  return lax.shift_right_logical(bits, I32(32 - KEEP_BITS)) < keep_threshold(rate)


def keep_mask(seed, batch: int, heads: int, q_len: int, kv_len: int, rate: float):
  """bool [batch, heads, q_len, kv_len]: the keep mask of every kernel for this seed."""
  keys = head_keys(seed, batch, heads)[:, :, None, None]
  q_idx = lax.broadcasted_iota(I32, (q_len, 1), 0)
  kv_idx = lax.broadcasted_iota(I32, (1, kv_len), 1)
  return keep(keys, q_idx, kv_idx, rate)
