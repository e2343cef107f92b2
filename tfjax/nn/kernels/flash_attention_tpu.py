"""FlashAttention-2 as Mosaic TPU Pallas kernels (interpreted on CPU through TPU interpret mode).

Three kernels, the same math as the Triton ones (tfjax/nn/kernels/flash_attention.py), with the
block loop made a grid axis so that Pallas pipelines each block from HBM into VMEM:
  forward  grid (batch, head, q block, kv block). The kv axis is "arbitrary" (sequential): the
           output block and the VMEM scratch for the running max m, sum l and fp32 accumulator
           stay resident while it runs; the last kv step writes the output and the per-row
           log-sum-exp (lse) that the backward reuses.
  dK/dV    grid (batch, kv head, kv block, group member, q block): the (group, q block) axes are
           "arbitrary", so one kv head's dK/dV accumulate in VMEM over every query head that reads
           it (GQA/MQA without repeating K/V and without fp32 per-query-head partials):
           p = exp(s - lse), dV += p^T dO, dS = p * (dO V^T - delta), dK += scale * dS^T Q.
  dQ       grid (batch, head, q block, kv block) like the forward: dQ += scale * dS K, and the
           ALiBi slope gradient sum(dS * -|i - j|) per row.
Logit softcap: every kernel caps the scaled scores, c tanh(s / c), before the ALiBi bias and the
masks; the backward recomputes the tanh and multiplies dS by 1 - tanh^2 (_blocks.soft_cap).
Block skipping: the blocks the causal rule / sliding window hide are neither computed (`pl.when`
on the block's visibility) nor fetched (the index_maps clamp the sequential axis into the visible
block range, and Pallas does not re-copy a block whose index did not change). Tiles known to be
fully visible skip the mask. The block bounds and the tile mask/ALiBi rule are shared with the
Triton kernels (tfjax/nn/kernels/_blocks.py, which also says what cannot be shared).

Layout: [B, L, heads, D] inputs are transposed to [B, heads, L, D] so that each block's two minor
axes are (sequence, head_dim), padded to the block sizes and head_dim to a multiple of 128 (the
(8, 128) vreg tiling; zero columns change no dot product). Per-row vectors (lse, delta, the
running m / l, query segment ids) are [.., L, 1] columns and key segment ids a [.., 1, L] row, so
that they broadcast against the (block_q, block_k) logits tile without relayouts. ALiBi slopes
and dropout keys (tfjax/nn/dropout_hash.py) are [B, heads] tables in SMEM (scalar reads); each
kernel rebuilds a tile's dropout mask from its row and column indices.

Block sizes: tfjax/nn/kernels/tpu_tilings.py (TPU_TILINGS, by TPU generation, and the VMEM
estimate they are chosen against); its names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tfjax.nn import dropout_hash, masks
from tfjax.nn.kernels import _blocks, _common
from tfjax.nn.kernels.tpu_tilings import (  # pylint: disable=unused-import
    LANES, MAX_HEAD_DIM, TPU_TILINGS, VMEM_LIMIT_BYTES, TpuTiling, TpuTilings, compiling_for,
    default_tilings, padded_head_dim, tpu_generation, vmem_bytes)

F32 = jnp.float32
SUPPORTED_DTYPES = ("float32", "bfloat16")



@dataclasses.dataclass(frozen=True)
class _Config(_blocks.BlockConfig):
  """Everything static about one call; the kernels specialise on it."""
  forward: TpuTiling = None
  backward: TpuTiling = None
  interpret: bool = False


def _dot(a, b, contract=(1, 0)):
  """2-D matmul accumulating in fp32; contract=(1, 1) is a @ b.T, (0, 0) is a.T @ b."""
  return lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                         preferred_element_type=F32)


def _logits(cfg, q, k, q_start, kv_start, q_ids, kv_ids, slope, masked):
  """Scaled, capped, biased, masked fp32 logits tile, -|i - j| (or None) and the softcap's tanh
  (or None; _blocks.soft_cap); i - j from a 2-D iota."""
  s, tanh = _blocks.soft_cap(cfg, _dot(q, k, (1, 1)) * cfg.scale)
  rel = None
  if _blocks.needs_relative_positions(cfg, masked):
    shape = s.shape
    rel = ((q_start + cfg.offset - kv_start) + lax.broadcasted_iota(jnp.int32, shape, 0)
           - lax.broadcasted_iota(jnp.int32, shape, 1))
  return (*_blocks.mask_and_bias(cfg, s, rel, q_ids, kv_ids, slope, masked), tanh)


def _when_visible(cfg, block, bounds, compute):
  """Runs compute(masked) if `block` lies in the visible [lo, hi), with the mask unless the block
  is in the fully visible [full_lo, full_hi); hidden blocks run nothing."""
  lo, hi, full_lo, full_hi = bounds
  visible = (block >= lo) & (block < hi)
  if cfg.has_segments:  # Segment ids (and padded keys) can hide any pair: mask every tile.
    pl.when(visible)(lambda: compute(True))
    return
  if not cfg.causal:
    pl.when(visible)(lambda: compute(False))
    return
  full = (block >= full_lo) & (block < full_hi)
  pl.when(visible & full)(lambda: compute(False))
  pl.when(visible & jnp.logical_not(full))(lambda: compute(True))


def _clamp(block, bounds):
  """The block index to fetch at sequential step `block`: clamped into the visible range, so a
  hidden step repeats a neighbour's index and Pallas skips its copy."""
  lo, hi = bounds[0], bounds[1]
  return jnp.clip(block, lo, jnp.maximum(hi - 1, lo))


def _split_refs(cfg, refs):
  """(q_ids_ref, kv_ids_ref, slopes_ref, keys_ref, *rest); None for absent optional inputs."""
  refs = list(refs)
  ids = (refs.pop(0), refs.pop(0)) if cfg.has_segments else (None, None)
  slopes = refs.pop(0) if cfg.has_alibi else None
  keys = refs.pop(0) if cfg.dropout_rate else None
  return (*ids, slopes, keys, *refs)


def _keep(cfg, keys_ref, b, h, q_start, kv_start, shape):
  """The tile's dropout keep mask (tfjax/nn/dropout_hash.py), or None without dropout; the row
  and column indices are a [bq, 1] column and a [1, bk] row of 2-D iotas."""
  if not cfg.dropout_rate:
    return None
  rows = q_start + cfg.dropout_q_offset + lax.broadcasted_iota(jnp.int32, (shape[0], 1), 0)
  cols = kv_start + lax.broadcasted_iota(jnp.int32, (1, shape[1]), 1)
  return dropout_hash.keep(keys_ref[b, h], rows, cols, cfg.dropout_rate)


# ---------------------------------------------------------------------------------------------
# Kernels. Refs are the blocks: q/o/dq/do [bq, Dp]; k/v/dk/dv [bk, Dp]; lse/delta/q ids [bq, 1];
# kv ids [1, bk]; slopes the whole [B, heads] table in SMEM.


def _forward_kernel(q_ref, k_ref, v_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slopes_ref, keys_ref, o_ref, lse_ref, *scratch = _split_refs(cfg, refs)
  m_ref, l_ref, acc_ref = scratch
  block_q, block_k = cfg.forward.block_q, cfg.forward.block_k
  b, h, i, j = (pl.program_id(n) for n in range(4))
  num_kv_blocks = pl.num_programs(3)

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, masks.MASK_VALUE, F32)
    l_ref[...] = jnp.zeros(l_ref.shape, F32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

  def compute(masked):
    q_ids = q_ids_ref[...] if cfg.has_segments else None
    kv_ids = kv_ids_ref[...] if cfg.has_segments else None
    slope = slopes_ref[b, h] if cfg.has_alibi else None
    s, _, _ = _logits(cfg, q_ref[...], k_ref[...], i * block_q, j * block_k, q_ids, kv_ids,
                      slope, masked)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    # While a row has met only masked keys m stays MASK_VALUE and p counts them; its first
    # visible key makes alpha exactly 0 and erases that. Rows that never meet one are zeroed below.
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    v = v_ref[...]
    l_ref[...] = l_ref[...] * alpha + p.sum(axis=1, keepdims=True)
    # Dropout: l sums every p, acc only the kept ones; 1 / (1 - rate) is applied to the output.
    keep = _keep(cfg, keys_ref, b, h, i * block_q, j * block_k, s.shape)
    p_kept = p if keep is None else jnp.where(keep, p, 0.0)
    acc_ref[...] = acc_ref[...] * alpha + _dot(p_kept.astype(v.dtype), v)
    m_ref[...] = m_new

  _when_visible(cfg, j, _blocks.kv_block_range(cfg, i, block_q, block_k, num_kv_blocks), compute)

  @pl.when(j == num_kv_blocks - 1)
  def _finish():
    m, l = m_ref[...], l_ref[...]
    seen = m > masks.MASK_VALUE / 2
    kept_l = jnp.where(seen, l, 1.0) * (1.0 - cfg.dropout_rate)
    o_ref[...] = jnp.where(seen, acc_ref[...] / kept_l, 0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(l), jnp.inf)  # exp(s - inf) = 0 in the backward


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slopes_ref, keys_ref, *refs = _split_refs(cfg, refs)
  dk_ref, dv_ref, dk_acc, dv_acc = refs
  block_q, block_k = cfg.backward.block_q, cfg.backward.block_k
  b, kv_head, j, g, i = (pl.program_id(n) for n in range(5))
  num_q_blocks = pl.num_programs(4)

  @pl.when((g == 0) & (i == 0))
  def _init():
    dk_acc[...] = jnp.zeros(dk_acc.shape, F32)
    dv_acc[...] = jnp.zeros(dv_acc.shape, F32)

  def compute(masked):
    q_ids = q_ids_ref[...] if cfg.has_segments else None
    kv_ids = kv_ids_ref[...] if cfg.has_segments else None
    slope = slopes_ref[b, kv_head * cfg.groups + g] if cfg.has_alibi else None
    q, do = q_ref[...], do_ref[...]
    s, _, tanh = _logits(cfg, q, k_ref[...], i * block_q, j * block_k, q_ids, kv_ids, slope,
                         masked)
    p = jnp.exp(s - lse_ref[...])
    keep = _keep(cfg, keys_ref, b, kv_head * cfg.groups + g, i * block_q, j * block_k, s.shape)
    dv_acc[...] += _dot(_blocks.dropout_weights(cfg, p, keep).astype(do.dtype), do, (0, 0))
    dp = _blocks.dropout_weights(cfg, _dot(do, v_ref[...], (1, 1)), keep)
    ds = _blocks.soft_cap_grad(p * (dp - delta_ref[...]), tanh)
    dk_acc[...] += _dot(ds.astype(q.dtype), q, (0, 0))

  _when_visible(cfg, i, _blocks.q_block_range(cfg, j, block_q, block_k, num_q_blocks), compute)

  @pl.when((g == cfg.groups - 1) & (i == num_q_blocks - 1))
  def _finish():
    dk_ref[...] = (dk_acc[...] * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slopes_ref, keys_ref, dq_ref, *rest = _split_refs(cfg, refs)
  d_slope_ref, dq_acc, d_slope_acc = rest if cfg.has_alibi else (None, *rest, None)
  block_q, block_k = cfg.backward.block_q, cfg.backward.block_k
  b, h, i, j = (pl.program_id(n) for n in range(4))
  num_kv_blocks = pl.num_programs(3)

  @pl.when(j == 0)
  def _init():
    dq_acc[...] = jnp.zeros(dq_acc.shape, F32)
    if cfg.has_alibi:
      d_slope_acc[...] = jnp.zeros(d_slope_acc.shape, F32)

  def compute(masked):
    q_ids = q_ids_ref[...] if cfg.has_segments else None
    kv_ids = kv_ids_ref[...] if cfg.has_segments else None
    slope = slopes_ref[b, h] if cfg.has_alibi else None
    k = k_ref[...]
    s, neg_dist, tanh = _logits(cfg, q_ref[...], k, i * block_q, j * block_k, q_ids, kv_ids,
                                slope, masked)
    p = jnp.exp(s - lse_ref[...])
    keep = _keep(cfg, keys_ref, b, h, i * block_q, j * block_k, s.shape)
    ds = p * (_blocks.dropout_weights(cfg, _dot(do_ref[...], v_ref[...], (1, 1)), keep)
              - delta_ref[...])
    dq_acc[...] += _dot(_blocks.soft_cap_grad(ds, tanh).astype(k.dtype), k)
    if cfg.has_alibi:  # d loss / d slope = sum over the tile of dS * -|i - j| (after the cap)
      d_slope_acc[...] += (ds * neg_dist).sum(axis=1, keepdims=True)

  _when_visible(cfg, j, _blocks.kv_block_range(cfg, i, block_q, block_k, num_kv_blocks), compute)

  @pl.when(j == num_kv_blocks - 1)
  def _finish():
    dq_ref[...] = (dq_acc[...] * cfg.scale).astype(dq_ref.dtype)
    if cfg.has_alibi:
      d_slope_ref[...] = d_slope_acc[...]


# ---------------------------------------------------------------------------------------------
# pallas_call wrappers. Arrays: q/o/do [B, H, Tp, Dp]; k/v [B, K, Sp, Dp]; lse/delta [B, H, Tp, 1];
# q ids [B, Tp, 1]; kv ids [B, 1, Sp]; slopes [B, H].


def _call(cfg, kernel, grid, in_specs, out_specs, out_shape, scratch, semantics, name):
  return pl.pallas_call(
      functools.partial(kernel, cfg=cfg), grid=grid, in_specs=in_specs, out_specs=out_specs,
      out_shape=out_shape, scratch_shapes=scratch, name=name,
      interpret=pltpu.InterpretParams() if cfg.interpret else False,
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


def _optional_specs(cfg, q_ids, kv_ids, slopes, keys, block_q, block_k, q_index, kv_index):
  """BlockSpecs and operands for segment ids, ALiBi slopes and dropout keys, when present;
  q_index/kv_index map the grid indices to the (batch, q block) / (batch, kv block) to read."""
  specs, args = [], []
  if cfg.has_segments:
    specs += [pl.BlockSpec((None, block_q, 1), lambda *g: (*q_index(*g), 0)),
              pl.BlockSpec((None, 1, block_k), lambda *g: (kv_index(*g)[0], 0, kv_index(*g)[1]))]
    args += [q_ids, kv_ids]
  if cfg.has_alibi:
    specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
    args.append(slopes)
  if cfg.dropout_rate:  # the [B, H] int32 keys of dropout_hash.head_keys, read as scalars
    specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
    args.append(keys)
  return specs, args


_QUERY_MAJOR = ("parallel", "parallel", "parallel", "arbitrary")


def _forward(cfg, q, k, v, q_ids, kv_ids, slopes, keys):
  batch, heads, q_len, head_dim = q.shape
  kv_len = k.shape[2]
  bq, bk = cfg.forward.block_q, cfg.forward.block_k
  nq, nk = q_len // bq, kv_len // bk
  kv_block = lambda i, j: _clamp(j, _blocks.kv_block_range(cfg, i, bq, bk, nk))
  q_spec = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i, j: (b, h, i, 0))
  kv_spec = pl.BlockSpec((None, None, bk, head_dim),
                         lambda b, h, i, j: (b, lax.div(h, cfg.groups), kv_block(i, j), 0))
  row_spec = pl.BlockSpec((None, None, bq, 1), lambda b, h, i, j: (b, h, i, 0))
  extra_specs, extra_args = _optional_specs(
      cfg, q_ids, kv_ids, slopes, keys, bq, bk, lambda b, h, i, j: (b, i),
      lambda b, h, i, j: (b, kv_block(i, j)))
  scratch = [pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, 1), F32), pltpu.VMEM((bq, head_dim), F32)]
  return _call(
      cfg, _forward_kernel, (batch, heads, nq, nk), [q_spec, kv_spec, kv_spec] + extra_specs,
      [q_spec, row_spec],
      [jax.ShapeDtypeStruct(q.shape, q.dtype),
       jax.ShapeDtypeStruct((batch, heads, q_len, 1), F32)],
      scratch, _QUERY_MAJOR, "tfjax_flash_tpu_forward")(q, k, v, *extra_args)


def _backward(cfg, q, k, v, q_ids, kv_ids, slopes, keys, out, lse, d_out):
  batch, heads, q_len, head_dim = q.shape
  kv_heads, kv_len, groups = k.shape[1], k.shape[2], cfg.groups
  bq, bk = cfg.backward.block_q, cfg.backward.block_k
  nq, nk = q_len // bq, kv_len // bk
  delta = jnp.sum(out.astype(F32) * d_out.astype(F32), axis=-1, keepdims=True)

  # dK/dV: grid (b, kv head, kv block j, group member g, q block i); query head kv_head * G + g.
  q_block = lambda j, i: _clamp(i, _blocks.q_block_range(cfg, j, bq, bk, nq))
  q_spec = pl.BlockSpec((None, None, bq, head_dim),
                        lambda b, kh, j, g, i: (b, kh * groups + g, q_block(j, i), 0))
  row_spec = pl.BlockSpec((None, None, bq, 1),
                          lambda b, kh, j, g, i: (b, kh * groups + g, q_block(j, i), 0))
  kv_spec = pl.BlockSpec((None, None, bk, head_dim), lambda b, kh, j, g, i: (b, kh, j, 0))
  extra_specs, extra_args = _optional_specs(
      cfg, q_ids, kv_ids, slopes, keys, bq, bk, lambda b, kh, j, g, i: (b, q_block(j, i)),
      lambda b, kh, j, g, i: (b, j))
  dk, dv = _call(
      cfg, _dkdv_kernel, (batch, kv_heads, nk, groups, nq),
      [q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec] + extra_specs, [kv_spec, kv_spec],
      [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      [pltpu.VMEM((bk, head_dim), F32), pltpu.VMEM((bk, head_dim), F32)],
      ("parallel", "parallel", "parallel", "arbitrary", "arbitrary"),
      "tfjax_flash_tpu_dkdv")(q, k, v, d_out, lse, delta, *extra_args)

  # dQ: grid (b, head, q block i, kv block j), like the forward.
  kv_block = lambda i, j: _clamp(j, _blocks.kv_block_range(cfg, i, bq, bk, nk))
  q_spec = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i, j: (b, h, i, 0))
  row_spec = pl.BlockSpec((None, None, bq, 1), lambda b, h, i, j: (b, h, i, 0))
  kv_spec = pl.BlockSpec((None, None, bk, head_dim),
                         lambda b, h, i, j: (b, lax.div(h, groups), kv_block(i, j), 0))
  extra_specs, extra_args = _optional_specs(
      cfg, q_ids, kv_ids, slopes, keys, bq, bk, lambda b, h, i, j: (b, i),
      lambda b, h, i, j: (b, kv_block(i, j)))
  out_specs, out_shape = [q_spec], [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  scratch = [pltpu.VMEM((bq, head_dim), F32)]
  if cfg.has_alibi:  # Per-row partial sums of the slope gradient.
    out_specs.append(row_spec)
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, q_len, 1), F32))
    scratch.append(pltpu.VMEM((bq, 1), F32))
  dq, *d_slope_rows = _call(
      cfg, _dq_kernel, (batch, heads, nq, nk),
      [q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec] + extra_specs, out_specs, out_shape,
      scratch, _QUERY_MAJOR, "tfjax_flash_tpu_dq")(q, k, v, d_out, lse, delta, *extra_args)
  d_slopes = d_slope_rows[0].sum((2, 3)) if cfg.has_alibi else None
  return dq, dk, dv, d_slopes


_flash = _blocks.flash_with_vjp(_forward, _backward)


# ---------------------------------------------------------------------------------------------


def _default_interpret() -> bool:
  backend = jax.default_backend()
  if backend == "tpu":
    return False
  if backend == "cpu":
    return True  # TPU interpret mode: simulates Mosaic TPU semantics on CPU (slow; for tests).
  raise ValueError(f"the Mosaic TPU flash-attention kernel runs on TPU (or interpreted on CPU), "
                   f"not on {backend!r}; on GPU implementation='pallas' uses the Triton kernel")


def _check_tiling(tiling: TpuTiling, dtype):
  sublanes = 8 * 4 // jnp.dtype(dtype).itemsize  # 8 rows of fp32, 16 of bf16 per vreg
  if tiling.block_q % sublanes or tiling.block_k % LANES:
    raise ValueError(
        f"TPU flash-attention blocks must respect the ({sublanes}, {LANES}) tiling of "
        f"{jnp.dtype(dtype).name}: block_q a multiple of {sublanes} and block_k of {LANES}; got "
        f"block_q={tiling.block_q}, block_k={tiling.block_k}")


def _clamp_tiling(tiling: TpuTiling, q_len: int, kv_len: int, dtype) -> TpuTiling:
  """Shrinks tiles for short sequences (to the tiling's minimum multiple), then checks them."""
  sublanes = 8 * 4 // jnp.dtype(dtype).itemsize
  tiling = TpuTiling(min(tiling.block_q, _common.round_up(q_len, sublanes)),
                     min(tiling.block_k, _common.round_up(kv_len, LANES)))
  _check_tiling(tiling, dtype)
  return tiling


def flash_attention_tpu(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal=False, q_segment_ids=None,
                        kv_segment_ids=None, window=None, alibi_slopes=None, bias=None,
                        scale=None, q_positions=None, kv_positions=None,
                        tilings: Optional[TpuTilings] = None,
                        interpret: Optional[bool] = None, dropout_rate: float = 0.0,
                        dropout_seed=None, softcap: Optional[float] = None,
                        dropout_q_offset: int = 0):
  """`tfjax.nn.ops.dot_product_attention` semantics as Mosaic TPU kernels (default positions).

  `tilings` overrides the `TPU_TILINGS` row of this TPU generation; `interpret` defaults to True
  on CPU (TPU interpret mode) and False on TPU. `dropout_rate` > 0 drops attention weights with
  the keep mask of tfjax/nn/dropout_hash.py for the int32 `dropout_seed` (as 'xla' does).
  `softcap` (static float; None: off) caps the scaled scores, softcap * tanh(s / softcap), before
  the ALiBi bias and the masks; the backward multiplies dS by 1 - tanh^2.
  `dropout_q_offset` (static int) is the first query's index in the dropout hash (default 0; a
  query chunk of a longer sequence passes its start, tfjax/nn/sharded_attention.py).
  """
  if bias is not None:
    raise _common.unsupported("a dense `bias`", "pallas", "'xla'")
  if q_positions is not None or kv_positions is not None:
    raise _common.unsupported("explicit q_positions/kv_positions", "pallas", "'xla' or 'chunked'")
  dtypes = [jnp.dtype(x.dtype).name for x in (q_BxTxHxE, k_BxSxKxE, v_BxSxKxE)]
  if len(set(dtypes)) != 1 or not set(dtypes) <= set(SUPPORTED_DTYPES):
    raise ValueError(
        f"the TPU pallas attention kernel takes q, k, v all float32 or all bfloat16; got "
        f"{', '.join(dtypes)} (cast them, or use implementation='xla')")
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  tilings = tilings or default_tilings(head_dim, q_BxTxHxE.dtype)
  forward = _clamp_tiling(tilings.forward, q_len, kv_len, q_BxTxHxE.dtype)
  backward = _clamp_tiling(tilings.backward, q_len, kv_len, q_BxTxHxE.dtype)
  q_len_p = _common.round_up(q_len, math.lcm(forward.block_q, backward.block_q))
  kv_len_p = _common.round_up(kv_len, math.lcm(forward.block_k, backward.block_k))
  head_dim_p = padded_head_dim(head_dim)
  q_ids, kv_ids = _common.kernel_segment_ids(
      q_segment_ids, kv_segment_ids, batch=batch, q_len=q_len, kv_len=kv_len,
      q_len_padded=q_len_p, kv_len_padded=kv_len_p)
  if q_ids is not None:
    q_ids, kv_ids = q_ids[:, :, None], kv_ids[:, None, :]
  slopes = (None if alibi_slopes is None
            else masks.alibi_slopes_BxH(alibi_slopes, batch).astype(F32))
  cfg = _Config(
      scale=float(head_dim ** -0.5 if scale is None else scale),
      causal=bool(causal or window is not None), window=window, offset=kv_len - q_len,
      groups=heads // kv_heads, has_segments=q_ids is not None, has_alibi=slopes is not None,
      dropout_rate=_common.check_dropout(dropout_rate, dropout_seed),
      dropout_q_offset=int(dropout_q_offset),
      softcap=_common.check_softcap(softcap), forward=forward, backward=backward,
      interpret=_default_interpret() if interpret is None else bool(interpret))

  keys = dropout_hash.head_keys(dropout_seed, batch, heads) if cfg.dropout_rate else None

  def to_kernel_layout(x, length):  # [B, L, N, D] -> [B, N, Lp, Dp]
    return jnp.swapaxes(_common.pad_axis(_common.pad_axis(x, 1, length), 3, head_dim_p), 1, 2)

  out_BxHxTxE = _flash(cfg, to_kernel_layout(q_BxTxHxE, q_len_p),
                       to_kernel_layout(k_BxSxKxE, kv_len_p), to_kernel_layout(v_BxSxKxE, kv_len_p),
                       slopes, (q_ids, kv_ids, keys))
  return jnp.swapaxes(out_BxHxTxE, 1, 2)[:, :q_len, :, :head_dim]
