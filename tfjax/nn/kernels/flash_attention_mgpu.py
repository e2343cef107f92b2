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

Softcap, masks, ALiBi and dropout are applied by the consumers in registers (_mgpu_tiles.py), by
the Triton forward's rules: the cap c tanh(s / c) on the scaled scores first, then the bias
-slope |i - j| on every step; the causal / window / segment masks on the steps not known to be
fully visible; dropout drops P (not l) with dropout_hash.keep of (batch, query head, query, key),
so the Triton backward regenerates the same mask, and O is scaled by 1 / (1 - rate) once at the
end; lse stays the undropped one. Segment ids (which also hide padding: id 0) come from global
memory in the WGMMA row / column layouts; a row that sees no key writes 0 and lse +inf, as the
Triton forward does.

Both consumers run the same kv steps, so their barrier arrivals stay in lockstep: the program's
range of key blocks (_blocks.kv_block_range at 2 * block_q rows, the Triton kernels' rule):
causal, up to the diagonal of the tile's last row; with a window, from the first block the tile's
first row can see. A consumer's extra blocks add exactly zero: past its diagonal every row has
already met a visible key (exp2(MASK - m) = 0), and before its window a row has met none, so
its first visible key's alpha = exp2(MASK - m) = 0 erases what the masked keys added. Blocks
fully visible to every row of the tile skip the mask (none with segment ids). The producer
streams the same range (block j in slot j % stages) and waits for every release before it
exits, so each barrier phase is observed.

`interpret=` Mosaic GPU's interpret parameters run the same program on CPU (tests): shared memory,
TMA copies, barriers and warpgroups are simulated; as the interpreter has no layout casts, no
plgpu.load and its wgmma takes no transposed or register operands, the two products are plain
dots and the id loads plain reads there.

Scope (`supports`): bf16; head_dim 64 or 128; GQA with kv heads dividing heads (query head h reads
kv head h // G); non-causal, or causal with q_len == kv_len, with or without a sliding window;
segment ids (padding masks), ALiBi slopes, dropout and a logit softcap, alone or together; q_len
a multiple of 2 * block_q and kv_len of block_kv. Everything else (and the end-aligned causal
offset) is routed to the Triton forward by the caller (flash_attention.py). Implemented,
interpreted and compiled for sm_90a on CPU; the masked, ALiBi, dropout and softcap paths are not
yet timed on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from tfjax.nn.kernels import _blocks, _common, _mgpu_tiles

F32, MASK_LOGIT = _mgpu_tiles.F32, _mgpu_tiles.MASK_LOGIT
LN_2 = math.log(2.0)
CONSUMERS = 2  # warpgroups doing the math; one more warpgroup issues the TMA copies


class _Refs(NamedTuple):
  """The kernel's global-memory operands; the optional ones None when the call has none."""
  q: Any
  k: Any
  v: Any
  out: Any
  lse: Any
  q_ids: Any = None  # [B, T] int32
  kv_ids: Any = None  # [B, S] int32
  slopes: Any = None  # [B, H] fp32
  keys: Any = None  # [B, H] int32 dropout keys


@dataclasses.dataclass(frozen=True)
class MosaicTiling:
  block_q: int  # rows per consumer warpgroup (a program covers 2 * block_q rows)
  block_kv: int  # keys per pipeline step
  stages: int  # K/V shared-memory slots in flight
  # FlashAttention-3's ping-pong (Sec. 3.1): the consumers take turns at the tensor cores, one's
  # softmax running under the other's matmuls.
  pingpong: bool = True

  def __post_init__(self):
    _mgpu_tiles.check_tiling(self.block_q, self.block_kv, self.stages)


# Per head_dim; bf16 only. Starting points in the range of FlashAttention-3's Hopper tiles, sized
# so that Q/O (2 x block_q x D) plus K and V rings (2 x stages x block_kv x D) fit the 227 KiB of
# an H100 block: D128 uses 32 + 128 KiB, D64 16 + 96 KiB. Not yet tuned on hardware.
MOSAIC_TILINGS = {
    64: MosaicTiling(block_q=64, block_kv=128, stages=3),
    128: MosaicTiling(block_q=64, block_kv=128, stages=2),
}


def supports(q_shape, kv_shape, dtype, *, causal: bool, has_segments: bool, has_alibi: bool,
             window, tiling: MosaicTiling | None = None, dropout: bool = False,
             softcap: bool = False) -> bool:
  """Whether this kernel computes the call; False sends it to the Triton forward. Segment ids
  (padding masks included), ALiBi, windows and dropout are all in scope (module docstring),
  except dropout at head_dim 128: ptxas spills 1,312 B there (sm_90a, over the 1 KiB bound)."""
  del has_segments, has_alibi, softcap  # the cap, masks and bias are built in the consumers
  _, q_len, heads, head_dim = q_shape
  _, kv_len, kv_heads, _ = kv_shape
  if jnp.dtype(dtype) != jnp.bfloat16 or head_dim not in MOSAIC_TILINGS or heads % kv_heads:
    return False
  if dropout and head_dim == 128:
    return False
  if window is not None and not causal:  # a window is causal (tfjax.nn.masks)
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


def _kv_range(cfg: _blocks.BlockConfig, tile, tiling: MosaicTiling, kv_len: int):
  """(lo, hi, full_lo, full_hi): the key blocks [lo, hi) the program's 2 * block_q rows reach
  (causal: up to its last row's diagonal; window: from its first row's window start) and the
  fully visible [full_lo, full_hi) among them (none with segment ids), by the Triton kernels'
  block rule (_blocks.kv_block_range) at the program's tile size."""
  if not cfg.causal:  # static: every block, all masked with segment ids
    num_blocks = kv_len // tiling.block_kv
    return 0, num_blocks, 0, (0 if cfg.has_segments else num_blocks)
  lo, hi, full_lo, full_hi = _blocks.kv_block_range(
      cfg, tile, CONSUMERS * tiling.block_q, tiling.block_kv, kv_len // tiling.block_kv)
  if cfg.window is None:  # causal: from block 0, static (no empty loop is emitted before it)
    lo = full_lo = 0
  return lo, hi, full_lo, full_hi


def _empty(lo, hi) -> bool:
  """Whether [lo, hi) is statically empty (then no loop is emitted)."""
  return isinstance(lo, int) and isinstance(hi, int) and lo >= hi


def _consumer(refs, scratch, *, cfg, tiling, kv_len, wg, interpret):
  """One consumer warpgroup: its block_q rows against every key block the program streams."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  (qo_smem2, k_smem, v_smem, lse_smem2), (k_ready, v_ready, q_ready), (k_free, v_free), turn = (
      scratch)
  block_q, block_kv, stages = tiling.block_q, tiling.block_kv, tiling.stages
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), lax.axis_index("q_tile")
  tile_start = tile * (CONSUMERS * block_q)
  row_start = tile_start + wg * block_q
  qo_smem, lse_smem = qo_smem2.at[wg], lse_smem2.at[wg]
  rows = (batch, pl.ds(row_start, block_q), head)
  plgpu.copy_gmem_to_smem(refs.q.at[rows], qo_smem, q_ready.at[wg])
  regs = _mgpu_tiles.Registers(interpret)
  # The rows' ids, slope and dropout hash, read while Q's copy is in flight.
  rows_state = _mgpu_tiles.row_state(cfg, refs, regs, row_start, block_q)
  plgpu.barrier_wait(q_ready.at[wg])
  pingpong = tiling.pingpong

  def rendezvous():  # both consumers meet; with warpgroup 1 one meeting behind, they alternate
    if pingpong:
      plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(turn)

  head_dim = qo_smem.shape[-1]

  def step(kv_block, carry, masked):
    acc_BqxD, m_Bq, l_Bq = carry
    slot = lax.rem(kv_block, jnp.array(stages, kv_block.dtype))
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
    # base-2 logits (exp(s - m) == exp2(s log2(e) - m')), capped first when cfg.softcap is set
    s_BqxBk, _ = _mgpu_tiles.base2_logits(s_BqxBk, cfg.scale, cfg.softcap)
    plgpu.barrier_arrive(k_free.at[slot])  # the wgmma has completed: K's slot may be refilled
    s_BqxBk, keep_BqxBk = _mgpu_tiles.mask_bias_dropout(
        cfg, refs, regs, rows_state, s_BqxBk, kv_block=kv_block, row_start=row_start,
        masked=masked)
    m_new_Bq = jnp.maximum(m_Bq, s_BqxBk.max(axis=1))
    # A row that has met only masked keys keeps m = MASK_LOGIT and counts them in l; its first
    # visible key makes alpha exactly 0 and erases that (rows that never meet one: below).
    alpha_Bq = jnp.exp2(m_Bq - m_new_Bq)
    p_BqxBk = jnp.exp2(s_BqxBk - lax.broadcast_in_dim(m_new_Bq, s_BqxBk.shape, [0]))
    l_Bq = l_Bq * alpha_Bq + p_BqxBk.sum(axis=1)  # l sums every weight, dropped or not
    acc_BqxD = acc_BqxD * lax.broadcast_in_dim(alpha_Bq, acc_BqxD.shape, [0])
    if keep_BqxBk is not None:  # dropped weights leave O; 1 / (1 - rate) is applied at the end
      p_BqxBk = jnp.where(keep_BqxBk, p_BqxBk, 0.0)
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

  acc = regs.cast(jnp.zeros((block_q, head_dim), F32), plgpu.Layout.WGMMA)
  m = regs.cast(jnp.full((block_q,), MASK_LOGIT, F32), plgpu.Layout.WGMMA.reduce(1))
  l = regs.cast(jnp.zeros((block_q,), F32), plgpu.Layout.WGMMA.reduce(1))
  carry = (acc, m, l)
  lo, hi, full_lo, full_hi = _kv_range(cfg, tile, tiling, kv_len)
  # Both consumers run the same steps, two meetings each; warpgroup 1's extra one first and
  # warpgroup 0's last keep the counts equal and the order alternating.
  pl.when(wg == 1)(rendezvous)
  # Blocks outside [full_lo, full_hi) may hide some of the tile's keys: they take the mask.
  for start, stop, masked in ((lo, full_lo, True), (full_lo, full_hi, False),
                              (full_hi, hi, True)):
    if not _empty(start, stop):
      carry = lax.fori_loop(start, stop, functools.partial(step, masked=masked), carry)
  acc, m, l = carry
  pl.when(wg == 0)(rendezvous)
  inv_l = 1.0 / (l * (1.0 - cfg.dropout_rate))  # the kept weights' 1 / (1 - rate) here, once
  lse = (m + jnp.log2(l)) * LN_2  # natural log, as the Triton backward expects
  if cfg.has_alibi and cfg.causal:  # the per-key bias's row shift slope x (i - a), natural units
    lse = lse - (rows_state.slope * LN_2) * regs.vec_iota(block_q, 0).astype(F32)
  if cfg.has_segments:  # rows that saw no key (id 0, padding): output 0, lse +inf as Triton's
    seen = m > MASK_LOGIT / 2
    inv_l = jnp.where(seen, inv_l, 0.0)
    lse = jnp.where(seen, lse, jnp.inf)
  # Q's slot is free (its last wgmma completed): it stages O for the copy out.
  qo_smem[...] = (acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])).astype(qo_smem.dtype)
  lse_smem[...] = lse
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(qo_smem, refs.out.at[rows])
  plgpu.copy_smem_to_gmem(lse_smem, refs.lse.at[batch, head, pl.ds(row_start, block_q)])
  plgpu.wait_smem_to_gmem(0)


def _producer(refs, scratch, *, cfg, tiling, kv_len):
  """The copy warpgroup: K and V blocks of the kv head into the ring, each slot refilled once
  both consumers have arrived on its `free` barrier. Block j always uses slot j % stages."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  (_, k_smem, v_smem, _), (k_ready, v_ready, _), (k_free, v_free), _ = scratch
  block_kv, stages = tiling.block_kv, tiling.stages
  batch, head, tile = lax.axis_index("batch"), lax.axis_index("head"), lax.axis_index("q_tile")
  kv_head = lax.div(head, jnp.array(cfg.groups, head.dtype))  # GQA: no repeated K/V in memory
  lo, hi, _, _ = _kv_range(cfg, tile, tiling, kv_len)

  def copy(ref, smem, ready, kv_block, slot):
    keys = (batch, pl.ds(kv_block * block_kv, block_kv), kv_head)
    plgpu.copy_gmem_to_smem(ref.at[keys], smem.at[slot], ready.at[slot])

  slot_of = lambda kv_block: lax.rem(kv_block, jnp.array(stages, jnp.int32))
  for i in range(min(stages, kv_len // block_kv)):  # fill the ring
    def fill(i=i):
      block = lo + i
      slot = slot_of(block) if not isinstance(block, int) else block % stages
      copy(refs.k, k_smem, k_ready, block, slot)
      copy(refs.v, v_smem, v_ready, block, slot)
    if isinstance(lo, int) and isinstance(hi, int):  # all blocks (no causal rule): static
      fill()
    else:  # the program may need fewer steps than slots
      pl.when(lo + i < hi)(fill)

  @pl.loop(lo + stages, jnp.maximum(hi, lo + stages))
  def _refill(kv_block):  # K and V each as soon as both consumers released block - stages
    slot = slot_of(kv_block)
    plgpu.barrier_wait(k_free.at[slot])
    copy(refs.k, k_smem, k_ready, kv_block, slot)
    plgpu.barrier_wait(v_free.at[slot])
    copy(refs.v, v_smem, v_ready, kv_block, slot)

  # Wait out the last `stages` releases too: every barrier phase is observed before the program
  # ends (the interpreter checks it; on the GPU it orders the exit after the consumers' reads).
  @pl.loop(jnp.maximum(hi - stages, lo), hi)
  def _drain(kv_block):
    plgpu.barrier_wait(k_free.at[slot_of(kv_block)])
    plgpu.barrier_wait(v_free.at[slot_of(kv_block)])


def mosaic_forward(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal: bool, scale: float,
                   window: int | None = None, q_segment_ids=None, kv_segment_ids=None,
                   alibi_slopes=None, dropout_rate: float = 0.0, dropout_keys=None,
                   softcap: float | None = None, offset: int | None = None,
                   tiling: MosaicTiling | None = None, interpret=None):
  """(out [B, L, H, D] in q.dtype, lse [B, H, L] fp32) for inputs `supports` accepts.

  window: keys i - window < j <= i (causal). q_segment_ids [B, T] / kv_segment_ids [B, S]:
  int32, both or neither; a query sees a key iff their ids are equal and nonzero (the rule of
  tfjax/nn/kernels/_common.kernel_segment_ids, which also hides padding). alibi_slopes [B, H]
  fp32: the bias -slope |i - j|. dropout_rate with dropout_keys [B, H] int32
  (dropout_hash.head_keys): the weights dropped by dropout_hash.keep and the rest scaled by
  1 / (1 - rate); lse stays the undropped one, as the Triton backward expects. softcap: the
  scaled scores become softcap * tanh(s / softcap) before the bias and masks. offset: query t
  sits at position t + offset for ALiBi (default kv_len - q_len; causal needs 0).
  `interpret`: None compiles for the GPU; Mosaic GPU's interpret parameters run the kernel on
  CPU, simulating shared memory, barriers and the warpgroups (tests).
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  tiling = tiling or MOSAIC_TILINGS[head_dim]
  offset = kv_len - q_len if offset is None else offset
  has_segments = q_segment_ids is not None
  if has_segments != (kv_segment_ids is not None):
    raise ValueError("the Mosaic GPU forward takes q_segment_ids and kv_segment_ids together "
                     "(flash_attention builds both from either with _common.kernel_segment_ids)")
  if bool(dropout_rate) != (dropout_keys is not None):
    raise ValueError(f"dropout_rate={dropout_rate} needs dropout_keys (and keys a rate > 0): "
                     "the [B, H] int32 of tfjax.nn.dropout_hash.head_keys")
  if not supports(q_BxTxHxE.shape, k_BxSxKxE.shape, q_BxTxHxE.dtype, causal=causal,
                  has_segments=has_segments, has_alibi=alibi_slopes is not None, window=window,
                  tiling=tiling) or (causal and offset):
    raise ValueError(f"the Mosaic GPU forward does not take q {q_BxTxHxE.shape} {q_BxTxHxE.dtype}, "
                     f"k {k_BxSxKxE.shape}, causal={causal}, window={window}, offset={offset} "
                     f"with {tiling}; call flash_attention, which routes such inputs to the "
                     "Triton forward")
  cfg = _blocks.BlockConfig(
      scale=float(scale), causal=causal, window=window, offset=offset, groups=heads // kv_heads,
      has_segments=has_segments, has_alibi=alibi_slopes is not None,
      dropout_rate=float(dropout_rate), softcap=_common.check_softcap(softcap))
  optional = {}  # the extra operands, by name, in the order they follow q, k, v
  if has_segments:
    optional.update(q_ids=jnp.asarray(q_segment_ids, jnp.int32),
                    kv_ids=jnp.asarray(kv_segment_ids, jnp.int32))
  if alibi_slopes is not None:
    optional["slopes"] = jnp.broadcast_to(jnp.asarray(alibi_slopes, F32), (batch, heads))
  if dropout_rate:
    optional["keys"] = jnp.asarray(dropout_keys, jnp.int32)
  block_q, block_kv, stages = tiling.block_q, tiling.block_kv, tiling.stages
  kw = dict(cfg=cfg, tiling=tiling, kv_len=kv_len)

  def body(q_ref, k_ref, v_ref, *refs):
    *optional_refs, out_ref, lse_ref = refs
    refs = _Refs(q=q_ref, k=k_ref, v=v_ref, out=out_ref, lse=lse_ref,
                 **dict(zip(optional, optional_refs)))
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
        _consumer(refs, scratch, wg=wg, interpret=interpret, **kw)

      @pl.when(wg == CONSUMERS)
      def _():
        plgpu.set_max_registers(40, action="decrease")  # TMA issue needs few registers
        _producer(refs, scratch, **kw)

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
  )(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *optional.values())
  return out_BxTxHxE, lse_BxHxT


def forward(cfg: _blocks.BlockConfig, q, k, v, q_ids, kv_ids, slopes_BxH, dropout_keys_BxH):
  """mosaic_forward with the arguments of flash_attention's forward (its padded inputs, segment
  ids, [B, H] slopes and dropout keys; None where absent) and its config."""
  return mosaic_forward(q, k, v, causal=cfg.causal, scale=cfg.scale, window=cfg.window,
                        q_segment_ids=q_ids, kv_segment_ids=kv_ids, alibi_slopes=slopes_BxH,
                        dropout_rate=cfg.dropout_rate, dropout_keys=dropout_keys_BxH,
                        softcap=cfg.softcap, offset=cfg.offset)
