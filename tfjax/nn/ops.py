"""Functional attention: `dot_product_attention`, its reference (xla) implementation, and the
choice between implementations. This is the math of the softmax attention kind
(tfjax/nn/softmax_attention.py); other kinds (tfjax/nn/attention_kinds.py) bring their own.

Shapes (letters as in tfjax/nn/axes.py):
  q_BxTxHxE   queries, T = q_len, H = heads, E = head_dim
  k_BxSxKxE   keys,    S = kv_len, K = kv_heads (H % K == 0: GQA/MQA; K/V are never repeated)
  v_BxSxKxE   values
  returns     BxTxHxE

Semantics shared by every implementation (the xla one here is the reference):
  out = softmax(cap(q k^T * scale) + M) v,   scale = 1/sqrt(E) unless given,
  cap(s) = softcap * tanh(s / softcap) when `softcap` is given (Gemma 2), else s.
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
  Rows with no visible key return 0 (never NaN), and their gradients are 0. This is the one
  convention where tfjax differs from Hugging Face: HF attends normally on a padded query row (its
  pad rows hold some average of visible values); tfjax returns 0 there. Either way those rows are
  padding: no loss, logit or later token reads them, so nothing else depends on the choice.
The position, mask and ALiBi rules live in tfjax/nn/masks.py, which the kernels share; the fused
implementations live in tfjax/nn/kernels/ and are imported only when one is asked for (so importing
this module never imports Pallas).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from tfjax.nn import dropout_hash, sharded_attention
from tfjax.nn.choices import one_of
from tfjax.nn.masks import MASK_VALUE, alibi_bias, visibility_mask

# `implementation` values: xla is this module's reference, auto picks one per backend and length,
# the others are tfjax/nn/kernels/ (model.attention_impl chooses one).
ATTENTION_IMPLS = ("xla", "chunked", "pallas", "cudnn", "auto")
# The implementations that compute `softcap` (cudnn has no logit cap).
SOFTCAP_IMPLS = ("xla", "chunked", "pallas")

__all__ = ["alibi_bias", "attention_logits_mask", "attention_weights", "dot_product_attention",
           "softcap_logits", "visibility_mask", "weighted_values"]

_log = logging.getLogger(__name__)


def _check_shapes(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, alibi_slopes):
  q_shape, k_shape, v_shape = q_BxTxHxE.shape, k_BxSxKxE.shape, v_BxSxKxE.shape
  if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
    raise ValueError(
        f"attention expects q [batch, q_len, heads, head_dim] and k/v [batch, kv_len, kv_heads, "
        f"head_dim]; got q {q_shape}, k {k_shape}, v {v_shape}")
  if k_shape != v_shape:
    raise ValueError(f"k and v must have the same shape; got k {k_shape}, v {v_shape}")
  if q_shape[0] != k_shape[0] or q_shape[-1] != k_shape[-1]:
    raise ValueError(f"q and k must agree in batch and head_dim; got q {q_shape}, k {k_shape}")
  heads, kv_heads = q_shape[2], k_shape[2]
  if heads % kv_heads:
    raise ValueError(
        f"heads ({heads}) must be a multiple of kv_heads ({kv_heads}) for grouped-query attention")
  if alibi_slopes is not None and jnp.shape(alibi_slopes)[-1] != heads:
    raise ValueError(
        f"alibi_slopes has {jnp.shape(alibi_slopes)[-1]} entries but there are {heads} heads")


def softcap_logits(logits, softcap: float):
  """Soft-capping (Gemma 2): softcap * tanh(logits / softcap), smooth and bounded by +-softcap.
  Any shape (attention scores, LM logits)."""
  return softcap * jnp.tanh(logits / softcap)


def attention_logits_mask(q_BxTxHxE, k_BxSxKxE, *, causal=False, q_segment_ids=None,
                          kv_segment_ids=None, window=None, alibi_slopes=None, bias=None,
                          scale=None, q_positions=None, kv_positions=None, softcap=None):
  """Masked, scaled logits [B, H, T, S] in float32 and the visibility mask [B or 1, 1, T, S]
  (or None)."""
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  scale = head_dim ** -0.5 if scale is None else scale
  group = heads // kv_heads
  if group == 1:  # multi-head: no group axis (see weighted_values)
    logits_BxHxTxS = jnp.einsum("bthe,bshe->bhts", q_BxTxHxE, k_BxSxKxE,
                                preferred_element_type=jnp.float32)
  else:  # query head h reads kv head h // G
    q_BxTxKxGxE = q_BxTxHxE.reshape(batch, q_len, kv_heads, group, head_dim)
    logits_BxKxGxTxS = jnp.einsum("btkge,bske->bkgts", q_BxTxKxGxE, k_BxSxKxE,
                                  preferred_element_type=jnp.float32)
    logits_BxHxTxS = logits_BxKxGxTxS.reshape(batch, heads, q_len, kv_len)
  logits_BxHxTxS = logits_BxHxTxS * scale
  if softcap is not None:
    logits_BxHxTxS = softcap_logits(logits_BxHxTxS, softcap)
  if alibi_slopes is not None:
    logits_BxHxTxS = logits_BxHxTxS + alibi_bias(
        alibi_slopes, q_len=q_len, kv_len=kv_len, q_positions=q_positions,
        kv_positions=kv_positions)
  if bias is not None:
    logits_BxHxTxS = logits_BxHxTxS + bias.astype(jnp.float32)
  mask_Bx1xTxS = visibility_mask(q_len=q_len, kv_len=kv_len, causal=causal, window=window,
                                 q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                 q_positions=q_positions, kv_positions=kv_positions)
  if mask_Bx1xTxS is not None:
    logits_BxHxTxS = jnp.where(mask_Bx1xTxS, logits_BxHxTxS, MASK_VALUE)
  return logits_BxHxTxS, mask_Bx1xTxS


def _rows_can_be_empty(q_len, kv_len, *, q_segment_ids=None, kv_segment_ids=None,
                       q_positions=None, kv_positions=None, **_) -> bool:
  """Whether some query row may see no key at all. Not with the default end-aligned positions
  and no segment ids when q_len <= kv_len: causal and window masks always show a query itself."""
  given = (q_segment_ids, kv_segment_ids, q_positions, kv_positions)
  return q_len > kv_len or any(x is not None for x in given)


def attention_weights(q_BxTxHxE, k_BxSxKxE, **kwargs):
  """Softmax attention probabilities [B, H, T, S] (float32); fully masked rows are all zero."""
  logits_BxHxTxS, mask_Bx1xTxS = attention_logits_mask(q_BxTxHxE, k_BxSxKxE, **kwargs)
  weights_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
  # A fully masked row would softmax to uniform weights over hidden keys: zero it. Where no row
  # can be empty the select would change nothing, so it (and its gradient) is left out.
  if mask_Bx1xTxS is not None and _rows_can_be_empty(q_BxTxHxE.shape[1], k_BxSxKxE.shape[1],
                                                     **kwargs):
    weights_BxHxTxS = jnp.where(mask_Bx1xTxS, weights_BxHxTxS, 0.0)
  return weights_BxHxTxS


def weighted_values(weights_BxHxTxS, v_BxSxKxE):
  """sum_s weights[b,h,t,s] v[b,s,h//G,e] -> BxTxHxE (float32), reading each kv head for its
  group of G query heads."""
  batch, heads, q_len, kv_len = weights_BxHxTxS.shape
  kv_heads, head_dim = v_BxSxKxE.shape[2], v_BxSxKxE.shape[3]
  weights_BxHxTxS = weights_BxHxTxS.astype(v_BxSxKxE.dtype)
  if heads == kv_heads:
    # Multi-head attention (G = 1) is written without the group axis: the same products, but a
    # size-1 axis in the batched products makes XLA:CPU lay them and their gradients out with
    # extra transposes (docs/benchmarks/cpu_training.md, "no group axis of size 1").
    return jnp.einsum("bhts,bshe->bthe", weights_BxHxTxS, v_BxSxKxE,
                      preferred_element_type=jnp.float32)
  w_BxKxGxTxS = weights_BxHxTxS.reshape(batch, kv_heads, heads // kv_heads, q_len, kv_len)
  out_BxTxKxGxE = jnp.einsum("bkgts,bske->btkge", w_BxKxGxTxS, v_BxSxKxE,
                             preferred_element_type=jnp.float32)
  return out_BxTxKxGxE.reshape(batch, q_len, heads, head_dim)


def _xla_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, *, dropout_rate=0.0, dropout_seed=None,
                   **kwargs):
  weights_BxHxTxS = attention_weights(q_BxTxHxE, k_BxSxKxE, **kwargs)
  if dropout_rate > 0.0:  # the kernels' mask (tfjax/nn/dropout_hash.py), so they match xla
    keep_BxHxTxS = dropout_hash.keep_mask(dropout_seed, *weights_BxHxTxS.shape, dropout_rate)
    weights_BxHxTxS = jnp.where(keep_BxHxTxS, weights_BxHxTxS / (1.0 - dropout_rate), 0.0)
  return weighted_values(weights_BxHxTxS, v_BxSxKxE).astype(q_BxTxHxE.dtype)


_LOGGED: set = set()


def _implementations() -> Mapping[str, Callable]:
  """Every implementation by name: xla here, the fused ones from `tfjax.nn.kernels.IMPLEMENTATIONS`
  (imported on first use; each takes `dot_product_attention`'s arguments minus `implementation`
  and raises ValueError for a combination it does not support)."""
  import tfjax.nn.kernels  # pylint: disable=g-import-not-at-top
  return {"xla": _xla_attention, **tfjax.nn.kernels.IMPLEMENTATIONS}


def _resolve(implementation: str, q_len: int, kv_len: int, xla_only: bool = False) -> str:
  """The implementation `auto` stands for on this backend and length (xla when an argument only
  xla supports is given: a dense bias); any other name as given. Dropout on the weights and
  soft-capping are no such arguments: every Pallas kernel applies both (tfjax/nn/dropout_hash.py,
  tfjax/nn/kernels/_blocks.soft_cap), chunked caps too, and on CPU, where 'chunked' lacks
  dropout, `dot_product_attention` takes xla instead."""
  one_of("attention implementation", implementation, ATTENTION_IMPLS)
  if implementation != "auto":
    return implementation
  if xla_only:
    return "xla"
  backend = jax.default_backend()
  if backend in ("gpu", "tpu"):  # Triton kernels on GPU, Mosaic ones on TPU
    return "pallas"
  if backend == "cpu" and max(q_len, kv_len) >= 2048:
    return "chunked"  # O(T + S) memory where the T x S weights stop fitting caches
  return "xla"


def dot_product_attention(
    q_BxTxHxE: jax.Array, k_BxSxKxE: jax.Array, v_BxSxKxE: jax.Array, *, causal: bool = False,
    q_segment_ids: Optional[ArrayLike] = None, kv_segment_ids: Optional[ArrayLike] = None,
    window: Optional[int] = None, alibi_slopes: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None, scale: Optional[float] = None, implementation: str = "xla",
    q_positions: Optional[ArrayLike] = None, kv_positions: Optional[ArrayLike] = None,
    dropout_rate: float = 0.0, dropout_rng: Optional[jax.Array] = None,
    softcap: Optional[float] = None) -> jax.Array:
  """Multi-head (GQA/MQA) attention softmax(q k^T * scale + M) v; see the module docstring.

  Args:
    q_BxTxHxE: queries.
    k_BxSxKxE: keys, H a multiple of K.
    v_BxSxKxE: values.
    causal: hide keys after the query's position.
    q_segment_ids: int [B, T]; 0 marks padding (see the module docstring for the rules).
    kv_segment_ids: int [B, S].
    window: sliding causal window of `window` keys, the query's own position included.
    alibi_slopes: [H] or [B, H] ALiBi slopes m: adds -m * |q_pos - kv_pos|.
    bias: additive logits bias broadcastable to [B, H, T, S] (xla only).
    scale: logits scale; 1/sqrt(E) if None.
    implementation: one of ATTENTION_IMPLS: 'xla' (this module), 'chunked',
      'pallas' (Triton kernels on GPU, Mosaic ones on TPU), 'cudnn' (tfjax/nn/kernels/) or
      'auto' (pallas on GPU and TPU, chunked on CPU from 2048 tokens (xla with dropout), else
      xla; a program traced on CPU and lowered for TPU or GPU gets their pallas kernel).
    q_positions: int [B, T] absolute query positions, overriding the end-aligned default
      (KV-cache decoding needs them).
    kv_positions: int [B, S] absolute key positions.
    dropout_rate: dropout on the attention weights (xla and pallas; chunked and cudnn refuse it
      rather than silently ignoring it). The keep mask hashes (seed, batch, head, query, key)
      (tfjax/nn/dropout_hash.py), so xla and the kernels drop the same weights.
    dropout_rng: PRNG key for that dropout; its int32 seed is `dropout_hash.seed_from_key`.
    softcap: soft-cap the scaled scores, softcap * tanh(s / softcap), before biases and masks
      (Gemma 2): xla, chunked and pallas (every Triton, Mosaic GPU and Mosaic TPU kernel,
      forward and backward); cudnn refuses it. A static Python float.

  Returns:
    [B, T, H, E] in q's dtype.
  """
  _check_shapes(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, alibi_slopes)
  if window is not None and window < 1:
    raise ValueError(f"window must be a positive number of keys, got {window}")
  name = _resolve(implementation, q_BxTxHxE.shape[1], k_BxSxKxE.shape[1],
                  xla_only=bias is not None)
  if implementation == "auto" and name == "chunked" and dropout_rate > 0.0:
    name = "xla"  # the plain-JAX chunked attention has no dropout
  fns = _implementations() if name != "xla" else {"xla": _xla_attention}
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
    if name not in ("xla", "pallas"):
      raise ValueError(
          f"attention dropout is only supported by implementation='xla' or 'pallas', not "
          f"{name!r}; set model.attention_dropout=0 or model.attention_impl='xla' (or 'auto')")
    if dropout_rng is None:
      raise ValueError("attention dropout_rate > 0 needs a dropout_rng")
    # One int32 seed from the key: every implementation hashes it into the same mask.
    kwargs.update(dropout_rate=dropout_rate,
                  dropout_seed=dropout_hash.seed_from_key(dropout_rng))
  if softcap is not None:
    if name not in SOFTCAP_IMPLS:
      raise ValueError(
          f"attention soft-capping is only supported by implementation in {SOFTCAP_IMPLS}, not "
          f"{name!r}; set model.attention_impl to one of them (or 'auto')")
    kwargs.update(softcap=softcap)
  fn = fns[name]
  if implementation == "auto" and name in ("xla", "chunked") and jax.default_backend() == "cpu":
    # A CPU host may lower this program for TPU or GPU devices (tfjax.aot): 'auto' then means
    # their Pallas kernel, chosen when lowering; run on CPU it stays `name`.
    from tfjax.nn.kernels.pallas import per_lowering_platform  # pylint: disable=g-import-not-at-top
    fn = functools.partial(per_lowering_platform, fns[name])
  if fn is _xla_attention:
    return fn(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)  # plain JAX: GSPMD partitions it
  # A kernel runs per device under the current mesh (tfjax/nn/sharded_attention.py).
  return sharded_attention.attention(fn, name, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)
