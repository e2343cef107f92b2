"""FlashAttention-2 in Pallas (Triton lowering on NVIDIA GPUs, interpreter on CPU).

Three kernels, each over a grid of (block, batch, query head):
  forward  one query block; loops over key blocks with the online softmax in fp32 and writes the
           output and the per-row log-sum-exp (lse).
  dK/dV    one key block; loops over query blocks, recomputing p = exp(s - lse) from the saved lse
           (FlashAttention-2, Dao 2023, Alg. 2):  dV += p^T dO,  dS = p * (dO V^T - delta),
           dK += scale * dS^T Q,  where delta = rowsum(dO * O).
  dQ       one query block; loops over key blocks: dQ += scale * dS K (and the ALiBi slope grad).
Loops run only over the blocks the causal rule / sliding window can reach, and tiles known to be
fully visible skip the mask. Masks (causal, window, segment ids, padded keys) and the ALiBi bias
are computed in-kernel from block offsets. GQA: the index_map reads kv head h // G for query
head h, so K/V are never repeated (dK/dV are written per query head, in fp32, then summed over
each group). Inputs keep their [B, L, heads, D] layout (the BlockSpecs squeeze the head axis:
no transposes); lengths are padded to a block multiple and head_dim to a power of two >= 16, as
Triton tiles require.

The forward has a second implementation, `gpu_forward="mosaic"`: the Mosaic GPU kernel of
flash_attention_mgpu.py (Hopper TMA + wgmma), whose (out, lse) feed the same backward. It takes
bf16, head_dim 64 or 128 (once padded), MHA/GQA, non-causal or causal with q_len == kv_len, ALiBi,
segment ids / padding, windows, dropout, softcap ('auto' leaves these five to Triton: not timed),
compiled; any other call (fp32 or fp16, other head_dims, lengths off the Mosaic tiles, end-aligned
causal offsets) runs the Triton forward, with no error. The backward likewise has
`gpu_backward="mosaic"`: the Mosaic GPU dK/dV and dQ kernels of flash_attention_mgpu_bwd.py
(no ALiBi, windows or segments; dropout and softcap yes, not both at head_dim 128), not yet timed
on a GPU ('auto' is Triton's).

Logit softcap (Gemma 2): every kernel caps the scaled scores, s' = c tanh(s / c), before the ALiBi
bias and the masks (tfjax.nn.ops' order); the backward recomputes the tanh and multiplies dS by
1 - tanh^2 before dK and dQ (the slope gradient reads dS itself: the bias comes after the cap).

Dropout on the weights: every kernel rebuilds a tile's keep mask from (seed, batch, head, query,
key) with the counter-based hash of tfjax/nn/dropout_hash.py (the mask 'xla' uses too), so the
backward regenerates the forward's mask instead of storing it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from tfjax.nn import dropout_hash, masks
from tfjax.nn.kernels import _blocks, _common, flash_attention_mgpu, flash_attention_mgpu_bwd
# The Triton tile table lives in gpu_tilings.py; its names stay importable from here.
from tfjax.nn.kernels.gpu_tilings import (  # noqa: F401
    GPU_TILINGS, KernelTiling, Tilings, default_tilings)

F32 = jnp.float32

GPU_FORWARDS = ("auto", "triton", "mosaic")
# The forward kernel `flash_attention` uses on GPU when its `gpu_forward` argument is None. "auto":
# the Mosaic GPU kernel where it applies and the device is a Hopper GPU (its wgmma instructions
# exist on compute capability 9.x only), faster than the Triton forward in every case measured
# (docs/benchmarks/gpu.md); Triton elsewhere. "mosaic" asks for it wherever it applies (a program
# compiled for an H100 from a CPU host); "triton" never uses it.
GPU_FORWARD = "auto"
# The backward kernels when `gpu_backward` is None ("auto", "triton" or "mosaic"). "auto" is
# Triton's until a measured table says where the Mosaic GPU backward wins (none yet: not timed).
GPU_BACKWARD = "auto"


def _on_hopper() -> bool:
  """Whether the default device is a Hopper GPU (compute capability 9.x)."""
  if jax.default_backend() != "gpu":
    return False
  return str(getattr(jax.devices()[0], "compute_capability", "")).startswith("9.")


@dataclasses.dataclass(frozen=True)
class _Config(_blocks.BlockConfig):
  """Everything static about one call; the kernels specialise on it."""
  forward: KernelTiling = None
  backward: KernelTiling = None
  interpret: bool = False
  precision: lax.Precision = lax.Precision.DEFAULT  # of the fp32 dots (_common.matmul_precision)
  gpu_forward: str = "triton"  # "mosaic" only where flash_attention_mgpu.supports the call
  gpu_backward: str = "triton"  # "mosaic" only where flash_attention_mgpu_bwd.supports it


# ---------------------------------------------------------------------------------------------
# In-kernel helpers


def _dot(a, b, contract=(1, 0), precision=lax.Precision.DEFAULT):
  """2-D matmul accumulating in fp32; contract=(1, 1) is a @ b.T, (0, 0) is a.T @ b."""
  return lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                         precision=(precision, precision), preferred_element_type=F32)


def _row_shifted_alibi(cfg) -> bool:
  """Causal ALiBi as a per-key bias (see _mask_and_bias)."""
  return cfg.has_alibi and cfg.causal


def _alibi_row_shift(cfg, slope, block_q: int):
  """slope x (i - a) for the rows of a query block whose first position is a: what a
  row-shifted tile's log-sum-exp exceeds the true one by (0 without causal ALiBi)."""
  if not _row_shifted_alibi(cfg):
    return 0.0
  return slope * jnp.arange(block_q, dtype=F32)


def _mask_and_bias(cfg, s, q_start, kv_start, q_ids, kv_ids, slope, masked):
  """The shared tile rule (_blocks.mask_and_bias) with i - j built from 1-D aranges (Triton).

  Causal ALiBi adds slope x (j - i) to the visible logits. A softmax row is unchanged by adding
  a constant to the whole row, so the tile adds slope x (j - a) instead, a the block's first
  query position: one [1, bk] vector per tile and no [bq, bk] distance tile on the fully visible
  tiles. The row's log-sum-exp then exceeds the true one by slope x (i - a) (_alibi_row_shift),
  which the kernels take off before storing it and put back when they read it. The slope's
  gradient sum_ij dS_ij (j - i) is unchanged too, because every row of dS sums to 0.
  """
  block_q, block_k = s.shape
  if _row_shifted_alibi(cfg):
    key_minus_anchor = (kv_start + jnp.arange(block_k, dtype=jnp.int32)
                        - (q_start + cfg.offset)).astype(F32)[None, :]
    s, _ = _mask_and_bias(dataclasses.replace(cfg, has_alibi=False), s + slope * key_minus_anchor,
                          q_start, kv_start, q_ids, kv_ids, None, masked)
    return s, key_minus_anchor
  rel = None
  if _blocks.needs_relative_positions(cfg, masked):
    q_pos = q_start + cfg.offset + jnp.arange(block_q, dtype=jnp.int32)
    kv_pos = kv_start + jnp.arange(block_k, dtype=jnp.int32)
    rel = q_pos[:, None] - kv_pos[None, :]  # i - j
  ids = (q_ids[:, None], kv_ids[None, :]) if cfg.has_segments else (None, None)
  return _blocks.mask_and_bias(cfg, s, rel, *ids, slope, masked)


def _masked_loop(ranges, body, carry):
  """Runs body(block, carry, masked) over each [lo, hi) of `ranges` = [(lo, hi, masked), ...]."""
  for lo, hi, masked in ranges:
    carry = lax.fori_loop(lo, hi, functools.partial(body, masked=masked), carry)
  return carry


def _split_ranges(lo, hi, full_lo, full_hi):
  """[lo, full_lo) and [full_hi, hi) need the mask; the tiles in between are fully visible."""
  return [(lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True)]


def _kv_ranges(cfg, q_block, block_q, block_k, num_kv_blocks):
  """Key-block ranges a query block loops over: only blocks the causal/window rule can reach."""
  if not cfg.causal:
    return [(0, num_kv_blocks, cfg.has_segments)]
  return _split_ranges(*_blocks.kv_block_range(cfg, q_block, block_q, block_k, num_kv_blocks))


def _q_ranges(cfg, kv_block, block_q, block_k, num_q_blocks):
  """Query-block ranges a key block loops over: only blocks that can see it."""
  if not cfg.causal:
    return [(0, num_q_blocks, cfg.has_segments)]
  return _split_ranges(*_blocks.q_block_range(cfg, kv_block, block_q, block_k, num_q_blocks))


def _split_refs(cfg, refs):
  """(q_ids_ref, kv_ids_ref, slope_ref, key_ref, *outputs); None for absent optional inputs."""
  refs = list(refs)
  ids = (refs.pop(0), refs.pop(0)) if cfg.has_segments else (None, None)
  slope = refs.pop(0) if cfg.has_alibi else None
  dropout_key = refs.pop(0) if cfg.dropout_rate else None
  return (*ids, slope, dropout_key, *refs)


def _keep(cfg, key_ref, q_start, kv_start, block_q, block_k):
  """The tile's dropout keep mask [bq, bk] (tfjax/nn/dropout_hash.py), or None without dropout."""
  if not cfg.dropout_rate:
    return None
  rows, cols = (start + jnp.arange(n, dtype=jnp.int32) for start, n in
                ((q_start + cfg.dropout_q_offset, block_q), (kv_start, block_k)))
  return dropout_hash.keep(key_ref[...], rows[:, None], cols[None, :], cfg.dropout_rate)


# ---------------------------------------------------------------------------------------------
# Kernels. Ref shapes are the BlockSpec blocks: q/o/dq/do [bq, D]; k/v [Sp, D] (whole sequence of
# one kv head) or [bk, D]; lse/delta [bq] or [Tp]; ids [bq]/[Sp]; slope a scalar.


def _forward_kernel(q_ref, k_ref, v_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slope_ref, key_ref, o_ref, lse_ref = _split_refs(cfg, refs)
  block_q, block_k = cfg.forward.block_q, cfg.forward.block_k
  q_block = pl.program_id(0)
  q_start = q_block * block_q
  q = q_ref[...]
  q_ids = q_ids_ref[...] if cfg.has_segments else None
  slope = slope_ref[...] if cfg.has_alibi else None

  def body(kv_block, carry, masked):
    acc, m, l = carry
    kv_start = pl.multiple_of(kv_block * block_k, block_k)
    keys = pl.ds(kv_start, block_k)
    kv_ids = kv_ids_ref[keys] if cfg.has_segments else None
    s, _ = _blocks.soft_cap(cfg, _dot(q, k_ref[keys, :], (1, 1), cfg.precision) * cfg.scale)
    s, _ = _mask_and_bias(cfg, s, q_start, kv_start, q_ids, kv_ids, slope, masked)
    m_new = jnp.maximum(m, s.max(axis=1))
    # While a row has met only masked keys m stays MASK_VALUE and p counts them; its first
    # visible key makes alpha exactly 0 and erases that. Rows that never meet one are zeroed below.
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    v = v_ref[keys, :]
    keep = _keep(cfg, key_ref, q_start, kv_start, block_q, block_k)  # l sums all p, acc kept
    p_kept = p if keep is None else jnp.where(keep, p, 0.0)  # (1 / (1 - rate): on the output)
    acc = acc * alpha[:, None] + _dot(p_kept.astype(v.dtype), v, (1, 0), cfg.precision)
    return acc, m_new, l * alpha + p.sum(axis=1)

  ranges = _kv_ranges(cfg, q_block, block_q, block_k, k_ref.shape[0] // block_k)
  init = (jnp.zeros(q.shape, F32), jnp.full((block_q,), masks.MASK_VALUE, F32),
          jnp.zeros((block_q,), F32))
  acc, m, l = _masked_loop(ranges, body, init)
  seen = m > masks.MASK_VALUE / 2
  kept_l = jnp.where(seen, l, 1.0) * (1.0 - cfg.dropout_rate)
  out = jnp.where(seen[:, None], acc / kept_l[:, None], 0.0)
  o_ref[...] = out.astype(o_ref.dtype)
  lse = m + jnp.log(l) - _alibi_row_shift(cfg, slope, block_q)
  lse_ref[...] = jnp.where(seen, lse, jnp.inf)  # exp(s - inf) = 0 in the backward


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slope_ref, key_ref, dk_ref, dv_ref = _split_refs(cfg, refs)
  block_q, block_k = cfg.backward.block_q, cfg.backward.block_k
  kv_block = pl.program_id(0)
  kv_start = kv_block * block_k
  k, v = k_ref[...], v_ref[...]
  kv_ids = kv_ids_ref[...] if cfg.has_segments else None
  slope = slope_ref[...] if cfg.has_alibi else None

  def body(q_block, carry, masked):
    dk, dv = carry
    q_start = pl.multiple_of(q_block * block_q, block_q)
    rows = pl.ds(q_start, block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    q_ids = q_ids_ref[rows] if cfg.has_segments else None
    s, tanh = _blocks.soft_cap(cfg, _dot(q, k, (1, 1), cfg.precision) * cfg.scale)
    s, _ = _mask_and_bias(cfg, s, q_start, kv_start, q_ids, kv_ids, slope, masked)
    lse = lse_ref[rows] + _alibi_row_shift(cfg, slope, block_q)
    p = jnp.exp(s - lse[:, None])
    keep = _keep(cfg, key_ref, q_start, kv_start, block_q, block_k)
    dv = dv + _dot(_blocks.dropout_weights(cfg, p, keep).astype(do.dtype), do, (0, 0),
                   cfg.precision)
    dp = _blocks.dropout_weights(cfg, _dot(do, v, (1, 1), cfg.precision), keep)
    ds = _blocks.soft_cap_grad(p * (dp - delta_ref[rows][:, None]), tanh)
    dk = dk + _dot(ds.astype(q.dtype), q, (0, 0), cfg.precision)
    return dk, dv

  ranges = _q_ranges(cfg, kv_block, block_q, block_k, q_ref.shape[0] // block_q)
  zeros = jnp.zeros(k.shape, F32)
  dk, dv = _masked_loop(ranges, body, (zeros, zeros))
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg):
  q_ids_ref, kv_ids_ref, slope_ref, key_ref, dq_ref, *d_slope_rows_ref = _split_refs(cfg, refs)
  block_q, block_k = cfg.backward.block_q, cfg.backward.block_k
  q_block = pl.program_id(0)
  q_start = q_block * block_q
  q, do = q_ref[...], do_ref[...]
  q_ids = q_ids_ref[...] if cfg.has_segments else None
  slope = slope_ref[...] if cfg.has_alibi else None
  lse, delta = lse_ref[...] + _alibi_row_shift(cfg, slope, block_q), delta_ref[...]

  def body(kv_block, carry, masked):
    dq, d_slope = carry
    kv_start = pl.multiple_of(kv_block * block_k, block_k)
    keys = pl.ds(kv_start, block_k)
    kv_ids = kv_ids_ref[keys] if cfg.has_segments else None
    k = k_ref[keys, :]
    s, tanh = _blocks.soft_cap(cfg, _dot(q, k, (1, 1), cfg.precision) * cfg.scale)
    s, neg_dist = _mask_and_bias(cfg, s, q_start, kv_start, q_ids, kv_ids, slope, masked)
    p = jnp.exp(s - lse[:, None])
    keep = _keep(cfg, key_ref, q_start, kv_start, block_q, block_k)
    dp = _blocks.dropout_weights(cfg, _dot(do, v_ref[keys, :], (1, 1), cfg.precision), keep)
    ds = p * (dp - delta[:, None])
    dq = dq + _dot(_blocks.soft_cap_grad(ds, tanh).astype(k.dtype), k, (1, 0), cfg.precision)
    if cfg.has_alibi:  # d loss / d slope = sum over the tile of dS * -|i - j| (or its shift)
      d_slope = d_slope + (ds * neg_dist).sum(axis=1)
    return dq, d_slope

  ranges = _kv_ranges(cfg, q_block, block_q, block_k, k_ref.shape[0] // block_k)
  init = (jnp.zeros(q.shape, F32), jnp.zeros((block_q,), F32))
  dq, d_slope = _masked_loop(ranges, body, init)
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)
  if cfg.has_alibi:
    d_slope_rows_ref[0][...] = d_slope


# ---------------------------------------------------------------------------------------------
# pallas_call wrappers. Grids are (block, batch, head): consecutive programs share one head's K/V.


def _call(cfg, kernel, tiling, grid, in_specs, out_specs, out_shape, name):
  return pl.pallas_call(
      functools.partial(kernel, cfg=cfg), grid=grid, in_specs=in_specs, out_specs=out_specs,
      out_shape=out_shape, interpret=cfg.interpret, name=name,
      # An explicit Triton CompilerParams selects the Triton lowering (Mosaic GPU is the default).
      compiler_params=pltriton.CompilerParams(num_warps=tiling.num_warps,
                                              num_stages=tiling.num_stages))


def _optional_specs(cfg, q_ids, kv_ids, slopes, dropout_keys, q_rows, kv_rows, row_index,
                    kv_index):
  """BlockSpecs and operands for segment ids, ALiBi slopes and dropout keys, when present."""
  specs, args = [], []
  if cfg.has_segments:
    specs += [pl.BlockSpec((None, q_rows), lambda n, b, h: (b, row_index(n))),
              pl.BlockSpec((None, kv_rows), lambda n, b, h: (b, kv_index(n)))]
    args += [q_ids, kv_ids]
  if cfg.has_alibi:
    specs.append(pl.BlockSpec((None, None), lambda n, b, h: (b, h)))
    args.append(slopes)
  if cfg.dropout_rate:  # the [B, H] int32 keys of dropout_hash.head_keys, one scalar per program
    specs.append(pl.BlockSpec((None, None), lambda n, b, h: (b, h)))
    args.append(dropout_keys)
  return specs, args


def _forward(cfg, q, k, v, q_ids, kv_ids, slopes, dropout_keys):
  if cfg.gpu_forward == "mosaic":
    return flash_attention_mgpu.forward(cfg, q, k, v, q_ids, kv_ids, slopes, dropout_keys)
  batch, q_len, heads, head_dim = q.shape
  kv_len, block_q = k.shape[1], cfg.forward.block_q
  kv_head = lambda h: lax.div(h, cfg.groups)  # GQA: query head h reads kv head h // G.
  q_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
  kv_spec = pl.BlockSpec((None, kv_len, None, head_dim), lambda i, b, h: (b, 0, kv_head(h), 0))
  row_spec = pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))
  extra_specs, extra_args = _optional_specs(cfg, q_ids, kv_ids, slopes, dropout_keys,
                                            block_q, kv_len, lambda i: i, lambda i: 0)
  return _call(
      cfg, _forward_kernel, cfg.forward, (q_len // block_q, batch, heads),
      [q_spec, kv_spec, kv_spec] + extra_specs, [q_spec, row_spec],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, q_len), F32)],
      "tfjax_flash_forward")(q, k, v, *extra_args)


def _backward(cfg, q, k, v, q_ids, kv_ids, slopes, dropout_keys, out, lse, d_out):
  if cfg.gpu_backward == "mosaic":  # no ALiBi there: no slope gradient
    return (*flash_attention_mgpu_bwd.mosaic_backward(
        q, k, v, out, lse, d_out, causal=cfg.causal, scale=cfg.scale, softcap=cfg.softcap,
        dropout_rate=cfg.dropout_rate, dropout_keys_BxH=dropout_keys), None)
  batch, q_len, heads, head_dim = q.shape
  kv_len, kv_heads, groups = k.shape[1], k.shape[2], cfg.groups
  block_q, block_k = cfg.backward.block_q, cfg.backward.block_k
  delta = jnp.einsum("bthd,bthd->bht", out.astype(F32), d_out.astype(F32))
  kv_head = lambda h: lax.div(h, groups)

  # dK/dV: grid over key blocks; whole query sequence of head h visible to each program.
  q_all = pl.BlockSpec((None, q_len, None, head_dim), lambda j, b, h: (b, 0, h, 0))
  kv_tile = pl.BlockSpec((None, block_k, None, head_dim), lambda j, b, h: (b, j, kv_head(h), 0))
  rows_all = pl.BlockSpec((None, None, q_len), lambda j, b, h: (b, h, 0))
  per_head_tile = pl.BlockSpec((None, block_k, None, head_dim), lambda j, b, h: (b, j, h, 0))
  extra_specs, extra_args = _optional_specs(cfg, q_ids, kv_ids, slopes, dropout_keys,
                                            q_len, block_k, lambda j: 0, lambda j: j)
  # With groups > 1 each query head writes its own fp32 partial, summed over the group below.
  grad_dtype = lambda x: x.dtype if groups == 1 else F32
  dk, dv = _call(
      cfg, _dkdv_kernel, cfg.backward, (kv_len // block_k, batch, heads),
      [q_all, kv_tile, kv_tile, q_all, rows_all, rows_all] + extra_specs,
      [per_head_tile, per_head_tile],
      [jax.ShapeDtypeStruct((batch, kv_len, heads, head_dim), grad_dtype(k)),
       jax.ShapeDtypeStruct((batch, kv_len, heads, head_dim), grad_dtype(v))],
      "tfjax_flash_dkdv")(q, k, v, d_out, lse, delta, *extra_args)
  if groups > 1:
    group_sum = lambda g: g.reshape(batch, kv_len, kv_heads, groups, head_dim).sum(3)
    dk, dv = group_sum(dk).astype(k.dtype), group_sum(dv).astype(v.dtype)

  # dQ: grid over query blocks, like the forward.
  q_tile = pl.BlockSpec((None, block_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
  kv_all = pl.BlockSpec((None, kv_len, None, head_dim), lambda i, b, h: (b, 0, kv_head(h), 0))
  row_tile = pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i))
  extra_specs, extra_args = _optional_specs(cfg, q_ids, kv_ids, slopes, dropout_keys,
                                            block_q, kv_len, lambda i: i, lambda i: 0)
  out_specs, out_shape = [q_tile], [jax.ShapeDtypeStruct(q.shape, q.dtype)]
  if cfg.has_alibi:  # Per-row partial sums of the slope gradient.
    out_specs.append(row_tile)
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, q_len), F32))
  dq, *d_slope_rows = _call(
      cfg, _dq_kernel, cfg.backward, (q_len // block_q, batch, heads),
      [q_tile, kv_all, kv_all, q_tile, row_tile, row_tile] + extra_specs, out_specs, out_shape,
      "tfjax_flash_dq")(q, k, v, d_out, lse, delta, *extra_args)
  d_slopes = d_slope_rows[0].sum(-1) if cfg.has_alibi else None
  return dq, dk, dv, d_slopes


_flash = _blocks.flash_with_vjp(_forward, _backward)


# ---------------------------------------------------------------------------------------------


def _default_interpret() -> bool:
  backend = jax.default_backend()
  if backend == "cpu":
    return True  # Pallas runs on CPU only through its interpreter (slow; for tests).
  if backend == "gpu":
    return False
  raise ValueError(f"implementation='pallas' runs on GPU (Triton) or CPU (interpreted), not on "
                   f"{backend!r}; use implementation='xla'")


def _gpu_forward(cfg, requested, q_shape, kv_shape, dtype) -> str:
  """The call's forward kernel: `requested` (or GPU_FORWARD) where Mosaic takes it, else triton."""
  requested = GPU_FORWARD if requested is None else requested
  if requested not in GPU_FORWARDS:
    raise ValueError(f"gpu_forward={requested!r} is not a forward kernel; use one of "
                     f"{GPU_FORWARDS}")
  takes = flash_attention_mgpu.supports(
      q_shape, (*kv_shape, q_shape[3]), dtype, causal=cfg.causal, has_segments=cfg.has_segments,
      has_alibi=cfg.has_alibi, window=cfg.window, dropout=bool(cfg.dropout_rate),
      softcap=cfg.softcap is not None)
  aligned = not cfg.causal or cfg.offset == 0  # the kernel's causal rule is top-left aligned
  # 'auto': Mosaic where it was timed on Hopper (plain, causal); masks/ALiBi/dropout/softcap
  # never ran there.
  wanted = requested == "mosaic" or (requested == "auto" and _on_hopper() and not (
      cfg.has_segments or cfg.has_alibi or cfg.window or cfg.dropout_rate or cfg.softcap))
  # The Mosaic kernels hash dropout rows from 0 (no dropout_q_offset): Triton takes a chunk's.
  offset_dropout = bool(cfg.dropout_rate and cfg.dropout_q_offset)
  use_mosaic = wanted and not cfg.interpret and takes and aligned and not offset_dropout
  return "mosaic" if use_mosaic else "triton"


def _clamp_tiling(tiling: KernelTiling, q_len: int, kv_len: int) -> KernelTiling:
  """Shrinks tiles for short sequences (to a power of two >= 16, the smallest Triton matmul)."""
  shrink = lambda block, n: min(block, max(16, pl.next_power_of_2(n)))
  return dataclasses.replace(tiling, block_q=shrink(tiling.block_q, q_len),
                             block_k=shrink(tiling.block_k, kv_len))


def flash_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal=False, q_segment_ids=None,
                    kv_segment_ids=None, window=None, alibi_slopes=None, bias=None, scale=None,
                    q_positions=None, kv_positions=None, tilings: Optional[Tilings] = None,
                    interpret: Optional[bool] = None, gpu_forward: Optional[str] = None,
                    gpu_backward: Optional[str] = None, dropout_rate: float = 0.0,
                    dropout_seed=None, softcap: Optional[float] = None,
                    dropout_q_offset: int = 0):
  """`tfjax.nn.ops.dot_product_attention` semantics as Pallas kernels (default positions only).

  `tilings` overrides the per-(head_dim, dtype) table; `interpret` defaults to True on CPU.
  `gpu_forward` ("auto", "triton" or "mosaic"; None reads the module's GPU_FORWARD) picks the
  forward kernel of compiled calls; "mosaic" applies where flash_attention_mgpu.supports the
  call, Triton elsewhere (module docstring). `gpu_backward` (the same values; None reads
  GPU_BACKWARD) likewise picks the backward: "mosaic" runs flash_attention_mgpu_bwd's kernels
  where they apply, Triton elsewhere; "auto" is Triton's for now.
  `dropout_rate` > 0 drops attention weights with the keep mask of tfjax/nn/dropout_hash.py for
  the int32 `dropout_seed` (the same mask as implementation='xla'), in either forward kernel.
  `softcap` (a static float; None: off) caps the scaled scores, softcap * tanh(s / softcap),
  before the ALiBi bias and the masks, in every forward and backward kernel.
  `dropout_q_offset` (static int) is the first query's index in the dropout hash (default 0; a
  query chunk of a longer sequence passes its start, tfjax/nn/sharded_attention.py).
  """
  if bias is not None:
    raise _common.unsupported("a dense `bias`", "pallas", "'xla'")
  if q_positions is not None or kv_positions is not None:
    raise _common.unsupported("explicit q_positions/kv_positions", "pallas", "'xla' or 'chunked'")
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  tilings = tilings or default_tilings(head_dim, q_BxTxHxE.dtype)
  forward = _clamp_tiling(tilings.forward, q_len, kv_len)
  backward = _clamp_tiling(tilings.backward, q_len, kv_len)
  # Block sizes are powers of two, so the larger one is a multiple of the smaller.
  q_len_p = _common.round_up(q_len, max(forward.block_q, backward.block_q))
  kv_len_p = _common.round_up(kv_len, max(forward.block_k, backward.block_k))
  head_dim_p = max(16, pl.next_power_of_2(head_dim))  # Zero columns change no dot product.
  q_ids, kv_ids = _common.kernel_segment_ids(
      q_segment_ids, kv_segment_ids, batch=batch, q_len=q_len, kv_len=kv_len,
      q_len_padded=q_len_p, kv_len_padded=kv_len_p)
  slopes = (None if alibi_slopes is None
            else masks.alibi_slopes_BxH(alibi_slopes, batch))
  cfg = _Config(
      scale=float(head_dim ** -0.5 if scale is None else scale),
      causal=bool(causal or window is not None), window=window, offset=kv_len - q_len,
      groups=heads // kv_heads, has_segments=q_ids is not None, has_alibi=slopes is not None,
      dropout_rate=_common.check_dropout(dropout_rate, dropout_seed),
      dropout_q_offset=int(dropout_q_offset),
      softcap=_common.check_softcap(softcap), forward=forward, backward=backward,
      interpret=_default_interpret() if interpret is None else interpret,
      precision=_common.matmul_precision())
  cfg = dataclasses.replace(cfg, gpu_forward=_gpu_forward(
      cfg, gpu_forward, (batch, q_len_p, heads, head_dim_p), (batch, kv_len_p, kv_heads),
      q_BxTxHxE.dtype), gpu_backward=flash_attention_mgpu_bwd.route(
          GPU_BACKWARD if gpu_backward is None else gpu_backward, interpret=cfg.interpret,
          dropout_rate=cfg.dropout_rate, causal=cfg.causal, offset=cfg.offset,
          has_segments=cfg.has_segments, has_alibi=cfg.has_alibi, window=cfg.window,
          q_shape=(batch, q_len_p, heads, head_dim_p), softcap=cfg.softcap is not None,
          kv_shape=(batch, kv_len_p, kv_heads, head_dim_p), dtype=q_BxTxHxE.dtype,
          dropout_q_offset=cfg.dropout_q_offset))

  def pad(x, length):
    return _common.pad_axis(_common.pad_axis(x, 1, length), 3, head_dim_p)

  keys = dropout_hash.head_keys(dropout_seed, batch, heads) if cfg.dropout_rate else None
  out_BxTxHxE = _flash(cfg, pad(q_BxTxHxE, q_len_p), pad(k_BxSxKxE, kv_len_p),
                       pad(v_BxSxKxE, kv_len_p), slopes, (q_ids, kv_ids, keys))
  return out_BxTxHxE[:, :q_len, :, :head_dim]
