"""Longformer attention (Beltagy et al. 2020), `model.attention_kind='longformer'`: a symmetric
sliding window around every token plus global tokens, as transformers' LongformerSelfAttention
computes it (tfjax/hf/models/longformer.py maps its checkpoints; docs/attention/longformer.md).

Tokens 0..G-1 of every row are global (G = model.longformer_global_tokens: the [CLS] token of a
classifier, a question's tokens for QA), the others local. With the one-sided window
w = model.longformer_window // 2 (transformers' `attention_window` is the two-sided 2w):

  local query i:  softmax_j(q_i . k_j / sqrt(E)) over j in {|i - j| <= w, j local} + {j global},
                  weighting v_j            (q, k, v: the block's W_Q, W_K, W_V)
  global query i: softmax_j(qg_i . kg_j / sqrt(E)) over every j, weighting vg_j
                  (qg, kg, vg: the separate projections query_global, key_global, value_global
                  of the block input, with biases as model.attention_bias; the paper's Q_g, K_g,
                  V_g)

Padding keys (segment id 0) are seen by no query, and a key of another segment by no query of
this one (packed rows). A global key inside a local query's window counts once.

Complexity (implemented, banded): the length L is cut into blocks of c = min(w, L) queries and
each block scores the 3c keys of the previous, its own and the next block, so local attention
costs O(L * 3w * E) time and O(L * 3w) score memory per head, not O(L^2). Global tokens add
O(L * G * E) (every query against the global keys, and the G global rows against every key),
and the global K and V projections run over every token. Decoding, GQA, qk norms and rotary
or bias position kinds are rejected (`check`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import axes
from tfjax.nn.attention import head_projection  # the block's own W_Q/W_K/W_V init and sharding
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.masks import MASK_VALUE
from tfjax.nn.positions import position_kind
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

NAME = "longformer"
GLOBAL_PROJECTIONS = ("query_global", "key_global", "value_global")


@dataclasses.dataclass(frozen=True)
class LongformerConfig(Section):
  """window: transformers' attention_window, the two-sided window 2w (even; every layer).
  global_tokens: G, how many leading tokens of each row are global (0: sliding window only)."""
  window: int = flat_key("longformer_window", 512)
  global_tokens: int = flat_key("longformer_global_tokens", 1)

  @property
  def one_sided(self) -> int:
    return self.window // 2

  def validate(self, model) -> None:
    del model
    if self.window < 2 or self.window % 2:
      raise ValueError(
          f"model.longformer_window={self.window} must be an even number >= 2 (the two-sided "
          "window 2w: w keys each side, transformers' attention_window); e.g. 512")
    if self.global_tokens < 0:
      raise ValueError(f"model.longformer_global_tokens={self.global_tokens} must be >= 0 (the "
                       "number of leading global tokens per row; 0 for none)")


def _neighbours(a_BxNxC, c: int):
  """[B, nb*c, ...] -> [B, nb, 3c, ...]: for block n, positions (n-1)c .. (n+2)c - 1, zero
  beyond the ends (masked by the caller)."""
  batch, length = a_BxNxC.shape[:2]
  nb = length // c
  widths = [(0, 0), (c, c)] + [(0, 0)] * (a_BxNxC.ndim - 2)
  padded = jnp.pad(a_BxNxC, widths).reshape((batch, nb + 2, c) + a_BxNxC.shape[2:])
  return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)


def _band(length: int, c: int, one_sided: int, num_global: int) -> np.ndarray:
  """Static bool [nb, c, 3c]: query n*c+r sees neighbour key (n-1)c+s iff |i - j| <= w, the key
  is inside the sequence and local (global keys are scored once, apart)."""
  nb = -(-length // c)
  i = np.arange(nb * c).reshape(nb, c, 1)
  j = (np.arange(nb)[:, None] * c + np.arange(-c, 2 * c)[None, :])[:, None, :]
  return (np.abs(i - j) <= one_sided) & (j >= num_global) & (j < length)


def _dropout(p, rate: float, rng):
  if not rate:
    return p
  keep = jax.random.bernoulli(rng, 1.0 - rate, p.shape)
  return jnp.where(keep, p / (1.0 - rate), 0.0)


def local_attention(q_BxTxHxE, k_BxTxHxE, v_BxTxHxE, segment_ids_BxT, *, one_sided: int,
                    num_global: int, scale: float, dropout_rate: float = 0.0, rng=None):
  """Every row's local-attention output [B, T, H, E]: the band |i - j| <= one_sided over local
  keys plus the first `num_global` keys, one softmax (banded; see the module docstring).
  segment_ids_BxT: 0 = padding; None = one unpadded sequence per row."""
  batch, length, heads, dim = q_BxTxHxE.shape
  g = min(num_global, length)
  c = max(1, min(one_sided, length))
  nb = -(-length // c)
  tail = nb * c - length
  seg_BxT = (jnp.ones((batch, length), jnp.int32) if segment_ids_BxT is None
             else segment_ids_BxT.astype(jnp.int32))
  pad = lambda a: jnp.pad(a, [(0, 0), (0, tail)] + [(0, 0)] * (a.ndim - 2))
  q_BxNxCxHxE = pad(q_BxTxHxE).reshape(batch, nb, c, heads, dim)
  k_BxNx3CxHxE = _neighbours(pad(k_BxTxHxE), c)
  v_BxNx3CxHxE = _neighbours(pad(v_BxTxHxE), c)
  seg_q_BxNxC = pad(seg_BxT).reshape(batch, nb, c)
  seg_k_BxNx3C = _neighbours(pad(seg_BxT), c)
  band_NxCx3C = jnp.asarray(_band(length, c, one_sided, g))
  visible_BxNxCx3C = (band_NxCx3C[None] & (seg_k_BxNx3C[:, :, None, :] != 0)
                      & (seg_k_BxNx3C[:, :, None, :] == seg_q_BxNxC[..., None]))
  scores_BxNxHxCx3C = jnp.einsum("bnqhe,bnkhe->bnhqk", q_BxNxCxHxE, k_BxNx3CxHxE,
                                 preferred_element_type=jnp.float32) * scale
  scores_BxNxHxCx3C = jnp.where(visible_BxNxCx3C[:, :, None], scores_BxNxHxCx3C, MASK_VALUE)
  if g:
    seg_g_BxG = seg_BxT[:, :g]
    visible_BxNxCxG = ((seg_g_BxG[:, None, None, :] != 0)
                       & (seg_g_BxG[:, None, None, :] == seg_q_BxNxC[..., None]))
    global_BxNxHxCxG = jnp.einsum("bnqhe,bghe->bnhqg", q_BxNxCxHxE, k_BxTxHxE[:, :g],
                                  preferred_element_type=jnp.float32) * scale
    global_BxNxHxCxG = jnp.where(visible_BxNxCxG[:, :, None], global_BxNxHxCxG, MASK_VALUE)
    scores_BxNxHxCx3C = jnp.concatenate([global_BxNxHxCxG, scores_BxNxHxCx3C], axis=-1)
  probs = _dropout(jax.nn.softmax(scores_BxNxHxCx3C, axis=-1), dropout_rate, rng)
  probs = probs.astype(v_BxTxHxE.dtype)
  out_BxNxCxHxE = jnp.einsum("bnhqk,bnkhe->bnqhe", probs[..., g:], v_BxNx3CxHxE)
  if g:
    out_BxNxCxHxE = out_BxNxCxHxE + jnp.einsum("bnhqg,bghe->bnqhe", probs[..., :g],
                                               v_BxTxHxE[:, :g])
  return out_BxNxCxHxE.reshape(batch, nb * c, heads, dim)[:, :length]


def global_attention(qg_BxGxHxE, kg_BxTxHxE, vg_BxTxHxE, segment_ids_BxT, *, scale: float,
                     dropout_rate: float = 0.0, rng=None):
  """The global rows' output [B, G, H, E]: each global query against every (visible) key."""
  scores_BxHxGxT = jnp.einsum("bghe,bthe->bhgt", qg_BxGxHxE, kg_BxTxHxE,
                              preferred_element_type=jnp.float32) * scale
  if segment_ids_BxT is not None:
    seg_BxT = segment_ids_BxT
    g = qg_BxGxHxE.shape[1]
    visible_BxGxT = (seg_BxT[:, None, :] != 0) & (seg_BxT[:, None, :] == seg_BxT[:, :g, None])
    scores_BxHxGxT = jnp.where(visible_BxGxT[:, None], scores_BxHxGxT, MASK_VALUE)
  probs = _dropout(jax.nn.softmax(scores_BxHxGxT, axis=-1), dropout_rate, rng)
  return jnp.einsum("bhgt,bthe->bghe", probs.astype(vg_BxTxHxE.dtype), vg_BxTxHxE)


def attend(owner: nn.Module, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias, *,
           x_BxTxD):
  """Local rows by `local_attention`, the first G rows replaced by `global_attention` over the
  global projections of the block input x [B, T, D]."""
  del logits_bias  # the kind takes none (logits_bias=False rejects ALiBi and T5)
  cfg = owner.config
  kind_cfg = cfg.attention.kind_config
  length, heads = x_BxTxD.shape[1], cfg.attention.num_heads
  g = min(kind_cfg.global_tokens, length)
  scale = cfg.dim_per_head ** -0.5
  rate = 0.0 if cfg.deterministic else cfg.attention.dropout
  rng = lambda: owner.make_rng("dropout") if rate else None
  segment_ids_BxT = visibility.kv_segment_ids_BxS
  # The global projections always exist (transformers' checkpoints hold them); with G = 0 they
  # are applied to no token, which creates their parameters and computes nothing.
  qg, kg, vg = (head_projection(cfg, heads, axes.HEADS, name, x_BxTxD.shape[-1])
                for name in GLOBAL_PROJECTIONS)
  source_BxSxD = x_BxTxD if g else x_BxTxD[:, :0]
  qg_BxGxHxE, kg_BxTxHxE, vg_BxTxHxE = qg(x_BxTxD[:, :g]), kg(source_BxSxD), vg(source_BxSxD)
  out_BxTxHxE = local_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, segment_ids_BxT,
                                one_sided=kind_cfg.one_sided, num_global=g, scale=scale,
                                dropout_rate=rate, rng=rng())
  if not g:
    return out_BxTxHxE
  out_BxGxHxE = global_attention(qg_BxGxHxE, kg_BxTxHxE, vg_BxTxHxE, segment_ids_BxT,
                                 scale=scale, dropout_rate=rate, rng=rng())
  return jnp.concatenate([out_BxGxHxE.astype(out_BxTxHxE.dtype), out_BxTxHxE[:, g:]], axis=1)


def params(cfg: ModelConfig) -> int:
  """query_global, key_global, value_global: [D, H, E] kernels (+ [H, E] biases)."""
  width = cfg.attention.num_heads * cfg.dim_per_head
  return 3 * (cfg.d_model * width + (width if cfg.attention.bias else 0))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs (3x forward) per token beyond 6N's count of the block's matmuls: QK^T and AV
  over the 3c banded keys and the G global keys (4 H E each), the global rows' G keys per token
  on average (4 H E G), less 6N's over-count of the global projections (6N applies all three to
  every token; kg, vg run on every token only when G > 0, qg on G of the seq_len tokens)."""
  kind_cfg = cfg.attention.kind_config
  heads, dim = cfg.attention.num_heads, cfg.dim_per_head
  g = min(kind_cfg.global_tokens, seq_len)
  c = max(1, min(kind_cfg.one_sided, seq_len))
  attention = 4.0 * heads * dim * (3 * c + 2 * g)
  projections_run = (2.0 if g else 0.0) + g / seq_len
  return 3.0 * attention + 6.0 * cfg.d_model * heads * dim * (projections_run - 3.0)


def check(cfg: ModelConfig) -> None:
  attention = cfg.attention
  problems = []
  if cfg.family != "encoder":
    problems.append(f"model.family={cfg.family!r} (Longformer is a bidirectional encoder; set "
                    "family='encoder')")
  if attention.kv_heads != attention.num_heads:
    problems.append(f"model.num_kv_heads={attention.num_kv_heads} (the global projections have "
                    "one key/value head per query head; set num_kv_heads=None)")
  if attention.qk_norm != "none":
    problems.append(f"model.qk_norm={attention.qk_norm!r} (Longformer has none; set 'none')")
  if position_kind(cfg).rotate is not None:
    problems.append(f"model.position={cfg.positions.kind!r} (it rotates the local q, k but not "
                    "the global projections; use position='learned' or 'sinusoidal')")
  if problems:
    raise ValueError(f"model.attention_kind={NAME!r} cannot run with " + "; ".join(problems))


LONGFORMER = register_attention_kind(AttentionKind(
    NAME, attend=attend, flops_per_token=flops_per_token, params=params, check=check,
    reads=("attention_dropout",), section=LongformerConfig, inputs=True))

