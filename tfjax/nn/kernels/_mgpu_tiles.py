"""The tile rules of the Mosaic GPU attention kernels (flash_attention_mgpu.py) in registers:
the causal / window / segment-id masks, the ALiBi bias and the dropout keep mask, with the
semantics of the Triton kernels (_blocks.mask_and_bias, tfjax/nn/dropout_hash.py), built from
positions and ids in the wgmma register layouts (or as plain arrays in Mosaic GPU's
interpreter). Logits here are in base 2 (scale * log2(e) folded in), as the kernels keep them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfjax.nn import dropout_hash


def check_tiling(block_q: int, block_kv: int, stages: int) -> None:
  """The constraints every Mosaic GPU attention tiling (forward and backward) shares."""
  if block_q % 64 or block_kv % 64:
    raise ValueError(f"Mosaic GPU tiles are multiples of 64 (a wgmma M / the 128-byte swizzle);"
                     f" got block_q={block_q}, block_kv={block_kv}")
  if stages < 2:
    raise ValueError(f"stages={stages}: the shared-memory ring needs at least 2 slots to overlap "
                     "copies with math")

F32 = jnp.float32
LOG2_E = math.log2(math.e)
# Logit of a masked key: finite, so exp2(MASK - m) underflows to an exact 0 without inf - inf.
MASK_LOGIT = -0.7 * float(jnp.finfo(F32).max)


def base2_logits(acc, scale: float, softcap):
  """(logits, tanh): the wgmma product Q K^T (or K Q^T) as base-2 logits acc * scale * log2(e),
  or with a softcap c * tanh(acc * scale / c) * log2(e) (the cap on the natural-unit scores, as
  'xla' has it) and that tanh, which the backward's 1 - tanh^2 reads (None without a cap)."""
  if softcap is None:
    return acc * (scale * LOG2_E), None
  tanh = jnp.tanh(acc * (scale / softcap))
  return tanh * (softcap * LOG2_E), tanh


class Registers:
  """Register arrays of the compiled kernel in their wgmma layouts, or the plain arrays of the
  interpreter (which has no layout casts and no plgpu.load). A vector's `dim` is the tile axis it
  runs along: 0 for a row's value (the layout of a reduction over keys), 1 for a key's."""

  def __init__(self, interpret):
    import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
    self.plgpu, self.interpret = plgpu, interpret is not None

  def cast(self, x, layout):
    return x if self.interpret else self.plgpu.layout_cast(x, layout)

  def tile_iota(self, shape, dim):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dim)
    return self.plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.plgpu.Layout.WGMMA)

  def vec_iota(self, n, dim):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, (n,), 0)
    return self.plgpu.broadcasted_iota(jnp.int32, (n,), 0,
                                       layout=self.plgpu.Layout.WGMMA.reduce(1 - dim))

  def load_vec(self, ref, idx, dim):
    if self.interpret:
      return ref[idx]
    return self.plgpu.load(ref, idx, layout=self.plgpu.Layout.WGMMA.reduce(1 - dim),
                           optimized=False)


class RowState(NamedTuple):
  """What a consumer's rows carry through the kv loop (None where the call has no such rule)."""
  q_ids: Any  # [bq] segment ids
  slope: Any  # the head's ALiBi slope in the logits' base-2 units
  hash: Any  # [bq] dropout_hash's per-row half: fmix32(key ^ q * C_QUERY)


def row_state(cfg, refs, regs: Registers, row_start, block_q: int) -> RowState:
  """The state of rows [row_start, row_start + block_q) of the program's (batch, head), read once
  before the kv loop. cfg: a _blocks.BlockConfig; refs: the kernel's operands by name (q_ids,
  kv_ids [B, L] int32, slopes [B, H] fp32, keys [B, H] int32 of dropout_hash.head_keys)."""
  batch, head = lax.axis_index("batch"), lax.axis_index("head")
  q_ids = slope = row_hash = None
  if cfg.has_segments:
    q_ids = regs.load_vec(refs.q_ids, (batch, pl.ds(row_start, block_q)), 0)
  if cfg.has_alibi:
    slope = refs.slopes[batch, head] * LOG2_E
  if cfg.dropout_rate:  # dropout_hash.keep's row hash, once for every key block
    q_idx = regs.vec_iota(block_q, 0) + row_start
    row_hash = dropout_hash.fmix32(
        refs.keys[batch, head] ^ (q_idx * dropout_hash.I32(dropout_hash.C_QUERY)))
  return RowState(q_ids, slope, row_hash)


def mask_bias_dropout(cfg, refs, regs: Registers, rows: RowState, s_BqxBk, *, kv_block,
                      row_start, masked: bool):
  """The tile rules of the Triton forward on base-2 logits s [bq, bk]: the ALiBi bias (every
  step), the causal / window / segment masks (steps not known fully visible), and the dropout
  keep mask (every step; None without dropout), from positions and ids in registers.

  Causal ALiBi adds slope x (j - a), a the rows' first position, as the Triton forward does: a
  per-key vector instead of the [bq, bk] distance tile, since a row's softmax is unchanged by a
  constant; its lse then exceeds the true one by slope x (i - a), taken off at the end. Dropout
  finishes dropout_hash.keep from the per-row half in `rows` with one fmix32 per weight."""
  batch = lax.axis_index("batch")
  shape, block_kv = s_BqxBk.shape, s_BqxBk.shape[1]
  kv_start = kv_block * block_kv
  need_rel = (masked and cfg.causal) or (cfg.has_alibi and not cfg.causal)
  if need_rel or cfg.has_alibi or cfg.dropout_rate:
    kv_idx_Bk = regs.vec_iota(block_kv, 1) + kv_start
  if need_rel:  # i - j, end-aligned
    rel = (regs.tile_iota(shape, 0) + (row_start + cfg.offset)
           - lax.broadcast_in_dim(kv_idx_Bk, shape, [1]))
  if cfg.has_alibi and cfg.causal:
    key_minus_anchor_Bk = (kv_idx_Bk - (row_start + cfg.offset)).astype(F32)
    s_BqxBk = s_BqxBk + lax.broadcast_in_dim(rows.slope * key_minus_anchor_Bk, shape, [1])
  elif cfg.has_alibi:  # -slope |i - j|
    s_BqxBk = s_BqxBk - rows.slope * jnp.abs(rel).astype(F32)
  if masked:
    visible = None
    if cfg.causal:
      visible = rel >= 0
      if cfg.window is not None:
        visible = visible & (rel < cfg.window)
    if cfg.has_segments:
      kv_ids_Bk = regs.load_vec(refs.kv_ids, (batch, pl.ds(kv_start, block_kv)), 1)
      kv_ids_BqxBk = lax.broadcast_in_dim(kv_ids_Bk, shape, [1])
      same = (lax.broadcast_in_dim(rows.q_ids, shape, [0]) == kv_ids_BqxBk) & (
          kv_ids_BqxBk != 0)
      visible = same if visible is None else visible & same
    if visible is not None:
      s_BqxBk = jnp.where(visible, s_BqxBk, MASK_LOGIT)
  keep = None
  if cfg.dropout_rate:
    col_Bk = kv_idx_Bk * dropout_hash.I32(dropout_hash.C_KEY)
    bits = dropout_hash.fmix32(lax.broadcast_in_dim(rows.hash, shape, [0])
                               ^ lax.broadcast_in_dim(col_Bk, shape, [1]))
    keep = (lax.shift_right_logical(bits, dropout_hash.I32(32 - dropout_hash.KEEP_BITS))
            < dropout_hash.keep_threshold(cfg.dropout_rate))
  return s_BqxBk, keep
