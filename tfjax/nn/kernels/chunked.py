"""Flash attention in plain JAX: O(T + S) memory attention for CPU (and anywhere XLA runs).

Forward (FlashAttention, Dao et al. 2022, Alg. 1): for each query block, scan over key blocks
keeping the running row max m, normaliser l and unnormalised output in float32; save only the
log-sum-exp lse = m + log(l) per row.
Backward (FlashAttention-2, Dao 2023, Alg. 2): per key block, scan over query blocks recomputing
p = exp(s - lse); with delta = rowsum(dO * O):
  dV += p^T dO,  dS = p * (dO V^T - delta),  dQ += scale * dS K,  dK += scale * dS^T Q.
No T x S array is ever formed; the largest temporary is one [B, H, block_q, block_k] tile.
Blocks that the causal/window rule hides entirely (judged from the block's min/max positions) are
skipped with `lax.cond`. GQA reads kv head h // G for query head h without repeating K/V.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax

from tfjax.nn import masks
from tfjax.nn.kernels import _blocks, _common

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class _Config:
  scale: float
  causal: bool  # True also when a window is set: the window is causal.
  window: Optional[int]
  block_q: int
  block_k: int
  softcap: Optional[float] = None  # scores -> softcap * tanh(scores / softcap) before the bias


def _block_logits(cfg, q_i, k_j, q_pos, kv_pos, q_ids, kv_ids, slopes_BxKxG):
  """Masked, biased fp32 logits [B, K, G, bq, bk] of one tile, -|i - j| for the ALiBi grad and
  the softcap's tanh(s / cap) for its grad 1 - tanh^2 (None without a cap; cap before bias).

  q_i [B, bq, K, G, D], k_j [B, bk, K, D], positions [1 or B, bq] / [1 or B, bk], ids [B, .].
  """
  s, tanh = _blocks.soft_cap(
      cfg, jnp.einsum("bqkgd,bckd->bkgqc", q_i, k_j, preferred_element_type=F32) * cfg.scale)
  neg_dist = None
  if slopes_BxKxG is not None:
    rel = (q_pos[:, :, None] - kv_pos[:, None, :])[:, None, None]  # [Bp, 1, 1, bq, bk] = i - j
    neg_dist = -jnp.abs(rel).astype(F32)
    s = s + slopes_BxKxG[..., None, None] * neg_dist
  # The reference mask rules (tfjax/nn/masks.py), applied to this tile's positions and ids.
  mask = masks.visibility_mask(
      q_len=q_i.shape[1], kv_len=k_j.shape[1], causal=cfg.causal, window=cfg.window,
      q_segment_ids=q_ids, kv_segment_ids=kv_ids, q_positions=q_pos, kv_positions=kv_pos)
  if mask is not None:
    s = jnp.where(mask[:, :, None], s, masks.MASK_VALUE)  # [B, 1, 1, bq, bk]
  return s, neg_dist, tanh


def _block_visible(cfg, q_pos, kv_pos):
  """[nq, nk] bool: False where no (query, key) pair of the tile can pass the causal/window rule."""
  if not cfg.causal:
    return None
  q_blocks = q_pos.reshape(q_pos.shape[0], -1, cfg.block_q)
  kv_blocks = kv_pos.reshape(kv_pos.shape[0], -1, cfg.block_k)
  q_min, q_max = q_blocks.min((0, 2)), q_blocks.max((0, 2))
  kv_min, kv_max = kv_blocks.min((0, 2)), kv_blocks.max((0, 2))
  visible = kv_min[None, :] <= q_max[:, None]  # Some key is not in the future of some query.
  if cfg.window is not None:
    visible &= (q_min[:, None] - kv_max[None, :]) < cfg.window
  return visible


def _when_visible(visible, i, j, compute, skipped, *operands):
  """compute(*operands) unless tile (i, j) is fully masked; then the zero-valued `skipped`."""
  if visible is None:
    return compute(*operands)
  return lax.cond(visible[i, j], compute, lambda *_: skipped, *operands)


class _Tiles:
  """Dynamic slices of the padded inputs for query block i / key block j."""

  def __init__(self, cfg, q, k, aux):
    self.cfg, self.aux = cfg, aux
    self.kv_heads = k.shape[2]
    self.groups = q.shape[2] // self.kv_heads

  def rows(self, x, i):  # [B, Tp, H, D] -> [B, bq, K, G, D]
    x = lax.dynamic_slice_in_dim(x, i * self.cfg.block_q, self.cfg.block_q, 1)
    return x.reshape(x.shape[0], self.cfg.block_q, self.kv_heads, self.groups, x.shape[-1])

  def cols(self, x, j):  # [B, Sp, K, D] -> [B, bk, K, D]
    return lax.dynamic_slice_in_dim(x, j * self.cfg.block_k, self.cfg.block_k, 1)

  def masks(self, i, j):
    q_pos, kv_pos, q_ids, kv_ids = self.aux
    bq, bk = self.cfg.block_q, self.cfg.block_k
    sl = lax.dynamic_slice_in_dim
    q_ids_i = None if q_ids is None else sl(q_ids, i * bq, bq, 1)
    kv_ids_j = None if kv_ids is None else sl(kv_ids, j * bk, bk, 1)
    return sl(q_pos, i * bq, bq, 1), sl(kv_pos, j * bk, bk, 1), q_ids_i, kv_ids_j


def _forward(cfg, q, k, v, slopes_BxH, aux):
  """Output [B, Tp, H, D] (q.dtype) and lse [nq, B, K, G, bq] (fp32; +inf where a row sees
  no key)."""
  batch, q_len, heads, head_dim = q.shape
  tiles = _Tiles(cfg, q, k, aux)
  kv_heads, groups = tiles.kv_heads, tiles.groups
  slopes = None if slopes_BxH is None else slopes_BxH.reshape(batch, kv_heads, groups)
  visible = _block_visible(cfg, aux[0], aux[1])
  row_shape = (batch, kv_heads, groups, cfg.block_q)

  def query_block(i):
    q_i = tiles.rows(q, i)

    def key_step(carry, j):
      def update(m, l, acc):
        s, _, _ = _block_logits(cfg, q_i, tiles.cols(k, j), *tiles.masks(i, j), slopes)
        m_new = jnp.maximum(m, s.max(-1))
        # Until a row meets a visible key m stays MASK_VALUE and p counts masked keys; the first
        # visible key makes alpha exactly 0, erasing them. Rows that never do are zeroed below.
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        pv = jnp.einsum("bkgqc,bckd->bkgqd", p.astype(v.dtype), tiles.cols(v, j),
                        preferred_element_type=F32)
        return m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + pv

      return _when_visible(visible, i, j, update, carry, *carry), None

    init = (jnp.full(row_shape, masks.MASK_VALUE, F32), jnp.zeros(row_shape, F32),
            jnp.zeros(row_shape + (head_dim,), F32))
    (m, l, acc), _ = lax.scan(key_step, init, jnp.arange(k.shape[1] // cfg.block_k))
    seen = m > masks.MASK_VALUE / 2
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(l), jnp.inf)  # exp(s - inf) = 0: no gradient on such rows
    out_BxbqxHxD = out.transpose(0, 3, 1, 2, 4).reshape(batch, cfg.block_q, heads, head_dim)
    return out_BxbqxHxD.astype(q.dtype), lse

  out, lse = lax.map(query_block, jnp.arange(q_len // cfg.block_q))
  return out.transpose(1, 0, 2, 3, 4).reshape(q.shape), lse


def _backward(cfg, q, k, v, slopes_BxH, aux, out, lse, d_out):
  batch, q_len, heads, head_dim = q.shape
  tiles = _Tiles(cfg, q, k, aux)
  kv_heads, groups = tiles.kv_heads, tiles.groups
  nq = q_len // cfg.block_q
  slopes = None if slopes_BxH is None else slopes_BxH.reshape(batch, kv_heads, groups)
  visible = _block_visible(cfg, aux[0], aux[1])
  # delta_t = sum_d dO * O = sum_s p * dP: the softmax-Jacobian term, in lse's block layout.
  delta = jnp.einsum("bthd,bthd->bth", out.astype(F32), d_out.astype(F32))
  delta = delta.reshape(batch, nq, cfg.block_q, kv_heads, groups).transpose(1, 0, 3, 4, 2)
  kv_tile_shape = (batch, cfg.block_k, kv_heads, head_dim)
  dq_tile_shape = (batch, cfg.block_q, heads, head_dim)

  def key_block(carry, j):
    k_j, v_j = tiles.cols(k, j), tiles.cols(v, j)

    def query_step(carry, i):
      dq, d_slopes, dk_j, dv_j = carry

      def tile_grads(q_i, do_i):
        s, neg_dist, tanh = _block_logits(cfg, q_i, k_j, *tiles.masks(i, j), slopes)
        p = jnp.exp(s - lse[i][..., None])
        dv = jnp.einsum("bkgqc,bqkgd->bckd", p.astype(d_out.dtype), do_i,
                        preferred_element_type=F32)
        dp = jnp.einsum("bqkgd,bckd->bkgqc", do_i, v_j, preferred_element_type=F32)
        ds = p * (dp - delta[i][..., None])
        d_slope = None if slopes is None else (ds * neg_dist).sum((-2, -1))  # bias after the cap
        ds = _blocks.soft_cap_grad(ds, tanh)
        dk = jnp.einsum("bkgqc,bqkgd->bckd", ds.astype(q.dtype), q_i, preferred_element_type=F32)
        dq_i = jnp.einsum("bkgqc,bckd->bqkgd", ds.astype(k.dtype), k_j,
                          preferred_element_type=F32)
        return dq_i.reshape(dq_tile_shape), dk, dv, d_slope

      zeros = (jnp.zeros(dq_tile_shape, F32), jnp.zeros(kv_tile_shape, F32),
               jnp.zeros(kv_tile_shape, F32),
               None if slopes is None else jnp.zeros(slopes.shape, F32))
      dq_i, dk, dv, d_slope = _when_visible(visible, i, j, tile_grads, zeros,
                                            tiles.rows(q, i), tiles.rows(d_out, i))
      start = i * cfg.block_q
      dq_rows = lax.dynamic_slice_in_dim(dq, start, cfg.block_q, 1) + dq_i
      dq = lax.dynamic_update_slice_in_dim(dq, dq_rows, start, 1)
      if slopes is not None:
        d_slopes = d_slopes + d_slope
      return (dq, d_slopes, dk_j + dk, dv_j + dv), None

    dq, d_slopes = carry
    init = (dq, d_slopes, jnp.zeros(kv_tile_shape, F32), jnp.zeros(kv_tile_shape, F32))
    (dq, d_slopes, dk_j, dv_j), _ = lax.scan(query_step, init, jnp.arange(nq))
    return (dq, d_slopes), (dk_j, dv_j)

  init = (jnp.zeros(q.shape, F32), None if slopes is None else jnp.zeros(slopes.shape, F32))
  (dq, d_slopes), (dk, dv) = lax.scan(key_block, init, jnp.arange(k.shape[1] // cfg.block_k))
  dk = dk.transpose(1, 0, 2, 3, 4).reshape(k.shape)
  dv = dv.transpose(1, 0, 2, 3, 4).reshape(v.shape)
  d_slopes = None if slopes is None else d_slopes.reshape(batch, heads)
  return ((dq * cfg.scale).astype(q.dtype), (dk * cfg.scale).astype(k.dtype), dv.astype(v.dtype),
          d_slopes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, slopes_BxH, aux):
  return _forward(cfg, q, k, v, slopes_BxH, aux)[0]


def _attention_fwd(cfg, q, k, v, slopes_BxH, aux):
  out, lse = _forward(cfg, q, k, v, slopes_BxH, aux)
  return out, (q, k, v, slopes_BxH, aux, out, lse)


def _attention_bwd(cfg, residuals, d_out):
  return (*_backward(cfg, *residuals, d_out), None)  # No cotangent for integer positions/ids.


_attention.defvjp(_attention_fwd, _attention_bwd)


def _positions(positions, length_padded):
  pos = jnp.asarray(positions, jnp.int32)
  pos = pos[None, :] if pos.ndim == 1 else pos
  # Padded rows/keys repeat the last position so that block min/max (for skipping) are unchanged.
  return _common.pad_axis(pos, 1, length_padded, mode="edge")


def chunked_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, causal=False, q_segment_ids=None,
                      kv_segment_ids=None, window=None, alibi_slopes=None, bias=None, scale=None,
                      q_positions=None, kv_positions=None, block_q: int = 512,
                      block_k: int = 512, softcap: Optional[float] = None):
  """`tfjax.nn.ops.dot_product_attention` semantics in O(T + S) memory (no dense `bias`);
  `softcap` caps the scaled scores before the ALiBi bias and masks, as 'xla' does."""
  if bias is not None:
    raise _common.unsupported("a dense `bias` (it is itself a T x S array)", "chunked", "'xla'")
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len = k_BxSxKxE.shape[1]
  block_q, block_k = min(block_q, q_len), min(block_k, kv_len)
  q_len_p, kv_len_p = _common.round_up(q_len, block_q), _common.round_up(kv_len, block_k)
  q_pos, kv_pos = masks.query_key_positions(q_len, kv_len, q_positions, kv_positions)
  q_ids, kv_ids = _common.kernel_segment_ids(
      q_segment_ids, kv_segment_ids, batch=batch, q_len=q_len, kv_len=kv_len,
      q_len_padded=q_len_p, kv_len_padded=kv_len_p)
  aux = (_positions(q_pos, q_len_p), _positions(kv_pos, kv_len_p), q_ids, kv_ids)
  slopes = (None if alibi_slopes is None
            else masks.alibi_slopes_BxH(alibi_slopes, batch))
  cfg = _Config(scale=float(head_dim ** -0.5 if scale is None else scale),
                causal=bool(causal or window is not None), window=window,
                block_q=block_q, block_k=block_k,
                softcap=_common.check_softcap(softcap))
  pad = _common.pad_axis
  out_BxTxHxE = _attention(cfg, pad(q_BxTxHxE, 1, q_len_p), pad(k_BxSxKxE, 1, kv_len_p),
                           pad(v_BxSxKxE, 1, kv_len_p), slopes, aux)
  return out_BxTxHxE[:, :q_len]
