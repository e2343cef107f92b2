"""FlashAttention forward for Hopper GPUs in Pallas Mosaic GPU: TMA copies into shared memory and
wgmma matmuls, with warp specialization (Shah et al. 2024, FlashAttention-3, Sec. 3.1).

One kernel program owns a tile of 2 * block_q query rows of one (batch, query head) and runs three
warpgroups:
  producer   (warpgroup 2) streams the K and V blocks of the tile's kv head through a ring of
             `stages` shared-memory slots with TMA, refilling a slot once both consumers
             released it;
  consumers  (warpgroups 0 and 1) each own block_q of the rows: S = Q K^T by wgmma into fp32
             registers, the online softmax in base 2 (scale * log2(e) folded into one multiply),
             O += P V by wgmma; at the end O / l goes back through shared memory by TMA.
             With `pingpong` the two meet on a barrier twice a step, one meeting apart, so
             that one's softmax runs while the other's matmuls hold the tensor cores.
It returns the output [B, L, H, D] and the natural-log log-sum-exp [B, H, L] in fp32, the
residuals the Triton backward (flash_attention.py) recomputes the probabilities from, so this is
a drop-in forward of the same custom VJP.

Both consumers run the same number of kv steps, so their barrier arrivals stay in lockstep: under
the causal rule that count is the one of the tile's last row, and each consumer masks the blocks
that cross its diagonal (a row's extra, fully masked block adds exactly zero, since every row has
already met key 0). Blocks entirely left of the tile's first row skip the mask. The producer
waits for every release before it exits, so each barrier phase is observed.

`interpret=` Mosaic GPU's interpret parameters run the same program on CPU (tests): shared memory,
TMA copies, barriers and warpgroups are simulated; as the interpreter has no layout casts and its
wgmma takes no transposed or register operands, the two products are plain dots there.

Scope (`supports`): bf16; head_dim 64 or 128; GQA with kv heads dividing heads (query head h reads
kv head h // G); non-causal, or causal with q_len == kv_len; q_len a multiple of 2 * block_q and
kv_len of block_kv; no ALiBi, segment ids, padding masks or window. Everything else is routed to
the Triton forward by the caller (flash_attention.py).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
CONSUMERS = 2  # warpgroups doing the math; one more warpgroup issues the TMA copies
# Logit of a masked key: finite, so exp2(MASK - m) underflows to an exact 0 without inf - inf.
MASK_LOGIT = -0.7 * float(jnp.finfo(F32).max)


@dataclasses.dataclass(frozen=True)
class MosaicTiling:
  block_q: int  # rows per consumer warpgroup (a program covers 2 * block_q rows)
  block_kv: int  # keys per pipeline step
  stages: int  # K/V shared-memory slots in flight
  # FlashAttention-3's ping-pong (Sec. 3.1): the consumers take turns at the tensor cores, one's
  # softmax running under the other's matmuls.
  pingpong: bool = True

  def __post_init__(self):
    if self.block_q % 64 or self.block_kv % 64:
      raise ValueError(f"Mosaic GPU tiles are multiples of 64 (a wgmma M / the 128-byte swizzle);"
                       f" got block_q={self.block_q}, block_kv={self.block_kv}")
    if self.stages < 2:
      raise ValueError(f"stages={self.stages}: the K/V ring needs at least 2 slots to overlap "
                       "copies with math")


# Per head_dim; bf16 only. Starting points in the range of FlashAttention-3's Hopper tiles, sized
# so that Q/O (2 x block_q x D) plus K and V rings (2 x stages x block_kv x D) fit the 227 KiB of
# an H100 block: D128 uses 32 + 128 KiB, D64 16 + 96 KiB. Not yet tuned on hardware.
MOSAIC_TILINGS = {
    64: MosaicTiling(block_q=64, block_kv=128, stages=3),
    128: MosaicTiling(block_q=64, block_kv=128, stages=2),
}


def supports(q_shape, kv_shape, dtype, *, causal: bool, has_segments: bool, has_alibi: bool,
             window, tiling: MosaicTiling | None = None) -> bool:
  """Whether this kernel computes the call; False sends it to the Triton forward."""
  _, q_len, heads, head_dim = q_shape
  _, kv_len, kv_heads, _ = kv_shape
  if jnp.dtype(dtype) != jnp.bfloat16 or head_dim not in MOSAIC_TILINGS:
    return False
  if has_segments or has_alibi or window is not None or heads % kv_heads:
    return False
  if causal and q_len != kv_len:  # the end-aligned causal offset is left to Triton
    return False
  tiling = tiling or MOSAIC_TILINGS[head_dim]
  return q_len % (CONSUMERS * tiling.block_q) == 0 and kv_len % tiling.block_kv == 0


def _smem_layout():
  """Shared-memory transforms a wgmma operand of bf16 rows needs: 8 x 64 tiles (64 bf16 = the
  128-byte swizzle width) with the 128-byte swizzle, which avoids bank conflicts."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)


def _kv_steps(causal: bool, tile, tiling: MosaicTiling, kv_len: int):
  """Key blocks the program's rows reach: all, or (causal) up to its last row's diagonal."""
  if not causal:
    return kv_len // tiling.block_kv
  tile_end = (tile + 1) * (CONSUMERS * tiling.block_q)
  return (tile_end + (tiling.block_kv - 1)) // tiling.block_kv


def _consumer(refs, scratch, *, causal, scale, tiling, kv_len, wg, interpret):
  """One consumer warpgroup: its block_q rows against every key block the program streams."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  q_ref, _, _, out_ref, lse_ref = refs
  (qo_smem2, k_smem, v_smem, lse_smem2), (k_ready, v_ready, q_ready), (k_free, v_free), turn = (
      scratch)
  block_q, block_kv, stages = tiling.block_q, tiling.block_kv, tiling.stages
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), lax.axis_index("q_tile")
  tile_start = tile * (CONSUMERS * block_q)
  row_start = tile_start + wg * block_q
  qo_smem, lse_smem = qo_smem2.at[wg], lse_smem2.at[wg]
  rows = (batch, pl.ds(row_start, block_q), head)
  plgpu.copy_gmem_to_smem(q_ref.at[rows], qo_smem, q_ready.at[wg])
  plgpu.barrier_wait(q_ready.at[wg])
  # Register layouts matter to the compiler only; Mosaic GPU's interpreter has no layout ops.
  in_layout = lambda x, layout: x if interpret is not None else plgpu.layout_cast(x, layout)
  iota = lambda shape, dim: (
      lax.broadcasted_iota(jnp.int32, shape, dim) if interpret is not None
      else plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA))
  pingpong = tiling.pingpong

  def rendezvous():  # both consumers meet; with warpgroup 1 one meeting behind, they alternate
    if pingpong:
      plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(turn)

  logit_scale = scale * LOG2_E  # logits in base 2: exp(s - m) == exp2(s * log2(e) - m')
  head_dim = qo_smem.shape[-1]

  def step(kv_step, carry, masked):
    acc_BqxD, m_Bq, l_Bq = carry
    slot = lax.rem(kv_step, jnp.array(stages, kv_step.dtype))
    plgpu.barrier_wait(k_ready.at[slot])

    def qk(acc_ref):
      plgpu.wgmma(acc_ref, qo_smem, plgpu.transpose_ref(k_smem.at[slot], (1, 0)))
      rendezvous()  # issued: the other consumer may take the tensor cores while this one waits
      return acc_ref[...]

    if interpret is None:
      s_BqxBk = pl.run_scoped(qk, plgpu.ACC((block_q, block_kv), F32))
    else:  # the interpreter's wgmma takes neither transposed nor register operands: the same
      # products as plain dots of the shared-memory slots (here and for P V below)
      s_BqxBk = lax.dot_general(qo_smem[...], k_smem.at[slot][...], (((1,), (1,)), ((), ())),
                                preferred_element_type=F32)
      rendezvous()
    s_BqxBk = s_BqxBk * logit_scale
    plgpu.barrier_arrive(k_free.at[slot])  # the wgmma has completed: K's slot may be refilled
    if masked:  # causal: key position <= query position
      q_pos = iota(s_BqxBk.shape, 0)
      kv_pos = iota(s_BqxBk.shape, 1)
      visible = q_pos + row_start >= kv_pos + kv_step * block_kv
      s_BqxBk = jnp.where(visible, s_BqxBk, MASK_LOGIT)
    m_new_Bq = jnp.maximum(m_Bq, s_BqxBk.max(axis=1))
    alpha_Bq = jnp.exp2(m_Bq - m_new_Bq)
    p_BqxBk = jnp.exp2(s_BqxBk - lax.broadcast_in_dim(m_new_Bq, s_BqxBk.shape, [0]))
    l_Bq = l_Bq * alpha_Bq + p_BqxBk.sum(axis=1)
    acc_BqxD = acc_BqxD * lax.broadcast_in_dim(alpha_Bq, acc_BqxD.shape, [0])
    p_BqxBk = p_BqxBk.astype(qo_smem.dtype)
    if pingpong:  # softmax done; wait for V, then for the other consumer's matmuls to be issued
      plgpu.barrier_arrive(turn)
    plgpu.barrier_wait(v_ready.at[slot])
    if pingpong:
      plgpu.barrier_wait(turn)

    def pv(acc_ref):
      plgpu.wgmma(acc_ref, p_BqxBk, v_smem.at[slot])

    if interpret is None:  # wgmma accumulates into the running output in place
      acc_BqxD = pl.run_state(pv)(plgpu.ACC.init(acc_BqxD))
    else:
      acc_BqxD = acc_BqxD + lax.dot_general(p_BqxBk, v_smem.at[slot][...],
                                            (((1,), (0,)), ((), ())), preferred_element_type=F32)
    plgpu.barrier_arrive(v_free.at[slot])
    return acc_BqxD, m_new_Bq, l_Bq

  acc = in_layout(jnp.zeros((block_q, head_dim), F32), plgpu.Layout.WGMMA)
  m = in_layout(jnp.full((block_q,), MASK_LOGIT, F32), plgpu.Layout.WGMMA.reduce(1))
  l = in_layout(jnp.zeros((block_q,), F32), plgpu.Layout.WGMMA.reduce(1))
  carry = (acc, m, l)
  num_steps = _kv_steps(causal, tile, tiling, kv_len)
  # Both consumers run the same steps, two meetings each; warpgroup 1's extra one first and
  # warpgroup 0's last keep the counts equal and the order alternating.
  pl.when(wg == 1)(rendezvous)
  if causal:  # blocks ending at or before the tile's first row need no mask
    unmasked_steps = tile_start // block_kv
    carry = lax.fori_loop(0, unmasked_steps, lambda i, c: step(i, c, False), carry)
    carry = lax.fori_loop(unmasked_steps, num_steps, lambda i, c: step(i, c, True), carry)
  else:
    carry = lax.fori_loop(0, num_steps, lambda i, c: step(i, c, False), carry)
  acc, m, l = carry
  pl.when(wg == 0)(rendezvous)
  # Q's slot is free (its last wgmma completed): it stages O for the copy out.
  qo_smem[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(qo_smem.dtype)
  lse_smem[...] = (m + jnp.log2(l)) * LN_2  # natural log, as the Triton backward expects
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[rows])
  plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[batch, head, pl.ds(row_start, block_q)])
  plgpu.wait_smem_to_gmem(0)


def _producer(refs, scratch, *, causal, groups, tiling, kv_len):
  """The copy warpgroup: K and V blocks of the kv head into the ring, each slot refilled once
  both consumers have arrived on its `free` barrier."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  _, k_ref, v_ref, _, _ = refs
  (_, k_smem, v_smem, _), (k_ready, v_ready, _), (k_free, v_free), _ = scratch
  block_kv, stages = tiling.block_kv, tiling.stages
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), lax.axis_index("q_tile")
  kv_head = lax.div(head, jnp.array(groups, head.dtype))  # GQA: no repeated K/V in memory
  num_steps = _kv_steps(causal, tile, tiling, kv_len)

  def copy(ref, smem, ready, kv_step, slot):
    keys = (batch, pl.ds(kv_step * block_kv, block_kv), kv_head)
    plgpu.copy_gmem_to_smem(ref.at[keys], smem.at[slot], ready.at[slot])

  for slot in range(min(stages, kv_len // block_kv)):  # fill the ring
    def fill(slot=slot):
      copy(k_ref, k_smem, k_ready, slot, slot)
      copy(v_ref, v_smem, v_ready, slot, slot)
    if causal:  # the program may need fewer steps than slots
      pl.when(slot < num_steps)(fill)
    else:
      fill()

  slot_of = lambda kv_step: lax.rem(kv_step, jnp.array(stages, kv_step.dtype))

  @pl.loop(stages, jnp.maximum(num_steps, stages))
  def _refill(kv_step):  # K and V each as soon as both consumers released step kv_step - stages
    slot = slot_of(kv_step)
    plgpu.barrier_wait(k_free.at[slot])
    copy(k_ref, k_smem, k_ready, kv_step, slot)
    plgpu.barrier_wait(v_free.at[slot])
    copy(v_ref, v_smem, v_ready, kv_step, slot)

  # Wait out the last `stages` releases too: every barrier phase is observed before the program
  # ends (the interpreter checks it; on the GPU it orders the exit after the consumers' reads).
  @pl.loop(jnp.maximum(num_steps - stages, 0), num_steps)
  def _drain(kv_step):
    plgpu.barrier_wait(k_free.at[slot_of(kv_step)])
    plgpu.barrier_wait(v_free.at[slot_of(kv_step)])


def mosaic_forward(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal: bool, scale: float,
                   tiling: MosaicTiling | None = None, interpret=None):
  """(out [B, L, H, D] in q.dtype, lse [B, H, L] fp32) for inputs `supports` accepts.

  `interpret`: None compiles for the GPU; Mosaic GPU's interpret parameters run the kernel on
  CPU, simulating shared memory, barriers and the warpgroups (tests).
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  tiling = tiling or MOSAIC_TILINGS[head_dim]
  if not supports(q_BxTxHxE.shape, k_BxSxKxE.shape, q_BxTxHxE.dtype, causal=causal,
                  has_segments=False, has_alibi=False, window=None, tiling=tiling):
    raise ValueError(f"the Mosaic GPU forward does not take q {q_BxTxHxE.shape} {q_BxTxHxE.dtype}, "
                     f"k {k_BxSxKxE.shape}, causal={causal} with {tiling}; call flash_attention, "
                     "which routes such inputs to the Triton forward")
  block_q, block_kv, stages = tiling.block_q, tiling.block_kv, tiling.stages
  kw = dict(causal=causal, tiling=tiling, kv_len=kv_len)

  def body(*refs):
    operand = lambda shape: plgpu.SMEM(shape, q_BxTxHxE.dtype, transforms=_smem_layout())
    buffers = (operand((CONSUMERS, block_q, head_dim)), operand((stages, block_kv, head_dim)),
               operand((stages, block_kv, head_dim)), plgpu.SMEM((CONSUMERS, block_q), F32))
    ready = (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages),
             plgpu.Barrier(num_barriers=CONSUMERS))
    free = (plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=stages),) * 2
    turn = plgpu.Barrier(num_arrivals=CONSUMERS)  # the ping-pong's rendezvous

    def specialize(*scratch):
      wg = lax.axis_index("wg")

      @pl.when(wg < CONSUMERS)
      def _():
        plgpu.set_max_registers(232, action="increase")  # the fp32 tiles live in registers
        _consumer(refs, scratch, scale=scale, wg=wg, interpret=interpret, **kw)

      @pl.when(wg == CONSUMERS)
      def _():
        plgpu.set_max_registers(40, action="decrease")  # TMA issue needs few registers
        _producer(refs, scratch, groups=heads // kv_heads, **kw)

    pl.run_scoped(specialize, buffers, ready, free, turn, collective_axes="wg")

  out_BxTxHxE, lse_BxHxT = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct(q_BxTxHxE.shape, q_BxTxHxE.dtype),
                 jax.ShapeDtypeStruct((batch, heads, q_len), F32)),
      grid=(q_len // (CONSUMERS * block_q), heads, batch),
      grid_names=("q_tile", "head", "batch"),
      num_threads=CONSUMERS + 1, thread_name="wg",
      # approx_math: exp2 and the division run as the fast PTX approximations (ex2.approx).
      compiler_params=plgpu.CompilerParams(approx_math=True),
      kernel_name="tfjax_flash_forward_mgpu", interpret=interpret,
  )(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE)
  return out_BxTxHxE, lse_BxHxT
