"""Block-level attention rules shared by the Pallas kernels (Triton GPU: flash_attention.py,
Mosaic TPU: flash_attention_tpu.py).

What lives here, written once for both:
  * which key blocks a query block can see and which of those are fully visible
    (`kv_block_range`), and the converse for the backward's key-block programs (`q_block_range`):
    the causal rule and the sliding window of tfjax/nn/masks.py turned into block bounds;
  * the in-tile mask and ALiBi bias (`mask_and_bias`), from the relative positions i - j,
    segment ids (the single "equal and nonzero" rule of _common.kernel_segment_ids) and the slope;
  * `BlockConfig`, the static facts both kernels specialise on, and the logit soft-cap
    (`soft_cap`, `soft_cap_grad`: Gemma 2's cap * tanh(s / cap) on the scaled scores, before the
    ALiBi bias and the masks, as tfjax.nn.ops' xla reference applies it).

What cannot be shared, and why:
  * Building the relative-position tile. Triton lowers 1-D `arange` and broadcasts it; Mosaic
    works on 2-D vregs and wants `broadcasted_iota` over the whole (block_q, block_k) tile
    (1-D vectors have no native TPU layout). Each kernel builds `rel` its own way and passes it in.
  * Loop structure and memory. The Triton kernels hold one head's whole K/V (or Q) sequence in a
    ref and loop over blocks with `fori_loop` inside one program; the Mosaic kernels make the kv
    (or q) loop a sequential ("arbitrary") grid axis, so that Pallas double-buffers each block
    from HBM into VMEM, keep the running max / sum / accumulator in VMEM scratch across it, and
    skip hidden blocks with `pl.when` plus index_map clamping (a repeated block index is not
    re-fetched). The bounds those loops use are the shared ones here.
  * Layout and tiles. Triton wants power-of-two tiles and keeps the [B, L, heads, D] layout;
    Mosaic wants (8, 128)-aligned tiles with the sequence and head_dim as the two minor axes
    ([B, heads, L, D]) and head_dim padded to a multiple of 128.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from tfjax.nn import masks

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """Static facts of one attention call that the block rules depend on."""
  scale: float
  causal: bool  # True also when a window is set: the window is causal.
  window: Optional[int]
  offset: int  # kv_len - q_len: query t sits at position t + offset (end-aligned), key s at s.
  groups: int  # query heads per kv head
  has_segments: bool
  has_alibi: bool
  dropout_rate: float = 0.0  # on the weights; mask from tfjax/nn/dropout_hash.py
  # The first query's index in the dropout hash: 0, or a query chunk's place in its sequence
  # (a context-parallel chunk, tfjax/nn/sharded_attention.py), so the mask is the sequence's.
  dropout_q_offset: int = 0
  softcap: Optional[float] = None  # scores -> softcap * tanh(scores / softcap) before the bias


def soft_cap(cfg: BlockConfig, s):
  """(softcap * tanh(s / softcap), tanh(s / softcap)) of the scaled scores s; (s, None) without
  a cap. The backward keeps the tanh: d cap(s) / ds = 1 - tanh^2 (`soft_cap_grad`)."""
  if cfg.softcap is None:
    return s, None
  tanh = jnp.tanh(s * (1.0 / cfg.softcap))
  return tanh * cfg.softcap, tanh


def soft_cap_grad(ds, tanh):
  """dS through the cap: ds * (1 - tanh^2) (ds itself without a cap). The ALiBi slope's
  gradient reads ds before this: the bias is added after the cap."""
  return ds if tanh is None else ds * (1.0 - tanh * tanh)


def cdiv_nonneg(a, b: int):
  """ceil(max(a, 0) / b) for an int32 scalar `a`; lax.div truncates, so clamp first."""
  return lax.div(jnp.maximum(a, 0) + (b - 1), b)


def _clip_full(lo, hi, full_lo, full_hi, cfg):
  """Clips the fully visible range into [lo, hi); empty when segment ids can hide any pair."""
  if cfg.has_segments:
    return lo, hi, lo, lo
  full_lo = jnp.clip(full_lo, lo, hi)
  full_hi = jnp.clip(full_hi, full_lo, hi)
  return lo, hi, full_lo, full_hi


def kv_block_range(cfg: BlockConfig, q_block, block_q: int, block_k: int, num_kv_blocks: int):
  """(lo, hi, full_lo, full_hi): the key blocks [lo, hi) that query block `q_block` can see, and
  the sub-range [full_lo, full_hi) whose tiles are fully visible (no mask needed)."""
  if not cfg.causal:
    return _clip_full(0, num_kv_blocks, 0, num_kv_blocks, cfg)
  first_q_pos = q_block * block_q + cfg.offset
  # Keys at positions <= the block's last query position: first_q_pos + block_q of them.
  hi = jnp.minimum(cdiv_nonneg(first_q_pos + block_q, block_k), num_kv_blocks)
  # Fully visible: every key at or before the first query ...
  full_hi = lax.div(jnp.maximum(first_q_pos + 1, 0), block_k)
  lo = full_lo = 0
  if cfg.window is not None:  # ... and after the window start of the last query.
    lo = lax.div(jnp.maximum(first_q_pos - cfg.window + 1, 0), block_k)
    full_lo = cdiv_nonneg(first_q_pos + block_q - cfg.window, block_k)
  return _clip_full(lo, hi, full_lo, full_hi, cfg)


def q_block_range(cfg: BlockConfig, kv_block, block_q: int, block_k: int, num_q_blocks: int):
  """(lo, hi, full_lo, full_hi): the query blocks [lo, hi) that can see key block `kv_block`,
  and the sub-range [full_lo, full_hi) that sees all of it."""
  if not cfg.causal:
    return _clip_full(0, num_q_blocks, 0, num_q_blocks, cfg)
  first_kv_pos = kv_block * block_k
  last_kv_pos = first_kv_pos + block_k - 1
  # Rows t with t + offset >= the first key's position; fully visible from the last key's.
  lo = lax.div(jnp.maximum(first_kv_pos - cfg.offset, 0), block_q)
  full_lo = cdiv_nonneg(last_kv_pos - cfg.offset, block_q)
  hi = full_hi = num_q_blocks
  if cfg.window is not None:  # Rows whose window still reaches the last / the first key.
    hi = jnp.minimum(cdiv_nonneg(last_kv_pos + cfg.window - cfg.offset, block_q), num_q_blocks)
    full_hi = cdiv_nonneg(first_kv_pos + cfg.window - block_q + 1 - cfg.offset, block_q)
  return _clip_full(lo, hi, full_lo, full_hi, cfg)


def needs_relative_positions(cfg: BlockConfig, masked: bool) -> bool:
  """Whether `mask_and_bias` reads the relative-position tile."""
  return (cfg.causal and masked) or cfg.has_alibi


def mask_and_bias(cfg: BlockConfig, s, rel, q_ids_col, kv_ids_row, slope, masked: bool):
  """Adds ALiBi and (if `masked`: the tile is not known to be fully visible) applies every mask
  to the fp32 logits tile s [bq, bk].

  rel: int32 [bq, bk] query position - key position (i - j), or None when
    `needs_relative_positions` is False. q_ids_col [bq, 1], kv_ids_row [1, bk]: segment ids (when
    cfg.has_segments). slope: the ALiBi slope of this (batch, head) (when cfg.has_alibi).
  Returns (s, -|i - j| as fp32, the ALiBi gradient factor, or None).
  """
  neg_dist = None
  if cfg.has_alibi:
    neg_dist = -jnp.abs(rel).astype(F32)
    s = s + slope * neg_dist
  if not masked:
    return s, neg_dist
  mask = None
  if cfg.causal:
    mask = rel >= 0
    if cfg.window is not None:
      mask = mask & (rel < cfg.window)
  if cfg.has_segments:
    same = (q_ids_col == kv_ids_row) & (kv_ids_row != 0)
    mask = same if mask is None else mask & same
  if mask is not None:
    s = jnp.where(mask, s, masks.MASK_VALUE)
  return s, neg_dist


def dropout_weights(cfg: BlockConfig, p, keep):
  """The dropped, rescaled weights p * keep / (1 - rate) of a tile (p itself without dropout)."""
  if not cfg.dropout_rate:
    return p
  return jnp.where(keep, p * (1.0 / (1.0 - cfg.dropout_rate)), 0.0)


def flash_with_vjp(forward, backward):
  """The FlashAttention-2 custom VJP both kernels use: `forward(cfg, q, k, v, q_ids, kv_ids,
  slopes, dropout_keys) -> (out, lse)` saves the log-sum-exp, and `backward(cfg, q, k, v, q_ids,
  kv_ids, slopes, dropout_keys, out, lse, d_out) -> (dq, dk, dv, d_slopes)` recomputes the
  probabilities (and the dropout mask, from the same hash) from it. The result is
  `f(cfg, q, k, v, slopes_BxH, (q_ids, kv_ids, dropout_keys_BxH)) -> out`, differentiable in q,
  k, v and the slopes.

  With dropout (keep mask D, O = (P * D / (1 - rate)) V) the FlashAttention-2 backward keeps its
  form: dV = Pd^T dO with Pd the dropped weights, dS = P * (dO V^T * D / (1 - rate) - delta), and
  delta = rowsum(dO * O) still equals rowsum(P * dP) because O is the dropped output.
  """

  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def flash(cfg, q, k, v, slopes_BxH, int_inputs):
    *segment_ids, dropout_keys = int_inputs
    return forward(cfg, q, k, v, *segment_ids, slopes_BxH, dropout_keys)[0]

  def flash_fwd(cfg, q, k, v, slopes_BxH, int_inputs):
    *segment_ids, dropout_keys = int_inputs
    out, lse = forward(cfg, q, k, v, *segment_ids, slopes_BxH, dropout_keys)
    return out, (q, k, v, slopes_BxH, int_inputs, out, lse)

  def flash_bwd(cfg, residuals, d_out):
    q, k, v, slopes_BxH, int_inputs, out, lse = residuals
    *segment_ids, dropout_keys = int_inputs
    dq, dk, dv, d_slopes = backward(cfg, q, k, v, *segment_ids, slopes_BxH, dropout_keys, out,
                                    lse, d_out)
    return dq, dk, dv, d_slopes, None  # No cotangent for integer ids and dropout keys.

  flash.defvjp(flash_fwd, flash_bwd)
  return flash
