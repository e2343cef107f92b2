"""The KV cache of an attention block while decoding (config.decode=True): functions the block
calls with itself as the owner of the 'cache' variables, so the variables sit where the block's
parameters do and the block's own code reads as attention.

Per attention block the 'cache' collection holds the keys and values written so far
([B, S, K, E]: GQA shrinks it), each slot's absolute position (-1 = empty or padding) and a write
counter. Self-attention attends to [cache ; new tokens] and then writes the new tokens; with a
sliding window the cache is a ring buffer of `window` slots. Cross-attention caches the projected
encoder keys/values on its first (prefill) call; later calls pass no encoder output and reuse them.
Masks over cached keys come from absolute positions (`q_positions` / `kv_positions` of
tfjax.nn.ops.dot_product_attention), not from the keys' order in the cache. `step` is softmax
attention's cache hook (tfjax/nn/softmax_attention.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn.masks import Visibility


def step(owner: nn.Module, k_new_BxTxKxE, v_new_BxTxKxE, positions_BxT, visibility: Visibility,
         *, cross: bool):
  """(keys, values, visibility) to attend with in one decoding call: softmax attention's `cache`
  hook (tfjax/nn/attention_kinds.py). Under `init` it creates the empty cache and attends to the
  new tokens alone."""
  if owner.is_initializing():
    init(owner, k_new_BxTxKxE, cross=cross, window=visibility.window,
         dtype=owner.config.compute_dtype)
    return k_new_BxTxKxE, v_new_BxTxKxE, visibility
  if cross:
    return cross_attention(owner, k_new_BxTxKxE, v_new_BxTxKxE, visibility)
  return self_attention(owner, k_new_BxTxKxE, v_new_BxTxKxE, positions_BxT, visibility)


def init(owner: nn.Module, k_BxSxKxE, *, cross: bool, window, dtype) -> None:
  """Creates the empty cache under `init`, sized by a dummy input as long as the longest sequence
  to decode (self-attention: at most `window` slots; cross-attention: the encoder length)."""
  batch, length, kv_heads, head_dim = k_BxSxKxE.shape
  size = length if cross or window is None else min(length, window)
  shape = (batch, size, kv_heads, head_dim)
  owner.variable("cache", "cached_key", jnp.zeros, shape, dtype)
  owner.variable("cache", "cached_value", jnp.zeros, shape, dtype)
  owner.variable("cache", "positions", lambda: jnp.full((batch, size), -1, jnp.int32))
  owner.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))


def _variables(owner: nn.Module):
  if not owner.has_variable("cache", "cached_key"):
    raise ValueError("decode=True needs a cache: build it with "
                     "tfjax.inference.cached_model.init_cache first")
  return (owner.variable("cache", "cached_key"), owner.variable("cache", "cached_value"),
          owner.variable("cache", "positions"), owner.variable("cache", "index"))


def cross_attention(owner: nn.Module, k_new_BxSxKxE, v_new_BxSxKxE, visibility: Visibility):
  """(keys, values, visibility) of cross-attention: the encoder's keys/values, stored on the
  prefill call (k_new given) and read back on every later one (k_new None)."""
  key, value, slot_pos, _ = _variables(owner)
  if k_new_BxSxKxE is not None:  # prefill: project the encoder output once
    if k_new_BxSxKxE.shape != key.value.shape:
      raise ValueError(
          f"encoder output gives cross-attention keys {k_new_BxSxKxE.shape} but the cache was "
          f"built for {key.value.shape}; init the cache with the same encoder length")
    key.value = k_new_BxSxKxE.astype(key.value.dtype)
    value.value = v_new_BxSxKxE.astype(value.value.dtype)
    kv_segment_ids_BxS = visibility.kv_segment_ids_BxS
    slot_pos.value = (jnp.where(kv_segment_ids_BxS != 0, 1, -1)
                      if kv_segment_ids_BxS is not None else jnp.ones_like(slot_pos.value))
  visibility = visibility.replace(kv_segment_ids_BxS=(slot_pos.value >= 0).astype(jnp.int32),
                                  q_segment_ids_BxT=None)
  return key.value, value.value, visibility


def self_attention(owner: nn.Module, k_new_BxTxKxE, v_new_BxTxKxE, positions_BxT,
                   visibility: Visibility):
  """(keys, values, visibility) of causal self-attention over [cache ; new tokens], with the new
  tokens written into the cache (pads get position -1)."""
  key, value, slot_pos, index = _variables(owner)
  q_len = k_new_BxTxKxE.shape[1]
  new_pos_BxT = positions_BxT
  if visibility.q_segment_ids_BxT is not None:
    new_pos_BxT = jnp.where(visibility.q_segment_ids_BxT != 0, positions_BxT, -1)
  if q_len == 1:
    return _write_then_attend(key, value, slot_pos, index, k_new_BxTxKxE, v_new_BxTxKxE,
                              positions_BxT, new_pos_BxT, visibility)
  keys_BxSxKxE = jnp.concatenate([key.value, k_new_BxTxKxE.astype(key.value.dtype)], axis=1)
  values_BxSxKxE = jnp.concatenate([value.value, v_new_BxTxKxE.astype(value.value.dtype)], axis=1)
  attend_visibility = _attend_by_position(visibility, positions_BxT,
                                          jnp.concatenate([slot_pos.value, new_pos_BxT], axis=1))
  size = key.value.shape[1]
  if q_len > size and visibility.window is None:
    raise ValueError(f"{q_len} new tokens do not fit in a KV cache of {size} slots")
  # Ring-buffer write of the last min(q_len, size) new tokens (a plain append without window).
  keep = min(q_len, size)
  slots = (index.value + (q_len - keep) + jnp.arange(keep)) % size
  key.value = key.value.at[:, slots].set(k_new_BxTxKxE[:, q_len - keep:].astype(key.value.dtype))
  value.value = value.value.at[:, slots].set(
      v_new_BxTxKxE[:, q_len - keep:].astype(value.value.dtype))
  slot_pos.value = slot_pos.value.at[:, slots].set(new_pos_BxT[:, q_len - keep:])
  index.value = index.value + q_len
  return keys_BxSxKxE, values_BxSxKxE, attend_visibility


def _write_then_attend(key, value, slot_pos, index, k_new_Bx1xKxE, v_new_Bx1xKxE, positions_Bx1,
                       new_pos_Bx1, visibility: Visibility):
  """One-token step: write first, then attend over the cache alone.

  Same result as attending to [cache ; new] and then writing: the slot it overwrites is empty,
  or (ring buffer of `window` slots) holds the key `window` positions back, which the window
  already hides. But it updates the cache in place, where concatenating copies every layer's
  whole cache on every step (the per-token cost then grows with the cache length).
  """
  slot = index.value % key.value.shape[1]
  key.value = jax.lax.dynamic_update_slice_in_dim(
      key.value, k_new_Bx1xKxE.astype(key.value.dtype), slot, axis=1)
  value.value = jax.lax.dynamic_update_slice_in_dim(
      value.value, v_new_Bx1xKxE.astype(value.value.dtype), slot, axis=1)
  slot_pos.value = jax.lax.dynamic_update_slice_in_dim(slot_pos.value, new_pos_Bx1, slot, axis=1)
  index.value = index.value + 1
  return key.value, value.value, _attend_by_position(visibility, positions_Bx1, slot_pos.value)


def _attend_by_position(visibility: Visibility, q_positions_BxT, kv_positions_BxS) -> Visibility:
  """The visibility of cached keys: masks come from absolute positions (-1 = empty slot or
  padding, hidden through a segment id of 0) instead of from the keys' order in the cache."""
  return visibility.replace(q_positions_BxT=q_positions_BxT, kv_positions_BxS=kv_positions_BxS,
                            q_segment_ids_BxT=None,
                            kv_segment_ids_BxS=(kv_positions_BxS >= 0).astype(jnp.int32))
