"""FlashAttention backward for Hopper GPUs in Pallas Mosaic GPU: TMA copies into shared memory,
wgmma matmuls and warp specialization (Shah et al. 2024, FlashAttention-3, Sec. 3.3), for the
(out, lse) residuals of either forward (flash_attention.py's Triton kernel or
flash_attention_mgpu.py's Mosaic GPU one).

Two kernels, each a program of three warpgroups: two consumers doing the math and one producer
streaming blocks through a ring of `stages` shared-memory slots by TMA, refilling a slot once both
consumers released it (the forward's pipeline, with other operands; _mgpu_pipeline.py):
  dK/dV  a program owns 2 x block_kv keys of one (batch, kv head), block_kv per consumer, held in
         shared memory; the producer streams the query blocks (Q, dO and the row statistics) of
         every query head of the kv head's group. Per block, transposed so that the keys are the
         wgmma rows: S^T = K Q^T, P^T = exp2(S^T * scale * log2(e) - lse * log2(e)),
         dV += P^T dO, dP^T = V dO^T, dS^T = P^T * (dP^T - delta), dK += dS^T Q; at the end
         dK * scale and dV go back through K's and V's slots by TMA. GQA sums over the group in
         the registers, so dK/dV are written once, in the input dtype.
  dQ     a program owns 2 x block_q rows of one (batch, query head), block_q per consumer; the
         producer streams the K and V blocks of its kv head: S = Q K^T, P as above,
         dP = dO V^T, dS = P * (dP - delta), dQ += dS K; dQ * scale out through Q's slot.
delta = rowsum(dO * O) and lse * log2(e) are one plain-JAX step before the kernels, stacked as
`stats` [B, H, R, L] fp32 so that one TMA copy brings the rows of a query block; with dropout a
third row holds the (batch, head) key of tfjax/nn/dropout_hash.py (its int32 bits), from which
each tile rebuilds the forward's keep mask M: dV += (P^T * M / (1 - rate)) dO and
dP^T is multiplied by M / (1 - rate) before dS^T (flash_with_vjp in _blocks.py). With a logit
softcap c the tiles recompute S' = c tanh(S * scale / c) and multiply dS by 1 - tanh^2 before
dK and dQ (_mgpu_tiles.base2_logits, _blocks.soft_cap_grad).

Causal (top-left, q_len == kv_len, as the forward): the dK/dV loop starts at the first query block
that reaches the program's keys and the dQ loop ends at the last key block its last row reaches;
blocks that cross the diagonal are masked (a fully masked row of a tile gets P = exactly 0), the
rest skip the mask. Both consumers of a program run the same steps, so their barrier arrivals stay
in lockstep; the producer waits for every release before it exits (as in the forward).

`interpret=` Mosaic GPU's interpret parameters run the same programs on CPU (tests): the
interpreter has no layout casts and its wgmma takes no transposed or register operands, so the
products are plain dots of the shared-memory slots there.

Scope (`supports`): bf16; head_dim 64 or 128; GQA with kv heads dividing heads; non-causal, or
causal with q_len == kv_len; lengths multiples of the tiles; no ALiBi, segment ids, padding masks,
or window; dropout with the keys of dropout_hash.head_keys; a logit softcap (not with dropout at
head_dim 128: it spills there). flash_attention.py sends every other call to the Triton backward
(`route`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfjax.nn import dropout_hash
from tfjax.nn.kernels import _blocks, _common, _mgpu_pipeline, _mgpu_tiles

F32 = jnp.float32
LOG2_E = math.log2(math.e)
CONSUMERS = _mgpu_pipeline.CONSUMERS
# Logit of a masked key: finite, so exp2(MASK - lse) underflows to an exact 0 without inf - inf.
MASK_LOGIT = -0.7 * float(jnp.finfo(F32).max)
GPU_BACKWARDS = ("auto", "triton", "mosaic")


@dataclasses.dataclass(frozen=True)
class BwdTiling:
  block_q: int  # dK/dV: query rows per step; dQ: rows per consumer warpgroup
  block_kv: int  # dK/dV: keys per consumer warpgroup; dQ: keys per step
  stages: int  # shared-memory slots of the streamed operands

  def __post_init__(self):
    _mgpu_tiles.check_tiling(self.block_q, self.block_kv, self.stages)


@dataclasses.dataclass(frozen=True)
class BwdTilings:
  dkdv: BwdTiling
  dq: BwdTiling


# Per head_dim; bf16 only. Not tuned on hardware (no GPU timing yet): 64-row tiles as in
# FlashAttention-3's Hopper backward, which keep two fp32 [64, D] accumulators per warpgroup in
# registers. Shared memory of a dK/dV program: K and V for both consumers (4 x block_kv x D x 2 B)
# plus `stages` slots of Q and dO (2 x block_q x D x 2 B) and stats; for D 128 and 2 stages
# 64 + 64 + 1 KiB. A dQ program: Q, dO for both consumers plus K/V slots, the same sizes.
MOSAIC_BWD_TILINGS = {
    64: BwdTilings(dkdv=BwdTiling(64, 64, 3), dq=BwdTiling(64, 64, 3)),
    128: BwdTilings(dkdv=BwdTiling(64, 64, 2), dq=BwdTiling(64, 64, 2)),
}


def supports(q_shape, kv_shape, dtype, *, causal: bool, has_segments: bool, has_alibi: bool,
             window, tilings: BwdTilings | None = None, dropout: bool = False,
             softcap: bool = False) -> bool:
  """Whether these kernels compute the call's gradients; False leaves them to Triton. Dropout
  and a softcap together at head_dim 128 are out: ptxas spills 1,864 B in the dK/dV kernel
  there (sm_90a, over the 1 KiB bound; each alone stays under it)."""
  _, q_len, heads, head_dim = q_shape
  _, kv_len, kv_heads, _ = kv_shape
  if jnp.dtype(dtype) != jnp.bfloat16 or head_dim not in MOSAIC_BWD_TILINGS:
    return False
  if has_segments or has_alibi or window is not None or heads % kv_heads:
    return False
  if causal and q_len != kv_len:  # the end-aligned causal offset is left to Triton
    return False
  if dropout and softcap and head_dim == 128:
    return False
  t = tilings or MOSAIC_BWD_TILINGS[head_dim]
  return (q_len % t.dkdv.block_q == 0 and kv_len % (CONSUMERS * t.dkdv.block_kv) == 0
          and q_len % (CONSUMERS * t.dq.block_q) == 0 and kv_len % t.dq.block_kv == 0)


def route(requested: str, *, interpret: bool, dropout_rate: float, causal: bool, offset: int,
          has_segments: bool, has_alibi: bool, window, q_shape, kv_shape, dtype,
          softcap: bool = False, dropout_q_offset: int = 0) -> str:
  """The backward of a flash_attention call: "mosaic" where it was asked for and `supports` the
  (padded) shapes, else "triton"."""
  if requested not in GPU_BACKWARDS:
    raise ValueError(f"gpu_backward={requested!r} is not a backward kernel; use one of "
                     f"{GPU_BACKWARDS}")
  # "auto" stays on Triton: the Mosaic backward has not been timed on a GPU yet, and "auto" is to
  # pick from a measured per-shape table, not a guess.
  # Dropout: the kernels rebuild the forward's keep mask from the same hash.
  # Its dropout rows are hashed from 0: a query chunk with an offset (context parallelism) stays
  # on Triton, which takes it.
  if requested != "mosaic" or interpret or (causal and offset) or (
      dropout_rate and dropout_q_offset):
    return "triton"
  takes = supports(q_shape, kv_shape, dtype, causal=causal, has_segments=has_segments,
                   has_alibi=has_alibi, window=window, dropout=bool(dropout_rate),
                   softcap=softcap)
  return "mosaic" if takes else "triton"


# ---- dK/dV ------------------------------------------------------------------------------------


def _dkdv_steps(causal, tile, t: BwdTiling, q_len):
  """(first query block, masked-until block, blocks per head) of a dK/dV program: the query
  blocks that reach its keys, the first ones crossing the diagonal."""
  num_q = q_len // t.block_q
  if not causal:
    return 0, 0, num_q
  tile_start = tile * (CONSUMERS * t.block_kv)
  first = tile_start // t.block_q  # earlier blocks end before the program's first key
  masked_until = jnp.minimum((tile_start + CONSUMERS * t.block_kv) // t.block_q, num_q)
  return first, masked_until, num_q - first


def _keep(ops, key_ref, layout, shape, q_dim, q_start, kv_start, rate):
  """A tile's dropout keep mask (None without dropout): dropout_hash.keep, its per-query row
  hash computed once per query on the [block_q] vector (`layout`, along the tile's `q_dim`)
  from the key row of `stats` (the key's int32 bits), then mixed with each key position."""
  if not rate:
    return None
  n, i32 = shape[q_dim], dropout_hash.I32
  key_Q = lax.bitcast_convert_type(ops.load(key_ref, layout), jnp.int32)
  q_idx_Q = q_start + ops.vector_iota(n, layout)
  row_Q = dropout_hash.fmix32(key_Q ^ (q_idx_Q * i32(dropout_hash.C_QUERY)))
  kv_idx = kv_start + ops.iota(shape, 1 - q_dim)
  bits = dropout_hash.fmix32(lax.broadcast_in_dim(row_Q, shape, [q_dim])
                             ^ (kv_idx * i32(dropout_hash.C_KEY)))
  top = lax.shift_right_logical(bits, i32(32 - dropout_hash.KEEP_BITS))
  return top < dropout_hash.keep_threshold(rate)


def _dkdv_consumer(refs, scratch, wg, *, causal, scale, softcap, t, groups, q_len, ops, rate):
  q_ref, k_ref, v_ref, do_ref, stats_ref, dk_ref, dv_ref = refs
  (k_own, v_own), own_ready, (q_ring, do_ring, stats_ring), ready, free = scratch
  (q_ready, do_ready, stats_ready), (q_free, do_free, stats_free) = ready, free
  plgpu = ops.plgpu
  batch, kv_head, tile = (lax.axis_index(a) for a in ("batch", "kv_head", "kv_tile"))
  kv_start = (tile * CONSUMERS + wg) * t.block_kv
  keys = (batch, pl.ds(kv_start, t.block_kv), kv_head)
  k_smem, v_smem = k_own.at[wg], v_own.at[wg]
  for ref, smem, barrier in zip((k_ref, v_ref), (k_smem, v_smem), own_ready):
    plgpu.copy_gmem_to_smem(ref.at[keys], smem, barrier.at[wg])
  for barrier in own_ready:
    plgpu.barrier_wait(barrier.at[wg])
  first, masked_until, per_head = _dkdv_steps(causal, tile, t, q_len)
  column = plgpu.Layout.WGMMA.reduce(0)  # a [block_q] vector along the columns of S^T

  def step(q_block, carry, group, masked):
    dk_KxD, dv_KxD = carry
    i = group * per_head + (q_block - first)  # the producer's step counter
    slot = lax.rem(i, jnp.array(t.stages, i.dtype))
    plgpu.barrier_wait(q_ready.at[slot])
    st_KxQ, tanh_KxQ = _mgpu_tiles.base2_logits(
        ops.matmul(k_smem, q_ring.at[slot], transpose_b=True), scale, softcap)
    if masked:  # causal: key position <= query position
      q_pos = q_block * t.block_q + ops.iota(st_KxQ.shape, 1)
      st_KxQ = jnp.where(q_pos >= kv_start + ops.iota(st_KxQ.shape, 0), st_KxQ, MASK_LOGIT)
    plgpu.barrier_wait(stats_ready.at[slot])
    lse2_Q = ops.load(stats_ring.at[slot, 0], column)
    pt_KxQ = jnp.exp2(st_KxQ - lax.broadcast_in_dim(lse2_Q, st_KxQ.shape, [1]))
    pt16_KxQ = None
    if tanh_KxQ is not None and not rate:  # the cap's 1 - tanh^2 folded into P^T before the
      # next wgmma, so that neither the tanh nor the fp32 P^T stay live across it
      pt16_KxQ = pt_KxQ.astype(k_smem.dtype)
      pt_KxQ, tanh_KxQ = _blocks.soft_cap_grad(pt_KxQ, tanh_KxQ), None
    plgpu.barrier_wait(do_ready.at[slot])
    do_smem = do_ring.at[slot]
    dpt_KxQ = ops.matmul(v_smem, do_smem, transpose_b=True)
    # The keep mask is built after that wgmma and dies before the next two: fewer live registers.
    keep_KxQ = _keep(ops, stats_ring.at[slot, 2] if rate else None, column, st_KxQ.shape, 1,
                     q_block * t.block_q, kv_start, rate)
    delta_Q = ops.load(stats_ring.at[slot, 1], column)
    plgpu.barrier_arrive(stats_free.at[slot])
    if pt16_KxQ is None:
      pt16_KxQ = ops.dropped(pt_KxQ, keep_KxQ, rate).astype(k_smem.dtype)
    dpt_KxQ = ops.dropped(dpt_KxQ, keep_KxQ, rate)
    dst_KxQ = _blocks.soft_cap_grad(
        pt_KxQ * (dpt_KxQ - lax.broadcast_in_dim(delta_Q, dpt_KxQ.shape, [1])), tanh_KxQ)
    # dV += P^T dO and dK += dS^T Q issued together, one wait.
    dv_KxD, dk_KxD = ops.accumulate([(dv_KxD, pt16_KxQ, do_smem),
                                     (dk_KxD, dst_KxQ.astype(k_smem.dtype), q_ring.at[slot])])
    plgpu.barrier_arrive(do_free.at[slot])
    plgpu.barrier_arrive(q_free.at[slot])
    return dk_KxD, dv_KxD

  def head(group, carry):
    run = lambda lo, hi, masked, c: lax.fori_loop(
        lo, hi, lambda qb, c: step(qb, c, group, masked), c)
    if causal:
      carry = run(first, masked_until, True, carry)
      return run(masked_until, first + per_head, False, carry)
    return run(0, per_head, False, carry)

  head_dim = k_smem.shape[-1]
  zeros = ops.zeros((t.block_kv, head_dim))
  dk_KxD, dv_KxD = lax.fori_loop(0, groups, head, (zeros, zeros))
  # The last wgmmas reading K and V have completed: their slots stage the results.
  k_smem[...] = (dk_KxD * scale).astype(k_smem.dtype)
  v_smem[...] = dv_KxD.astype(v_smem.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[keys])
  plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[keys])
  plgpu.wait_smem_to_gmem(0)


def _dkdv_sources(refs, scratch, *, causal, t, groups, q_len):
  q_ref, _, _, do_ref, stats_ref, _, _ = refs
  _, _, rings, ready, free = scratch
  batch, kv_head, tile = (lax.axis_index(a) for a in ("batch", "kv_head", "kv_tile"))
  first, _, per_head = _dkdv_steps(causal, tile, t, q_len)

  def at(i):  # step i: query head kv_head * groups + i // per_head, its block first + i % per_head
    per = jnp.asarray(per_head, i.dtype)
    head = kv_head * groups + lax.div(i, per)
    return head, (first + lax.rem(i, per)) * t.block_q

  def rows(ref):
    def block(i):
      head, start = at(i)
      return ref.at[batch, pl.ds(start, t.block_q), head]
    return block

  def stats(i):
    head, start = at(i)
    return stats_ref.at[batch, head, :, pl.ds(start, t.block_q)]

  sources = [(block, ring, r, f) for block, ring, r, f in
             zip((rows(q_ref), rows(do_ref), stats), rings, ready, free)]
  return sources, groups * per_head, t.stages


# ---- dQ ---------------------------------------------------------------------------------------


def _dq_tile(causal, t: BwdTiling, q_len):
  """The program's query tile. Causal: the last tile (the most key blocks) is launched first,
  so that the long programs do not form the tail of the grid (as FlashAttention-2/3 order it)."""
  tile = lax.axis_index("q_tile")
  return q_len // (CONSUMERS * t.block_q) - 1 - tile if causal else tile


def _dq_steps(causal, tile, t: BwdTiling, kv_len):
  """(unmasked key blocks, all key blocks) of a dQ program: all, or (causal) up to its last row's
  diagonal, the blocks left of its first row unmasked."""
  if not causal:
    return kv_len // t.block_kv, kv_len // t.block_kv
  tile_start = tile * (CONSUMERS * t.block_q)
  tile_end = tile_start + CONSUMERS * t.block_q
  return tile_start // t.block_kv, (tile_end + t.block_kv - 1) // t.block_kv


def _dq_consumer(refs, scratch, wg, *, causal, scale, softcap, t, kv_len, q_len, ops, rate):
  q_ref, _, _, do_ref, stats_ref, dq_ref = refs
  (q_own, do_own, stats_own), own_ready, (k_ring, v_ring), ready, free = scratch
  (k_ready, v_ready), (k_free, v_free) = ready, free
  plgpu = ops.plgpu
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), _dq_tile(causal, t, q_len)
  row_start = (tile * CONSUMERS + wg) * t.block_q
  rows = (batch, pl.ds(row_start, t.block_q), head)
  q_smem, do_smem, stats_smem = q_own.at[wg], do_own.at[wg], stats_own.at[wg]
  sources = (q_ref.at[rows], do_ref.at[rows],
             stats_ref.at[batch, head, :, pl.ds(row_start, t.block_q)])
  for src, smem, barrier in zip(sources, (q_smem, do_smem, stats_smem), own_ready):
    plgpu.copy_gmem_to_smem(src, smem, barrier.at[wg])
  for barrier in own_ready:
    plgpu.barrier_wait(barrier.at[wg])
  row = plgpu.Layout.WGMMA.reduce(1)  # a [block_q] vector along the rows of S
  lse2_Q, delta_Q = ops.load(stats_smem.at[0], row), ops.load(stats_smem.at[1], row)
  key_row = stats_smem.at[2] if rate else None

  def step(kv_block, dq_QxD, masked):
    slot = lax.rem(kv_block, jnp.array(t.stages, kv_block.dtype))
    plgpu.barrier_wait(k_ready.at[slot])
    s_QxK, tanh_QxK = _mgpu_tiles.base2_logits(
        ops.matmul(q_smem, k_ring.at[slot], transpose_b=True), scale, softcap)
    if masked:
      kv_pos = kv_block * t.block_kv + ops.iota(s_QxK.shape, 1)
      s_QxK = jnp.where(row_start + ops.iota(s_QxK.shape, 0) >= kv_pos, s_QxK, MASK_LOGIT)
    p_QxK = jnp.exp2(s_QxK - lax.broadcast_in_dim(lse2_Q, s_QxK.shape, [0]))
    plgpu.barrier_wait(v_ready.at[slot])
    dp_QxK = ops.matmul(do_smem, v_ring.at[slot], transpose_b=True)
    plgpu.barrier_arrive(v_free.at[slot])
    dp_QxK = ops.dropped(dp_QxK, _keep(ops, key_row, row, s_QxK.shape, 0, row_start,
                                           kv_block * t.block_kv, rate), rate)
    ds_QxK = _blocks.soft_cap_grad(
        p_QxK * (dp_QxK - lax.broadcast_in_dim(delta_Q, dp_QxK.shape, [0])), tanh_QxK)
    dq_QxD, = ops.accumulate([(dq_QxD, ds_QxK.astype(q_smem.dtype), k_ring.at[slot])])
    plgpu.barrier_arrive(k_free.at[slot])
    return dq_QxD

  unmasked, count = _dq_steps(causal, tile, t, kv_len)
  dq_QxD = ops.zeros(q_smem.shape)
  dq_QxD = lax.fori_loop(0, unmasked, lambda j, c: step(j, c, False), dq_QxD)
  if causal:
    dq_QxD = lax.fori_loop(unmasked, count, lambda j, c: step(j, c, True), dq_QxD)
  q_smem[...] = (dq_QxD * scale).astype(q_smem.dtype)  # Q's last wgmma has completed
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
  plgpu.wait_smem_to_gmem(0)


def _dq_sources(refs, scratch, *, causal, t, groups, kv_len, q_len):
  _, k_ref, v_ref, _, _, _ = refs
  _, _, rings, ready, free = scratch
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), _dq_tile(causal, t, q_len)
  kv_head = lax.div(head, jnp.array(groups, head.dtype))  # GQA: no repeated K/V in memory
  block = lambda ref: lambda j: ref.at[batch, pl.ds(j * t.block_kv, t.block_kv), kv_head]
  sources = [(block(ref), ring, r, f) for ref, ring, r, f in
             zip((k_ref, v_ref), rings, ready, free)]
  return sources, _dq_steps(causal, tile, t, kv_len)[1], t.stages


# ---- Entry ------------------------------------------------------------------------------------


def mosaic_backward(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, out_BxTxHxE, lse_BxHxT, d_out_BxTxHxE, *,
                    causal: bool, scale: float, softcap: float | None = None,
                    dropout_rate: float = 0.0, dropout_keys_BxH=None,
                    tilings: BwdTilings | None = None, interpret=None):
  """(dq, dk, dv) in the inputs' dtypes, from the forward's output and natural-log lse [B, H, L]
  fp32, for inputs `supports` accepts. With `dropout_rate` > 0, `dropout_keys_BxH` are the int32
  keys of dropout_hash.head_keys the forward dropped with. `softcap`: the forward capped the
  scaled scores with it (static float; None: no cap).

  `interpret`: None compiles for the GPU; Mosaic GPU's interpret parameters run the kernels on
  CPU, simulating shared memory, barriers and the warpgroups (tests).
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  tilings = tilings or MOSAIC_BWD_TILINGS.get(head_dim)
  if tilings is None or not supports(q_BxTxHxE.shape, k_BxSxKxE.shape, q_BxTxHxE.dtype,
                                     causal=causal, has_segments=False, has_alibi=False,
                                     window=None, tilings=tilings, dropout=bool(dropout_rate),
                                     softcap=softcap is not None):
    raise ValueError(f"the Mosaic GPU backward does not take q {q_BxTxHxE.shape} "
                     f"{q_BxTxHxE.dtype}, k {k_BxSxKxE.shape}, causal={causal}, softcap="
                     f"{softcap}, dropout_rate={dropout_rate} with {tilings}; "
                     "call flash_attention, which routes such inputs to the Triton backward")
  if dropout_rate and dropout_keys_BxH is None:
    raise ValueError("dropout_rate > 0 needs dropout_keys_BxH, the forward's keys "
                     "(tfjax.nn.dropout_hash.head_keys(seed, batch, heads))")
  groups, dtype = heads // kv_heads, q_BxTxHxE.dtype
  delta_BxHxT = jnp.einsum("bthd,bthd->bht", out_BxTxHxE.astype(F32), d_out_BxTxHxE.astype(F32))
  rows = [lse_BxHxT.astype(F32) * LOG2_E, delta_BxHxT]
  if dropout_rate:  # the key's bits, one per row: loaded like lse and delta
    keys_BxH = lax.bitcast_convert_type(dropout_keys_BxH.astype(jnp.int32), F32)
    rows.append(jnp.broadcast_to(keys_BxH[:, :, None], delta_BxHxT.shape))
  stats_BxHxRxT = jnp.stack(rows, axis=2)
  num_rows = len(rows)
  operands = (q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, d_out_BxTxHxE, stats_BxHxRxT)
  operand = lambda *shape: plgpu.SMEM(shape, dtype, transforms=_mgpu_pipeline.smem_layout())
  ops = _mgpu_pipeline.Ops(interpret)
  rate, softcap = float(dropout_rate), _common.check_softcap(softcap)
  kw = dict(interpret=interpret, operands=operands)

  t = tilings.dkdv
  dkdv_kw = dict(causal=causal, t=t, groups=groups, q_len=q_len)
  dk, dv = _mgpu_pipeline.run_kernel(
      lambda refs, scratch, wg: _dkdv_consumer(refs, scratch, wg, scale=scale, softcap=softcap,
                                               ops=ops, rate=rate, **dkdv_kw),
      out_type=(jax.ShapeDtypeStruct(k_BxSxKxE.shape, dtype),) * 2,
      buffers=((operand(CONSUMERS, t.block_kv, head_dim),) * 2,
               (operand(t.stages, t.block_q, head_dim),) * 2
               + (plgpu.SMEM((t.stages, num_rows, t.block_q), F32),)),
      sources=lambda refs, scratch: _dkdv_sources(refs, scratch, **dkdv_kw),
      grid=(kv_len // (CONSUMERS * t.block_kv), kv_heads, batch),
      grid_names=("kv_tile", "kv_head", "batch"), name="tfjax_flash_dkdv_mgpu",
      ready_counts=(t.stages,) * 3, **kw)

  t = tilings.dq
  dq_kw = dict(causal=causal, t=t, kv_len=kv_len, q_len=q_len)
  dq, = _mgpu_pipeline.run_kernel(
      lambda refs, scratch, wg: _dq_consumer(refs, scratch, wg, scale=scale, softcap=softcap,
                                             ops=ops, rate=rate, **dq_kw),
      out_type=(jax.ShapeDtypeStruct(q_BxTxHxE.shape, dtype),),
      buffers=((operand(CONSUMERS, t.block_q, head_dim),) * 2
               + (plgpu.SMEM((CONSUMERS, num_rows, t.block_q), F32),),
               (operand(t.stages, t.block_kv, head_dim),) * 2),
      sources=lambda refs, scratch: _dq_sources(refs, scratch, groups=groups, **dq_kw),
      grid=(q_len // (CONSUMERS * t.block_q), heads, batch),
      grid_names=("q_tile", "head", "batch"), name="tfjax_flash_dq_mgpu",
      ready_counts=(t.stages,) * 2, **kw)
  return dq, dk, dv
