"""Counter-based randomness for datasets, and BERT masking drawn from it.

`hash_bits(*keys)` is a pure function of integer keys (splitmix64), vectorized with NumPy
broadcasting: a dataset draws row r of batch i from hash_bits(seed, stream, i, r), so any process
builds any row without sharing state (the multi-host contract of tfjax.data.datasets).
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def _u64(key) -> np.ndarray:
  if isinstance(key, (int, np.integer)):
    return np.uint64(int(key) & _MASK64)
  return np.asarray(key).astype(np.uint64)


def hash_bits(*keys) -> np.ndarray:
  """64 random bits, a pure function of the integer keys (broadcast together), via splitmix64."""
  h = np.uint64(0)
  with np.errstate(over="ignore"):
    for k in keys:
      z = (h ^ _u64(k)) + np.uint64(0x9E3779B97F4A7C15)
      z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
      z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
      h = z ^ (z >> np.uint64(31))
  return h


def _uniform(bits) -> np.ndarray:
  return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _randint(bits, n: int) -> np.ndarray:
  # Modulo bias is < n / 2**64: negligible for any corpus size.
  return (bits % np.uint64(n)).astype(np.int64)


def mask_tokens(inputs, seed, vocab_size: int, mask_id: int, maskable=None, prob: float = 0.15,
                *, rows=None):
  """BERT masking -> (masked_inputs, targets, weights), all [B, L].

  Each position with `maskable` True (default: all; pass False for padding / special tokens) is
  selected with probability `prob`; a selected token becomes `mask_id` 80% of the time, a uniform
  random id in [0, vocab_size) 10%, and stays 10%. targets = the original inputs, weights = 1.0
  exactly at selected positions. The randomness at (b, t) is a pure function of
  (*seed, rows[b], t): `seed` is a tuple of ints and `rows` the global row numbers (default
  0..B-1), so a process holding a slice of the batch masks its rows as the full batch would.
  """
  inputs = np.asarray(inputs, np.int32)
  num_rows, length = inputs.shape
  rows = np.arange(num_rows) if rows is None else np.asarray(rows)
  base = hash_bits(*seed, rows[:, None], np.arange(length)[None, :])
  selected = _uniform(hash_bits(base, 0)) < prob
  if maskable is not None:
    selected &= np.asarray(maskable, bool)
  kind = _uniform(hash_bits(base, 1))
  random_ids = _randint(hash_bits(base, 2), vocab_size)
  masked = np.where(selected & (kind < 0.8), mask_id,
                    np.where(selected & (kind < 0.9), random_ids, inputs)).astype(np.int32)
  return masked, inputs.copy(), selected.astype(np.float32)
