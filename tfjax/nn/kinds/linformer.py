"""Linformer attention, `model.attention_kind='linformer'` (Wang et al. 2020, "Linformer:
Self-Attention with Linear Complexity"; docs/attention/linformer.md).

The keys and values are projected along the sequence axis by learned E, F in R^{k x n}
(n = model.max_len, k = model.linformer_k), and each query attends to the k projected rows
(the paper's eq. 7):

  out = softmax(q (E K)^T / sqrt(E_head)) (F V),   E K, F V: [k, head_dim]

O(L k E) time and memory instead of O(L^2 E). A sequence shorter than n uses the first L columns
of E and F (E[:, :L], as lucidrains/linformer slices its [n, k] projection `proj_k[:kv_len]`);
a longer one is an error. Padding keys (segment id 0) are zeroed in K and V before projecting,
so they add nothing to E K and F V (the projected rows keep their softmax slots, as in the
paper, which has no mask); a padding query gets 0. The projection mixes every key of the row, so
packed rows (several segments) are not kept apart: use Linformer on one sequence per row.

linformer_sharing (the paper's section 4 options, within one layer):
- 'none': E_h, F_h per kv head, [K, k, n] each;
- 'headwise': one E and one F per layer, [k, n] each, shared by the heads;
- 'kv': one matrix per layer used as both E and F (key-value sharing), [k, n].
The paper's 'layerwise' sharing (one matrix for all layers) needs a parameter outside the
attention block and is rejected. E and F start as U(-1/sqrt(k), 1/sqrt(k)) (lucidrains'
init_).

Encoder only: E K mixes future keys into every projected row, so a causal mask cannot be
applied (the paper's model is bidirectional). Rejected: family 'decoder' and 'encoder_decoder',
logits-bias positions (ALiBi, T5: their bias is per key position, which the projection
removes), softmax's attention_scale/softcap/dropout, decode=True.
Shape letters as in tfjax/nn/axes.py, plus R = the k projected rows, N = model.max_len.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax.nn import axes
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

NAME = "linformer"
SHARINGS = ("none", "headwise", "kv")


@dataclasses.dataclass(frozen=True)
class LinformerConfig(Section):
  """k: projected length; sharing: none | headwise | kv (see the module docstring)."""
  k: int = flat_key("linformer_k", 64)
  sharing: str = flat_key("linformer_sharing", "headwise")

  def validate(self, model) -> None:
    del model
    if not (isinstance(self.k, int) and self.k >= 1):
      raise ValueError(f"model.linformer_k={self.k!r} must be a positive integer (the "
                       "projected length k)")
    if self.sharing == "layerwise":
      raise ValueError("model.linformer_sharing='layerwise' (one projection for all layers) is "
                       "not available: a block owns only its own parameters; choose one of "
                       f"{SHARINGS}")
    if self.sharing not in SHARINGS:
      raise ValueError(f"model.linformer_sharing={self.sharing!r} is invalid; choose one of "
                       f"{SHARINGS}")


def projection_shapes(sharing: str, kv_heads: int, k: int, n: int) -> dict:
  """{parameter name: shape} of one layer's projections."""
  if sharing == "none":
    return {"linformer_e": (kv_heads, k, n), "linformer_f": (kv_heads, k, n)}
  if sharing == "headwise":
    return {"linformer_e": (k, n), "linformer_f": (k, n)}
  return {"linformer_e": (k, n)}


def project(x_BxSxKxE, p_RxN_or_KxRxN):
  """E X along the sequence axis with the first S columns: [B, K, R, E] float32."""
  kv_len = x_BxSxKxE.shape[1]
  n = p_RxN_or_KxRxN.shape[-1]
  if kv_len > n:
    raise ValueError(f"Linformer attention got {kv_len} keys, more than its projection's "
                     f"n = model.max_len = {n}; raise model.max_len or shorten the input")
  p = p_RxN_or_KxRxN[..., :kv_len].astype(jnp.float32)
  spec = "rs,bske->bkre" if p.ndim == 2 else "krs,bske->bkre"
  return jnp.einsum(spec, p, x_BxSxKxE.astype(jnp.float32))


def linformer_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, e_proj, f_proj, *,
                        q_segment_ids_BxT=None, kv_segment_ids_BxS=None):
  """softmax(q (E K)^T / sqrt(E_head)) (F V) [B, T, H, E] float32; e_proj, f_proj: [k, n] or
  [K, k, n]; H = K * G query heads share kv head K // G as GQA does."""
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_heads = k_BxSxKxE.shape[2]
  if kv_segment_ids_BxS is not None:  # padding keys and values add nothing to the projections
    keep_BxSx1x1 = (kv_segment_ids_BxS != 0)[:, :, None, None]
    k_BxSxKxE = jnp.where(keep_BxSx1x1, k_BxSxKxE, 0)
    v_BxSxKxE = jnp.where(keep_BxSx1x1, v_BxSxKxE, 0)
  k_BxKxRxE = project(k_BxSxKxE, e_proj)
  v_BxKxRxE = project(v_BxSxKxE, f_proj)
  q_BxTxKxGxE = q_BxTxHxE.astype(jnp.float32).reshape(batch, q_len, kv_heads, -1, head_dim)
  scores_BxKxGxTxR = jnp.einsum("btkge,bkre->bkgtr", q_BxTxKxGxE, k_BxKxRxE) * head_dim ** -0.5
  probs_BxKxGxTxR = jax.nn.softmax(scores_BxKxGxTxR, axis=-1)
  out_BxTxKxGxE = jnp.einsum("bkgtr,bkre->btkge", probs_BxKxGxTxR, v_BxKxRxE)
  if q_segment_ids_BxT is not None:  # a padding query sees no key (tfjax/nn/masks.py's rule)
    out_BxTxKxGxE = out_BxTxKxGxE * (q_segment_ids_BxT != 0)[:, :, None, None, None]
  return out_BxTxKxGxE.reshape(batch, q_len, heads, head_dim)


def _init(k: int):
  """U(-1/sqrt(k), 1/sqrt(k)) (lucidrains/linformer's init_)."""
  bound = k ** -0.5
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound,
                                                                   bound)


# ---------------------------------------------------------------------------------------------
# The kind: parameters, attend, counts, validation, registration
# ---------------------------------------------------------------------------------------------
def attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias):
  """The heads' outputs [B, T, H, E] by `linformer_attention` with the layer's E and F."""
  del logits_bias  # logits_bias=False: validation rejects ALiBi and T5
  cfg = owner.config
  section = cfg.attention.kind_config
  shapes = projection_shapes(section.sharing, cfg.attention.kv_heads, section.k, cfg.max_len)
  projections = {
      name: owner.param(name, nn.with_logical_partitioning(
          _init(section.k), (axes.KV_HEADS, None, None) if len(shape) == 3 else (None, None)),
                        shape)
      for name, shape in shapes.items()}
  e_proj = projections["linformer_e"]
  f_proj = projections.get("linformer_f", e_proj)  # 'kv': one matrix is both E and F
  out_BxTxHxE = linformer_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, e_proj, f_proj,
                                    q_segment_ids_BxT=visibility.q_segment_ids_BxT,
                                    kv_segment_ids_BxS=visibility.kv_segment_ids_BxS)
  return out_BxTxHxE.astype(q_BxTxHxE.dtype)


def params(cfg: ModelConfig) -> int:
  """E and F of one attention: 2 K k n ('none'), 2 k n ('headwise'), k n ('kv')."""
  section = cfg.attention.kind_config
  shapes = projection_shapes(section.sharing, cfg.attention.kv_heads, section.k, cfg.max_len)
  return sum(math.prod(shape) for shape in shapes.values())


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Per kv head, E K and F V: each key adds into k rows of E head_dim (2 k E each); per query
  head, q (E K)^T and P (F V): 2 k E each; the backward pass twice the forward (x3):
  12 k E (H + K). No seq_len term (a sequence shorter than n uses seq_len columns: the same
  2 k E per token): O(L k E) in all. The softmax over k is not counted."""
  del seq_len
  k, head_dim = cfg.attention.kind_config.k, cfg.dim_per_head
  return 12.0 * k * head_dim * (cfg.attention.num_heads + cfg.attention.kv_heads)


def check(cfg: ModelConfig) -> None:
  if cfg.family != "encoder":
    raise ValueError(
        f"model.attention_kind={NAME!r} is bidirectional: its length projection mixes every "
        "key, future ones included, into each projected row, so no causal mask applies; "
        f"model.family={cfg.family!r} has causal attention, use family='encoder'")
  k = cfg.attention.kind_config.k
  if k > cfg.max_len:
    raise ValueError(f"model.linformer_k={k} exceeds model.max_len={cfg.max_len}: the projection "
                     "would have more rows than the keys it compresses; choose k <= max_len")


LINFORMER = register_attention_kind(AttentionKind(
    NAME, attend=attend, flops_per_token=flops_per_token, params=params, check=check,
    section=LinformerConfig))
