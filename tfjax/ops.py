"""Functional attention: `dot_product_attention` and the mask/bias it applies.

Shapes (suffixes name the axes):
  q_BxTxHxD   queries, T = q_len, H = heads
  k_BxSxKxD   keys,    S = kv_len, K = kv_heads (H % K == 0: GQA/MQA; K/V are never repeated)
  v_BxSxKxD   values
  returns     BxTxHxD

Semantics shared by every implementation (the xla one here is the reference):
  out = softmax(q k^T * scale + M) v,   scale = 1/sqrt(D) unless given.
  Positions: query t sits at absolute position `q_positions[b, t]`, key s at `kv_positions[b, s]`.
    By default keys are at 0..S-1 and queries are aligned to the *end* of the keys
    (query t at S - T + t), which is what decoding and chunked prefill need; with T == S that is
    the usual 0..T-1 for both.
  causal:       key visible iff kv_pos <= q_pos.
  window=W:     sliding causal window, key visible iff 0 <= q_pos - kv_pos < W
                (W keys, the query's own position included).
  segment ids:  0 marks padding. Both given: visible iff ids equal and nonzero (packed sequences).
                Only kv ids: keys with id 0 hidden (e.g. encoder padding seen by cross-attention).
                Only q ids: query rows with id 0 return 0.
  alibi_slopes: [H] or [B, H]; adds -m * |q_pos - kv_pos| (for causal attention this is the
                published -m * (i - j) on every visible key).
  bias:         any additive array broadcastable to [B, H, T, S].
  Rows with no visible key return 0 (never NaN), and their gradients are 0.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import jax
import jax.numpy as jnp

_log = logging.getLogger(__name__)

IMPLEMENTATIONS = ("xla", "chunked", "pallas", "cudnn", "auto")

# Large finite negative instead of -inf: keeps exp() and its gradient NaN-free on masked rows.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def default_positions(q_len: int, kv_len: int):
  """Query/key positions used when none are given: queries aligned to the end of the keys."""
  q_pos = jnp.arange(q_len, dtype=jnp.int32) + (kv_len - q_len)
  kv_pos = jnp.arange(kv_len, dtype=jnp.int32)
  return q_pos[None, :], kv_pos[None, :]


def visibility_mask(*, q_len, kv_len, causal=False, window=None, q_segment_ids=None,
                    kv_segment_ids=None, q_positions=None, kv_positions=None):
  """Boolean mask [B or 1, 1, T, S]: True where query t may attend to key s. None if all visible."""
  default_q, default_kv = default_positions(q_len, kv_len)
  q_pos = default_q if q_positions is None else q_positions
  kv_pos = default_kv if kv_positions is None else kv_positions
  mask = None

  def _and(m, new):
    return new if m is None else jnp.logical_and(m, new)

  if causal or window is not None:
    rel = q_pos[:, :, None] - kv_pos[:, None, :]  # [B, T, S] = i - j
    mask = _and(mask, rel >= 0)
    if window is not None:
      mask = _and(mask, rel < window)
  if q_segment_ids is not None and kv_segment_ids is not None:
    same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
    mask = _and(mask, jnp.logical_and(same, kv_segment_ids[:, None, :] != 0))
  elif kv_segment_ids is not None:
    mask = _and(mask, (kv_segment_ids != 0)[:, None, :])
  elif q_segment_ids is not None:
    mask = _and(mask, (q_segment_ids != 0)[:, :, None])
  if mask is None:
    return None
  return mask[:, None, :, :]


def alibi_bias(alibi_slopes, *, q_len, kv_len, q_positions=None, kv_positions=None):
  """ALiBi additive bias -m * |i - j| as [B or 1, H, T, S] float32."""
  default_q, default_kv = default_positions(q_len, kv_len)
  q_pos = default_q if q_positions is None else q_positions
  kv_pos = default_kv if kv_positions is None else kv_positions
  dist = jnp.abs(q_pos[:, :, None] - kv_pos[:, None, :]).astype(jnp.float32)  # [B, T, S]
  slopes = jnp.asarray(alibi_slopes, jnp.float32)
  slopes = slopes[None, :] if slopes.ndim == 1 else slopes  # [B or 1, H]
  return -slopes[:, :, None, None] * dist[:, None, :, :]


def _check_shapes(q, k, v, alibi_slopes):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
        f"attention expects q [batch, q_len, heads, head_dim] and k/v [batch, kv_len, kv_heads, "
        f"head_dim]; got q {q.shape}, k {k.shape}, v {v.shape}")
  if k.shape != v.shape:
    raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
  if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k must agree in batch and head_dim; got q {q.shape}, k {k.shape}")
  heads, kv_heads = q.shape[2], k.shape[2]
  if heads % kv_heads:
    raise ValueError(
        f"heads ({heads}) must be a multiple of kv_heads ({kv_heads}) for grouped-query attention")
  if alibi_slopes is not None and jnp.shape(alibi_slopes)[-1] != heads:
    raise ValueError(
        f"alibi_slopes has {jnp.shape(alibi_slopes)[-1]} entries but there are {heads} heads")


def attention_logits_mask(q, k, *, causal=False, q_segment_ids=None, kv_segment_ids=None,
                          window=None, alibi_slopes=None, bias=None, scale=None,
                          q_positions=None, kv_positions=None):
  """Masked, scaled logits [B, H, T, S] in float32 and the visibility mask (or None)."""
  batch, q_len, heads, head_dim = q.shape
  kv_len, kv_heads = k.shape[1], k.shape[2]
  scale = head_dim ** -0.5 if scale is None else scale
  group = heads // kv_heads
  if group == 1:  # MHA: see weighted_values for why this is not the GQA einsum with g = 1
    logits = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
  else:
    q_BxTxKxGxD = q.reshape(batch, q_len, kv_heads, group, head_dim)
    logits = jnp.einsum("btkgd,bskd->bkgts", q_BxTxKxGxD, k,
                        preferred_element_type=jnp.float32)
  logits = logits.reshape(batch, heads, q_len, kv_len) * scale
  if alibi_slopes is not None:
    logits = logits + alibi_bias(alibi_slopes, q_len=q_len, kv_len=kv_len,
                                 q_positions=q_positions, kv_positions=kv_positions)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  mask = visibility_mask(q_len=q_len, kv_len=kv_len, causal=causal, window=window,
                         q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                         q_positions=q_positions, kv_positions=kv_positions)
  if mask is not None:
    logits = jnp.where(mask, logits, _MASK_VALUE)
  return logits, mask


def _rows_can_be_empty(q_len, kv_len, *, q_segment_ids=None, kv_segment_ids=None,
                       q_positions=None, kv_positions=None, **_) -> bool:
  """Whether some query row may see no key at all. Not with the default end-aligned positions
  and no segment ids when q_len <= kv_len: causal and window masks always show a query itself."""
  given = (q_segment_ids, kv_segment_ids, q_positions, kv_positions)
  return q_len > kv_len or any(x is not None for x in given)


def attention_weights(q, k, **kwargs):
  """Softmax attention probabilities [B, H, T, S] (float32); fully masked rows are all zero."""
  logits, mask = attention_logits_mask(q, k, **kwargs)
  weights = jax.nn.softmax(logits, axis=-1)
  # A fully masked row would softmax to uniform weights over hidden keys: zero it. The select
  # (and its gradient) is skipped where no row can be empty (~1% of nanoGPT's CPU step).
  if mask is not None and _rows_can_be_empty(q.shape[1], k.shape[1], **kwargs):
    weights = jnp.where(mask, weights, 0.0)
  return weights


def weighted_values(weights_BxHxTxS, v):
  """sum_s weights[b,h,t,s] v[b,s,kv(h),d] -> BxTxHxD, reading each kv head for its query group."""
  batch, heads, q_len, kv_len = weights_BxHxTxS.shape
  kv_heads, head_dim = v.shape[2], v.shape[3]
  if heads == kv_heads:
    # Why not the GQA einsum below with a group axis of size 1: XLA:CPU then lays the batched
    # products and their gradients out with extra transposes (nanoGPT's CPU recipe: ~4% of the
    # train step, docs/benchmarks.md).
    return jnp.einsum("bhts,bshd->bthd", weights_BxHxTxS.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)
  w = weights_BxHxTxS.reshape(batch, kv_heads, heads // kv_heads, q_len, kv_len)
  out = jnp.einsum("bkgts,bskd->btkgd", w.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(batch, q_len, heads, head_dim)


def _xla_attention(q, k, v, *, dropout_rate=0.0, dropout_rng=None, **kwargs):
  weights = attention_weights(q, k, **kwargs)
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("attention dropout_rate > 0 needs a dropout_rng")
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  return weighted_values(weights, v).astype(q.dtype)


# Implementations other than xla register themselves here (see tfjax/kernels/) so that this file
# never imports Pallas; each takes the same arguments as `dot_product_attention` (minus
# `implementation`) and raises ValueError for a combination it does not support.
_REGISTRY: dict[str, Callable] = {"xla": _xla_attention}
_LOGGED: set = set()


def register_implementation(name: str, fn: Callable) -> None:
  _REGISTRY[name] = fn


def _resolve(implementation: str, q_len: int, kv_len: int) -> str:
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"unknown attention implementation {implementation!r}; choose one of {IMPLEMENTATIONS}")
  if implementation == "auto":
    backend = jax.default_backend()
    if backend == "gpu" and "pallas" in _available():
      return "pallas"
    if backend == "cpu" and max(q_len, kv_len) >= 2048 and "chunked" in _available():
      return "chunked"
    return "xla"
  return implementation


def _available():
  """The registry, with the fused implementations registered (imported lazily so that this file
  never imports Pallas unless a fused implementation is asked for)."""
  import tfjax.kernels  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  return _REGISTRY


def dot_product_attention(q, k, v, *, causal: bool = False, q_segment_ids=None,
                          kv_segment_ids=None, window: Optional[int] = None, alibi_slopes=None,
                          bias=None, scale: Optional[float] = None, implementation: str = "xla",
                          q_positions=None, kv_positions=None, dropout_rate: float = 0.0,
                          dropout_rng=None):
  """Multi-head (GQA/MQA) attention; see the module docstring for every argument's meaning.

  `q_positions`/`kv_positions` ([B, T] / [B, S] int) override the default end-aligned positions
  (needed by KV-cache decoding); `dropout_rate`/`dropout_rng` apply dropout to the attention
  weights (xla only: fused implementations refuse it rather than silently ignoring it).
  """
  _check_shapes(q, k, v, alibi_slopes)
  if window is not None and window < 1:
    raise ValueError(f"window must be a positive number of keys, got {window}")
  name = _resolve(implementation, q.shape[1], k.shape[1])
  fns = _available() if name != "xla" else _REGISTRY
  if name not in fns:
    raise ValueError(
        f"attention implementation {name!r} is not available in this install "
        f"(available: {sorted(fns)})")
  if name not in _LOGGED:
    _LOGGED.add(name)
    _log.info("tfjax attention implementation: %s (requested %s)", name, implementation)
  kwargs = dict(causal=causal, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                window=window, alibi_slopes=alibi_slopes, bias=bias, scale=scale,
                q_positions=q_positions, kv_positions=kv_positions)
  if dropout_rate > 0.0:
    if name != "xla":
      raise ValueError(
          f"attention dropout is only supported by implementation='xla', not {name!r}; "
          "set model.attention_dropout=0 or model.attention_impl='xla'")
    kwargs.update(dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  return fns[name](q, k, v, **kwargs)
