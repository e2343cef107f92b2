"""T5's bucketed relative position bias (Raffel et al. 2020, section 2.1), model.position='t5_bias'.

Each head adds a learned scalar to the score of query i and key j, looked up by the bucket of the
offset j - i: offsets below half the buckets map to their own bucket, larger ones share
logarithmically wider buckets up to `max_distance`, beyond which all share the last. In the
encoder (bidirectional) half the buckets are for keys after the query; in decoder self-attention
(causal) all buckets are for keys at or before it. One table [num_buckets, heads] per layer stack,
shared by all its layers (the kind's `stack_table` hook, tfjax/nn/positions.py); cross-attention
has none. Shape letters as in tfjax/nn/axes.py (U: buckets). The bias is computed from absolute
positions, so the KV-cache decoder gets it for cached keys exactly as the full forward.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.masks import LogitsBias, Visibility

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


def relative_position_bucket(relative_position, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
  """Bucket (int32, same shape) of each offset key_position - query_position."""
  relative_position = jnp.asarray(relative_position, jnp.int32)
  bucket = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    bucket = jnp.where(relative_position > 0, num_buckets, 0)
    distance = jnp.abs(relative_position)
  else:
    distance = jnp.maximum(-relative_position, 0)  # keys after the query all share bucket 0
  max_exact = num_buckets // 2
  log_ratio = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
               / math.log(max_distance / max_exact))
  far = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  far = jnp.minimum(far, num_buckets - 1)
  return bucket + jnp.where(distance < max_exact, distance, far)


def t5_bias(table_UxH, q_positions_BxT, kv_positions_BxS, *, bidirectional: bool,
            max_distance: int) -> jax.Array:
  """The additive attention bias [B, H, T, S] from the table and absolute positions."""
  relative_BxTxS = kv_positions_BxS[:, None, :] - q_positions_BxT[:, :, None]
  buckets_BxTxS = relative_position_bucket(
      relative_BxTxS, bidirectional=bidirectional, num_buckets=table_UxH.shape[0],
      max_distance=max_distance)
  bias_BxTxSxH = jnp.take(table_UxH.astype(jnp.float32), buckets_BxTxS, axis=0)
  return jnp.transpose(bias_BxTxSxH, (0, 3, 1, 2))


class RelativePositionTable(nn.Module):
  """The learned [num_buckets, heads] table of one layer stack (returned as is)."""
  config: ModelConfig

  @nn.compact
  def __call__(self):
    cfg = self.config
    return self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), (None, axes.HEADS)),
        (cfg.positions.relative_buckets, cfg.attention.num_heads))


def t5_stack_table(cfg: ModelConfig) -> nn.Module:
  """The `stack_table` hook: the stack's table, named 'relative_bias' in the parameter tree."""
  return RelativePositionTable(cfg, name="relative_bias")


def t5_logits_bias(cfg: ModelConfig, table_UxH, visibility: Visibility, q_len: int,
                   kv_len: int) -> LogitsBias:
  """The `logits_bias` hook: the dense bias at the queries' and keys' absolute positions
  (bidirectional unless causal)."""
  q_positions_BxT, kv_positions_BxS = visibility.positions(q_len, kv_len)
  return LogitsBias(bias_BxHxTxS=t5_bias(
      table_UxH, q_positions_BxT, kv_positions_BxS, bidirectional=not visibility.causal,
      max_distance=cfg.positions.relative_max_distance))
