"""The Funnel Transformer's relative multi-head attention (Dai et al. 2020, app. A.2) and the
sequence operations around it: stride-2 pooling and the decoder's up-sampling.

A layer's query sequence x_q [B, T, D] attends over keys/values x_kv [B, S, D] (T = S except in
the first layer of a pooled block, where only the query is pooled: T ~ S/2). Per head n, with
q = x_q W_Q / sqrt(E), k = x_kv W_K + b_K, v = x_kv W_V + b_V (E = d_head):
  score[i, j] = (q_i + u) . k_j                                   content  (u = r_w_bias / sqrt E)
              + c_ij (q_i + v') . W_R r(p_i - p_j)                position (v' = r_r_bias / sqrt E)
              + c_ij (q_i + s) . seg[same(i, j)]                  token type (s = r_s_bias / sqrt E)
              - 1e6 (1 - mask_j)
  out = LayerNorm(x_q + softmax_j(score) v W_O)
p_i is token i's position in the original sequence (pooled tokens keep their first token's
position; the separated [CLS] sits before position 1), r(t) = [sin(t w), cos(t w)] with
w_k = 10000^(-k / (D/2)), W_R = r_kernel [D, heads, E], seg = seg_embed [2, heads, E] (row 0:
different token types, row 1: same; type 2 ([CLS]) counts as the same as every type), and c_ij
= 0 where i or j is the separated [CLS] (1 elsewhere). attention_type picks how the position
term is computed: 'relative_shift' (all released checkpoints) scores q against every relative
distance r(t), t on the stride grid, and moves each row into place by Transformer-XL's
reshape-and-slice ("relative shift"); 'factorized' uses the identity
sin/cos(a - b) = products of sin/cos(a), sin/cos(b) (paper app. A.2.2; Hugging Face's variant).
Both are written exactly as transformers' modeling_funnel.py computes them, index for index.
Shape letters as in tfjax/nn/axes.py; T/S query/key lengths, R relative distances, N heads.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import axes
from tfjax.nn.norms import Norm

# transformers' INF: padded keys get -1e6 added, not -inf (a fully padded row stays uniform).
MASK_PENALTY = 1e6
CLS_TOKEN_TYPE = 2


class AttentionInputs(NamedTuple):
  """What a layer's attention reads besides its inputs, pooled alongside the sequence.

  position: relative_shift: per block, (table of unpooled-q layers [R, D], table of the pooled-q
    layer [R', D] or None); factorized: (phi, pi [T, D], psi, omega [S, D]).
  token_types [B, T, S] bool (same segment), mask [B, S] float (1 = attend), cls [T, S] float
  (0 on the separated [CLS] row and column) or None.
  """
  position: tuple
  token_types: jax.Array
  mask: jax.Array
  cls: Optional[jax.Array]


def stride_pool(x, axis: int, separate_cls: bool, truncate_seq: bool):
  """Every other index along `axis`, keeping [CLS]: [x0, x1, x3, x5, ...] under separate_cls
  (the positions / masks of mean-pooled pairs (x1, x2), (x3, x4), ...), [x0, x2, ...] without."""
  axis %= x.ndim
  if separate_cls:
    x = jnp.concatenate([jax.lax.slice_in_dim(x, 0, 1, axis=axis), x], axis=axis)
  stop = x.shape[axis] - 1 if separate_cls and truncate_seq else x.shape[axis]
  return jax.lax.slice_in_dim(x, 0, stop, stride=2, axis=axis)


def pool(x_BxL, mode: str, separate_cls: bool, truncate_seq: bool):
  """Stride-2 pooling over axis 1 (windows of 2, a last odd element pooled alone; torch's
  avg/max_pool2d with ceil_mode). separate_cls: [CLS] is pooled with a copy of itself (so it
  stays itself) and, with truncate_seq, the last token is dropped first: [x0, (x1, x2), ...]."""
  if separate_cls:
    suffix = x_BxL[:, :-1] if truncate_seq else x_BxL
    x_BxL = jnp.concatenate([x_BxL[:, :1], suffix], axis=1)
  if x_BxL.shape[1] % 2:  # a window of one: pair the element with itself (same mean/max/min)
    x_BxL = jnp.concatenate([x_BxL, x_BxL[:, -1:]], axis=1)
  pairs = x_BxL.reshape(x_BxL.shape[0], x_BxL.shape[1] // 2, 2, *x_BxL.shape[2:])
  if mode == "mean":
    return jnp.mean(pairs, axis=2)
  if mode == "max":
    return jnp.max(pairs, axis=2)
  if mode == "min":
    return jnp.min(pairs, axis=2)
  raise ValueError(f"pooling mode {mode!r}: choose mean, max or min")


def upsample(x_BxTxD, stride: int, target_len: int, separate_cls: bool, truncate_seq: bool):
  """The decoder's up-sampling: each token repeated `stride` times, cut (or, with truncate_seq,
  padded with zeros) to `target_len`; under separate_cls [CLS] stays one token in front."""
  if stride == 1:
    return x_BxTxD
  if separate_cls:
    cls_Bx1xD, x_BxTxD = x_BxTxD[:, :1], x_BxTxD[:, 1:]
  out = jnp.repeat(x_BxTxD, stride, axis=1)
  if not separate_cls:
    return out[:, :target_len]
  if truncate_seq:
    out = jnp.pad(out, ((0, 0), (0, stride - 1), (0, 0)))
  return jnp.concatenate([cls_Bx1xD, out[:, :target_len - 1]], axis=1)


def pooled_positions(pos: list, block: int, separate_cls: bool, truncate_seq: bool) -> list:
  """Token positions after the pooling before `block`: [CLS] at 1 - 2^block (before the first
  real token's pooled window), then every other position."""
  if separate_cls:
    rest = pos[1:-1] if truncate_seq else pos[1:]
    return [1 - 2 ** block] + rest[::2]
  return pos[::2]


def relative_distances(pos: list, stride: int, pooled: Optional[list] = None,
                       shift: int = 1) -> np.ndarray:
  """The distances p_q - p_k a layer's position term scores, largest first, on the stride grid
  (transformers' relative_pos): from pooled[0] - pos[0] + shift * len(pooled) * stride down to
  pooled[0] - pos[-1]."""
  pooled = pos if pooled is None else pooled
  top = pooled[0] - pos[0] + shift * len(pooled) * stride
  return np.arange(top, pooled[0] - pos[-1] - 1, -stride)


def sinusoids(t, d_model: int):
  """[sin(t w), cos(t w)] [len(t), D], w_k = 10000^(-k / (D/2)), in float32."""
  freq = jnp.arange(d_model // 2, dtype=jnp.float32)
  inv_freq = 1.0 / (10000.0 ** (freq / (d_model // 2)))
  angle = jnp.asarray(t, jnp.float32)[:, None] * inv_freq[None]
  return jnp.sin(angle), jnp.cos(angle)


def position_tables(cfg, seq_len: int) -> tuple:
  """AttentionInputs.position for an input of `seq_len` tokens (module docstring)."""
  d = cfg.d_model
  if cfg.attention_type == "factorized":
    sin, cos = sinusoids(np.arange(seq_len), d)
    return (jnp.concatenate([sin, sin], -1), jnp.concatenate([cos, cos], -1),
            jnp.concatenate([cos, sin], -1), jnp.concatenate([-sin, cos], -1))
  tables, pos = [], list(range(seq_len))
  pooled = pos
  for block in range(len(cfg.block_sizes)):
    pooling_table = None
    if block:
      pooled = pooled_positions(pos, block, cfg.separate_cls, cfg.truncate_seq)
      t = relative_distances(pos, 2 ** (block - 1), pooled, shift=2)
      pooling_table = jnp.concatenate(sinusoids(t, d), -1)
    pos = pooled
    t = relative_distances(pos, 2 ** block)
    tables.append((jnp.concatenate(sinusoids(t, d), -1), pooling_table))
  return tuple(tables)


def attention_inputs(cfg, seq_len: int, mask_BxL, token_types_BxL) -> AttentionInputs:
  same_BxLxL = token_types_BxL[:, :, None] == token_types_BxL[:, None]
  cls_BxL = token_types_BxL == CLS_TOKEN_TYPE
  types_BxLxL = same_BxLxL | cls_BxL[:, :, None] | cls_BxL[:, None]
  cls_LxL = None
  if cfg.separate_cls:
    cls_LxL = jnp.pad(jnp.ones((seq_len - 1, seq_len - 1), jnp.float32), ((1, 0), (1, 0)))
  return AttentionInputs(position_tables(cfg, seq_len), types_BxLxL,
                         mask_BxL.astype(jnp.float32), cls_LxL)


def relative_shift(scores_BxNxTxR, context_len: int, shift: int):
  """Scores against distances (largest first) [.., T, R] -> against keys [.., T, context_len].

  Transformer-XL's relative shift (transformers' _relative_shift_gather): viewed as [R, T], the
  first `shift` rows dropped, viewed back as [T, R - shift], the first context_len columns kept.
  In flat indices, entry [i, j] of the result is entry [i, shift (T - i) + j] of the input: row
  i's window slides by `shift` distances per row, which puts the score of distance p_i - p_j
  under key j (tests/nn/test_funnel.py checks that for each kind of layer)."""
  b, n, t, r = scores_BxNxTxR.shape
  x = scores_BxNxTxR.reshape(b, n, r, t)[:, :, shift:, :]
  return x.reshape(b, n, t, r - shift)[..., :context_len]


class FunnelAttention(nn.Module):
  """One layer's relative attention and its post-LN residual (module docstring); the norm is
  tfjax's Norm under FunnelConfig.blocks()."""
  config: object  # FunnelConfig
  block_index: int

  @nn.compact
  def __call__(self, xq_BxTxD, xkv_BxSxD, inputs: AttentionInputs):
    cfg = self.config
    blocks = cfg.blocks()
    n, e, d = cfg.n_head, cfg.d_head, cfg.d_model
    dtype = blocks.compute_dtype
    init = nn.initializers.normal(cfg.init_std if cfg.init_std else (d + n * e) ** -0.5)
    logical = nn.with_logical_partitioning  # every parameter's axes (tfjax/nn/axes.py)
    heads = (axes.HEADS, axes.HEAD_DIM)
    # nn.Einsum, not nn.DenseGeneral (same kernel [D, N, E], bias [N, E] and values): see
    # tfjax/nn/attention.py's head_projection (flax issue #3676).
    proj = lambda name, bias: nn.Einsum(  # noqa: E731
        (d, n, e), "btd,dne->btne", use_bias=bias, dtype=dtype, name=name,
        kernel_init=logical(init, (axes.EMBED,) + heads),
        bias_init=logical(nn.initializers.zeros, heads))
    uniform = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, 0.0, cfg.init_range)
    r_w_bias = self.param("r_w_bias", logical(uniform, heads), (n, e))
    r_r_bias = self.param("r_r_bias", logical(uniform, heads), (n, e))
    r_kernel = self.param("r_kernel", logical(uniform, (axes.EMBED,) + heads), (d, n, e))
    r_s_bias = self.param("r_s_bias", logical(uniform, heads), (n, e))
    seg_embed = self.param("seg_embed", logical(uniform, (None,) + heads), (2, n, e))
    scale = e ** -0.5
    q_BxTxNxE = proj("query", False)(xq_BxTxD) * scale
    k_BxSxNxE = proj("key", True)(xkv_BxSxD)
    v_BxSxNxE = proj("value", True)(xkv_BxSxD)
    s = k_BxSxNxE.shape[1]
    content = jnp.einsum("bind,bjnd->bnij", q_BxTxNxE + r_w_bias * scale, k_BxSxNxE)
    position = self.position_scores(q_BxTxNxE + r_r_bias * scale, r_kernel, inputs, s)
    seg_BxNxTx2 = jnp.einsum("bind,snd->bnis", q_BxTxNxE + r_s_bias * scale, seg_embed)
    types = jnp.where(inputs.token_types[:, None], seg_BxNxTx2[..., 1:], seg_BxNxTx2[..., :1])
    if inputs.cls is not None:  # the separated [CLS] has no position or segment relation
      position, types = position * inputs.cls, types * inputs.cls
    scores = (content + position + types).astype(jnp.float32)
    scores = scores - MASK_PENALTY * (1.0 - inputs.mask[:, None, None])
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out_BxTxNxE = jnp.einsum("bnij,bjnd->bind", probs, v_BxSxNxE)
    out_BxTxD = nn.Einsum((n, e, d), "btne,ned->btd", dtype=dtype, name="out",
                          kernel_init=logical(init, heads + (axes.EMBED,)),
                          bias_init=logical(nn.initializers.zeros, (axes.EMBED,)))(out_BxTxNxE)
    return Norm(blocks, name="norm")(xq_BxTxD + out_BxTxD)

  def position_scores(self, qv_BxTxNxE, r_kernel, inputs: AttentionInputs, context_len: int):
    cfg = self.config
    if cfg.attention_type == "factorized":
      phi_TxD, pi_TxD, psi_SxD, omega_SxD = inputs.position
      qr_BxTxNxD = jnp.einsum("binh,dnh->bind", qv_BxTxNxE, r_kernel)
      return (jnp.einsum("bind,jd->bnij", qr_BxTxNxD * phi_TxD[:, None], psi_SxD)
              + jnp.einsum("bind,jd->bnij", qr_BxTxNxD * pi_TxD[:, None], omega_SxD))
    shift = 2 if qv_BxTxNxE.shape[1] != context_len else 1
    r_RxD = inputs.position[self.block_index][shift - 1]
    r_RxNxE = jnp.einsum("td,dnh->tnh", r_RxD, r_kernel)
    scores = jnp.einsum("binh,tnh->bnit", qv_BxTxNxE, r_RxNxE)
    return relative_shift(scores, context_len, shift)
