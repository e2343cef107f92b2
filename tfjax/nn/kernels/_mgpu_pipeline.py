"""The warp-specialized program shape of the Mosaic GPU backward kernels
(flash_attention_mgpu_bwd.py): two consumer warpgroups doing the math on blocks that one producer
warpgroup streams into shared-memory rings by TMA, and the few operations whose compiled
(wgmma, register layouts) and interpreted (plain dots, no layouts) forms differ.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32
CONSUMERS = 2  # warpgroups doing the math; one more warpgroup issues the TMA copies


def smem_layout():
  """Shared-memory transforms of a wgmma operand of bf16 rows: 8 x 64 tiles (64 bf16 = the
  128-byte swizzle width) with the 128-byte swizzle, which avoids bank conflicts."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)


class Ops:
  """The few operations whose compiled and interpreted forms differ (module docstring)."""

  def __init__(self, interpret):
    import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
    self.plgpu, self.interpret = plgpu, interpret is not None

  def layout(self, x, layout):
    return x if self.interpret else self.plgpu.layout_cast(x, layout)

  def load(self, ref, layout):
    return ref[...] if self.interpret else self.plgpu.load(ref, (), layout=layout)

  def iota(self, shape, dim):
    if self.interpret:
      return lax.broadcasted_iota(jnp.int32, shape, dim)
    return self.plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.plgpu.Layout.WGMMA)

  def dropped(self, x, keep, rate):
    """x * keep / (1 - rate) (x itself without dropout)."""
    return x if keep is None else jnp.where(keep, x * (1.0 / (1.0 - rate)), 0.0)

  def vector_iota(self, n, layout):
    """0..n-1 as a [n] int32 vector in `layout` (a reduced WGMMA layout)."""
    if self.interpret:
      return lax.iota(jnp.int32, n)
    return self.plgpu.broadcasted_iota(jnp.int32, (n,), 0, layout=layout)

  def zeros(self, shape):
    return self.layout(jnp.zeros(shape, F32), self.plgpu.Layout.WGMMA)

  def matmul(self, a, b_smem, transpose_b: bool):
    """a @ b (or a @ b^T) in fp32, a a shared-memory ref; waits for the result."""
    if self.interpret:
      return lax.dot_general(a[...], b_smem[...], (((1,), (1 if transpose_b else 0,)), ((), ())),
                             preferred_element_type=F32)
    plgpu = self.plgpu
    b = plgpu.transpose_ref(b_smem, (1, 0)) if transpose_b else b_smem
    shape = (a.shape[0], b.shape[1])

    def run(acc_ref):
      plgpu.wgmma(acc_ref, a, b)
      return acc_ref[...]
    return pl.run_scoped(run, plgpu.ACC(shape, F32))

  def accumulate(self, pairs):
    """[acc + a @ b for (acc, a, b) in pairs], a in registers and b a shared-memory ref; the
    wgmmas are issued together and awaited once."""
    if self.interpret:
      return [acc + lax.dot_general(a, b[...], (((1,), (0,)), ((), ())),
                                    preferred_element_type=F32) for acc, a, b in pairs]
    plgpu = self.plgpu

    def run(acc_refs):
      for acc_ref, (_, a, b) in zip(acc_refs, pairs):
        plgpu.wgmma(acc_ref, a, b)
    return list(pl.run_state(run)(tuple(plgpu.ACC.init(acc) for acc, _, _ in pairs)))


def produce(sources, count, stages: int):
  """The producer warpgroup: step i's block of each source into slot i % stages, a slot refilled
  once both consumers arrived on the source's `free` barrier for it. `sources` holds
  (block(i) -> gmem ref, smem ring, ready barriers, free barriers)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  slot_of = lambda i: lax.rem(i, jnp.array(stages, i.dtype))

  def copy(i, slot):
    for block, smem, ready, _ in sources:
      plgpu.copy_gmem_to_smem(block(i), smem.at[slot], ready.at[slot])

  for slot in range(stages):  # fill the ring (a program may have fewer steps than slots)
    fill = lambda slot=slot: copy(jnp.int32(slot), slot)
    if isinstance(count, int):
      if slot < count:
        fill()
    else:
      pl.when(slot < count)(fill)

  @pl.loop(stages, jnp.maximum(count, stages))
  def _refill(i):
    slot = slot_of(i)
    for block, smem, ready, free in sources:
      plgpu.barrier_wait(free.at[slot])
      plgpu.copy_gmem_to_smem(block(i), smem.at[slot], ready.at[slot])

  # Wait out the last releases too: every barrier phase is observed before the program ends (the
  # interpreter checks it; on the GPU it orders the exit after the consumers' reads).
  @pl.loop(jnp.maximum(count - stages, 0), count)
  def _drain(i):
    for *_, free in sources:
      plgpu.barrier_wait(free.at[slot_of(i)])


def run_kernel(body, *, operands, out_type, buffers, sources, grid, grid_names, name,
                interpret, ready_counts):
  """One three-warpgroup program: `body(refs, scratch, wg)` for the consumers and `sources(refs,
  scratch)` -> (sources, count, stages) for the producer. `buffers`: consumer-owned and ring
  shared-memory buffers; `ready_counts`: barriers per ring (one per slot) and per consumer."""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  own, rings = buffers

  def kernel_body(*refs):
    # One TMA barrier per copy: each copy arrives once (with its byte count) on its barrier.
    own_ready = tuple(plgpu.Barrier(num_barriers=CONSUMERS) for _ in own)
    ready = tuple(plgpu.Barrier(num_barriers=n) for n in ready_counts)
    free = tuple(plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=n) for n in ready_counts)

    def specialize(own_smem, ring_smem, own_ready, ready, free):
      wg = lax.axis_index("wg")
      scratch = (own_smem, own_ready, ring_smem, ready, free)

      @pl.when(wg < CONSUMERS)
      def _():
        plgpu.set_max_registers(240, action="increase")  # the fp32 tiles live in registers
        body(refs, scratch, wg)

      @pl.when(wg == CONSUMERS)
      def _():
        plgpu.set_max_registers(24, action="decrease")  # TMA issue needs few registers
        produce(*sources(refs, scratch))

    pl.run_scoped(specialize, own, rings, own_ready, ready, free, collective_axes="wg")

  return plgpu.kernel(
      kernel_body, out_type=out_type, grid=grid, grid_names=grid_names,
      num_threads=CONSUMERS + 1, thread_name="wg",
      # approx_math: exp2 runs as the fast PTX approximation (ex2.approx).
      compiler_params=plgpu.CompilerParams(approx_math=True), kernel_name=name,
      interpret=interpret)(*operands)
