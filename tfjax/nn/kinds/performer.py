"""Performer FAVOR+ attention, `model.attention_kind='performer'` (Choromanski et al. 2021,
"Rethinking Attention with Performers"; docs/attention/performer.md).

Softmax attention's kernel exp(q.k / sqrt(E)) is estimated with m positive random features
(FAVOR+, the paper's eq. 5 with h(x) = exp(-|x|^2 / 2)): with x' = x * E^-1/4 and the rows w_i of
an m x E projection W,

  phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m),   E_W[phi(q) . phi(k)] = exp(q.k / sqrt(E)),

so attention is out_t = phi(q_t) S / phi(q_t) . z, with S = sum_s phi(k_s) v_s^T [m, E] and
z = sum_s phi(k_s) [m] over the keys query t sees: O(L m E) time instead of O(L^2 E).
- bidirectional (encoders, cross-attention): one S and z per sequence (per segment with
  packed segment ids: jax.ops.segment_sum over S + 1 slots, ids as tfjax/data/packing.py
  makes them, 0 = padding);
- causal (decoders): the sums S_t, z_t over s <= t, restarted where the segment id changes
  (segments are contiguous runs, as packing makes them), in chunks of at most CHUNK positions
  (`causal_attention`): inside a chunk the masked C x C form of the features, across chunks one
  (S, z) state per chunk (a segmented associative scan over the chunks). No T x S matrix and no
  [m, E] sum per position (the per-position prefix sums, `causal_sums`, serve decoding only).
Keys of segment id 0 (padding) drop out of the sums.

W is orthogonal random features (the paper's section 2.4, the reference's
GaussianOrthogonalRandomMatrix with scaling=0): stacked blocks of E orthonormal rows (QR of a
Gaussian E x E matrix), each row rescaled by an independent chi(E) norm (the norm of a Gaussian
E-vector), so each row is marginally Gaussian. One W per layer, shared by its heads.

Numerical stabilization (the reference, google-research/performer fast_attention, subtracts
max_i w_i.x per query row and one max over the keys before exp): every shift below is constant
over what the ratio sums, so it cancels exactly between numerator and denominator.
- queries: each row's own max over features of the exponent w.q' - |q'|^2/2 (its top feature is
  exactly 1, so a query's features never all underflow);
- keys, bidirectional: the max of the key exponents over the visible keys of the sequence (of
  the segment when segment ids are given), per batch row and kv head;
- keys, causal: the running max over s <= t, carried through the scan (the partial sums are
  rescaled by exp(c_old - c_new) as online softmax does; in a chunk, each query's own max over
  the keys it sees), so no future key moves an earlier output: the causal form is exactly
  causal. The shifts carry no gradient (they cancel).
No epsilon is added to the features (the reference adds 1e-6, which biases the estimate); a
query that sees no key (all padding) gets 0.

performer_kernel='relu' is the paper's generalized kernel phi(x) = relu(W x) / sqrt(m) (no
scaling of x, no stabilizer needed): linear attention, not an estimate of softmax.

Feature redraw (performer_redraw): 'fixed' draws W from performer_seed folded with the
module's path (per layer; with scan_layers=True the layers are one scanned module, so they
share one W), the same in training, eval and under jit: once per process, eagerly and outside
any mesh (a constant of the compiled step, also inside the CPU data-parallel shard_map).
'step' redraws W on every training forward pass (config.deterministic=False) from the training
step's 'dropout' rng stream (the one rng tfjax/training/loop/steps.py passes; make_rng folds in the
layer's path and nn.scan splits it per layer), and uses the 'fixed' W in eval: the paper's
periodic redraw at period 1.

Decoding (decode=True): causal self-attention keeps the running (c, S, z) per kv head in the
'cache' collection, O(m E) whatever the length (`decode_step`); cross-attention caches the
encoder's keys and values (tfjax/nn/kv_cache.py) and recomputes their sums each step.

Rejected: logits-bias positions (ALiBi, T5: the bias is not a product of features), sliding
windows (model.window) and softmax's attention_scale/softcap/dropout.
Shape letters as in tfjax/nn/axes.py, plus M = features, G = query heads per kv head.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import kv_cache
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.choices import one_of
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

NAME = "performer"
KERNELS = ("softmax", "relu")
REDRAWS = ("fixed", "step")
_NEG = -1e30  # finite "no key yet" shift: exp(_NEG - c) is 0 and never inf - inf
CHUNK = 64  # causal form: at most this many positions per chunk (`causal_attention`)


@dataclasses.dataclass(frozen=True)
class PerformerConfig(Section):
  """features: m random features per layer; kernel: softmax (FAVOR+) | relu; redraw: fixed |
  step (see the module docstring); seed: the fixed draw's seed."""
  features: int = flat_key("performer_features", 256)
  kernel: str = flat_key("performer_kernel", "softmax")
  redraw: str = flat_key("performer_redraw", "fixed")
  seed: int = flat_key("performer_seed", 0)

  def validate(self, model) -> None:
    del model
    if not (isinstance(self.features, int) and self.features >= 1):
      raise ValueError(f"model.performer_features={self.features!r} must be a positive "
                       "integer (the number m of random features)")
    one_of("model.performer_kernel", self.kernel, KERNELS)
    one_of("model.performer_redraw", self.redraw, REDRAWS)
    if not (isinstance(self.seed, int) and self.seed >= 0):
      raise ValueError(f"model.performer_seed={self.seed!r} must be a non-negative integer")


# ---------------------------------------------------------------------------------------------
# The math, as pure functions
# ---------------------------------------------------------------------------------------------
def orthogonal_projection_MxE(rng, num_features: int, head_dim: int):
  """W [m, E] float32: ceil(m / E) blocks of E orthonormal rows, truncated to m rows, each scaled
  by the norm of an independent Gaussian E-vector (chi(E)). Each block is Q of the QR of a
  Gaussian matrix with R's diagonal made positive (Mezzadri 2007): without that sign fix,
  Householder QR's Q is not Haar-distributed (its first row always has a negative first entry),
  and the features' estimate is biased."""
  blocks = -(-num_features // head_dim)
  block_rng, norm_rng = jax.random.split(rng)
  g_NxExE = jax.random.normal(block_rng, (blocks, head_dim, head_dim), jnp.float32)
  q_NxExE, r_NxExE = jnp.linalg.qr(g_NxExE)
  signs_NxE = jnp.sign(jnp.diagonal(r_NxExE, axis1=1, axis2=2))
  rows_NxExE = jnp.swapaxes(q_NxExE * signs_NxE[:, None, :], 1, 2)  # Q's columns as rows
  w_MxE = rows_NxExE.reshape(blocks * head_dim, head_dim)[:num_features]
  norms_M = jnp.linalg.norm(
      jax.random.normal(norm_rng, (num_features, head_dim), jnp.float32), axis=1)
  return w_MxE * norms_M[:, None]


def feature_exponents(x_BxLxKxE, w_MxE):
  """w.x' - |x'|^2 / 2 with x' = x E^-1/4: [B, L, K, M] float32 (phi = exp of it / sqrt(m));
  K is any heads axis (query or kv heads)."""
  x_BxLxKxE = x_BxLxKxE.astype(jnp.float32) * x_BxLxKxE.shape[-1] ** -0.25
  proj_BxLxKxM = jnp.einsum("blke,me->blkm", x_BxLxKxE, w_MxE)
  return proj_BxLxKxM - 0.5 * jnp.sum(jnp.square(x_BxLxKxE), -1, keepdims=True)


def query_features(q_BxTxHxE, w_MxE, kernel: str):
  """phi(q) [B, T, H, M]: exp(e - the row's max e) / sqrt(m) (softmax), relu(W q) / sqrt(m)."""
  m = w_MxE.shape[0]
  if kernel == "relu":
    proj_BxTxHxM = jnp.einsum("bthe,me->bthm", q_BxTxHxE.astype(jnp.float32), w_MxE)
    return jax.nn.relu(proj_BxTxHxM) / math.sqrt(m)
  e_BxTxHxM = feature_exponents(q_BxTxHxE, w_MxE)
  shift_BxTxHx1 = jax.lax.stop_gradient(jnp.max(e_BxTxHxM, -1, keepdims=True))
  return jnp.exp(e_BxTxHxM - shift_BxTxHx1) / math.sqrt(m)


def key_features(k_BxSxKxE, w_MxE, kernel: str, visible_BxS):
  """(phi(k) [B, S, K, M], shift a [B, S, K]): softmax features are exp(e - a_s) / sqrt(m), a_s
  the key's own max exponent (no gradient); the caller brings them to a common shift c by
  exp(a_s - c). relu features have a_s = 0. Invisible keys: phi = 0, a = _NEG."""
  m = w_MxE.shape[0]
  if kernel == "relu":
    phi_BxSxKxM = jax.nn.relu(
        jnp.einsum("bske,me->bskm", k_BxSxKxE.astype(jnp.float32), w_MxE)) / math.sqrt(m)
    a_BxSxK = jnp.zeros(phi_BxSxKxM.shape[:3], jnp.float32)
  else:
    e_BxSxKxM = feature_exponents(k_BxSxKxE, w_MxE)
    a_BxSxK = jax.lax.stop_gradient(jnp.max(e_BxSxKxM, -1))
    phi_BxSxKxM = jnp.exp(e_BxSxKxM - a_BxSxK[..., None]) / math.sqrt(m)
  if visible_BxS is not None:
    phi_BxSxKxM = phi_BxSxKxM * visible_BxS[:, :, None, None]
    a_BxSxK = jnp.where(visible_BxS[:, :, None], a_BxSxK, _NEG)
  return phi_BxSxKxM, a_BxSxK


def _ratio(phi_q_BxTxKxGxM, s_BxTxKxMxE, z_BxTxKxM):
  """phi(q) S / phi(q) . z per query (0 where the query sees no key: z = 0)."""
  num_BxTxKxGxE = jnp.einsum("btkgm,btkme->btkge", phi_q_BxTxKxGxM, s_BxTxKxMxE)
  den_BxTxKxG = jnp.einsum("btkgm,btkm->btkg", phi_q_BxTxKxGxM, z_BxTxKxM)
  safe_BxTxKxG = jnp.where(den_BxTxKxG > 0, den_BxTxKxG, 1.0)
  return jnp.where((den_BxTxKxG > 0)[..., None], num_BxTxKxGxE / safe_BxTxKxG[..., None], 0.0)


def _combine(left, right):
  """Associative step of the causal scan: segmented (a start drops the left part) sums whose
  shift c is the running max; each side is rescaled to the common shift."""
  c_l, s_l, z_l, start_l = left
  c_r, s_r, z_r, start_r = right
  c = jnp.where(start_r, c_r, jnp.maximum(c_l, c_r))
  scale_l = jnp.where(start_r, 0.0, jnp.exp(c_l - c))
  scale_r = jnp.exp(c_r - c)
  return (c, s_l * scale_l[..., None, None] + s_r * scale_r[..., None, None],
          z_l * scale_l[..., None] + z_r * scale_r[..., None], jnp.logical_or(start_l, start_r))


def causal_sums(phi_k_BxSxKxM, a_BxSxK, v_BxSxKxE, starts_BxS, initial=None):
  """Prefix sums over s <= t within a segment: (c_t [B, S, K], S_t [B, S, K, M, E], z_t
  [B, S, K, M]), S and z scaled by exp(-c_t), c_t the running max of the key shifts (cancels in
  the ratio). `initial`: (c, S, z) of the keys before these (a decoding cache), else none."""
  kv_BxSxKxMxE = jnp.einsum("bskm,bske->bskme", phi_k_BxSxKxM, v_BxSxKxE.astype(jnp.float32))
  elements = (a_BxSxK, kv_BxSxKxMxE, phi_k_BxSxKxM,
              jnp.broadcast_to(starts_BxS[:, :, None], a_BxSxK.shape))
  if initial is not None:  # the cached sums as element 0, continued by the new keys
    elements = tuple(jnp.concatenate([first[:, None], rest], axis=1) for first, rest in
                     zip(initial + (jnp.zeros(a_BxSxK[:, 0].shape, bool),), elements))
  c_BxSxK, s_BxSxKxMxE, z_BxSxKxM, _ = jax.lax.associative_scan(_combine, elements, axis=1)
  if initial is not None:
    return c_BxSxK[:, 1:], s_BxSxKxMxE[:, 1:], z_BxSxKxM[:, 1:]
  return c_BxSxK, s_BxSxKxMxE, z_BxSxKxM


def _chunks(x, chunk: int, fill=None):
  """[B, L, ...] -> [B, N, C, ...], L padded up to N * C with `fill` (None: x's last position)."""
  pad = -x.shape[1] % chunk
  if pad:
    tail = x[:, -1:] if fill is None else jnp.full_like(x[:, -1:], fill)
    x = jnp.concatenate([x, jnp.repeat(tail, pad, axis=1)], axis=1)
  return x.reshape(x.shape[0], -1, chunk, *x.shape[2:])


def _before(x_BxN, fill):
  """Each chunk's value of the chunk before it (`fill` for the first): [B, N, ...]."""
  return jnp.concatenate([jnp.full_like(x_BxN[:, :1], fill), x_BxN[:, :-1]], axis=1)


def chunk_length(length: int, most: int = CHUNK) -> int:
  """C of the chunked causal form: the fewest chunks of at most `most` positions, evened out (66
  positions: 2 chunks of 33, not 64 + 2 padded to 128)."""
  chunks = -(-length // most)
  return -(-length // chunks)


def causal_attention(phi_q_BxTxKxGxM, phi_k_BxSxKxM, a_BxSxK, v_BxSxKxE, starts_BxS, *,
                     chunk: int = CHUNK):
  """Causal FAVOR+ [B, T, K, G, E] float32 in chunks of C positions: within a chunk the masked
  quadratic form of the features (phi(q_t) . phi(k_s) for the s <= t of t's segment: C x C per
  chunk), across chunks the sums (c, S, z) of the chunks before (one [m, E] state per chunk, a
  segmented associative scan over the N = L / C chunks). `chunk`: the most positions per chunk.

  The numbers of the prefix sums (`causal_sums`): key s weighs exp(a_s - c_t) for query t, c_t
  the running max of the key shifts over the s <= t of t's segment, so no future key moves an
  earlier output. Unlike them it never holds an [m, E] sum per position ([B, L, K, m, E], with
  ~2 log2(L) passes over it in the scan): O(L (C + E) m) time per head, O(L m E / C) memory."""
  batch, length = starts_BxS.shape
  chunk = chunk_length(length, chunk)
  seg_BxNxC = _chunks(jnp.cumsum(starts_BxS, axis=1), chunk)  # equal ids: the same segment
  phi_q = _chunks(phi_q_BxTxKxGxM, chunk, 0.0)  # [B, N, C, K, G, M]
  phi_k = _chunks(phi_k_BxSxKxM, chunk, 0.0)  # [B, N, C, K, M]; padding keys add nothing
  a_BxNxCxK = _chunks(a_BxSxK, chunk, _NEG)
  v = _chunks(v_BxSxKxE.astype(jnp.float32), chunk, 0.0)  # [B, N, C, K, E]
  # Each chunk's state: the sums of its keys in its last segment, shifted by their max; it
  # continues the state before it unless a segment starts inside the chunk.
  last_BxN = seg_BxNxC[:, :, -1]
  tail_BxNxCx1 = (seg_BxNxC == last_BxN[..., None])[..., None]
  c_end_BxNxK = jnp.max(jnp.where(tail_BxNxCx1, a_BxNxCxK, _NEG), axis=2)
  phi_tail = phi_k * jnp.where(tail_BxNxCx1, jnp.exp(jnp.minimum(
      a_BxNxCxK - c_end_BxNxK[:, :, None], 0.0)), 0.0)[..., None]
  starts_BxNxK = jnp.broadcast_to((last_BxN != _before(last_BxN, 0))[..., None],
                                  c_end_BxNxK.shape)
  c_BxNxK, s_BxNxKxMxE, z_BxNxKxM, _ = jax.lax.associative_scan(_combine, (
      c_end_BxNxK, jnp.einsum("bnskm,bnske->bnkme", phi_tail, v), jnp.sum(phi_tail, axis=2),
      starts_BxNxK), axis=1)
  # Query t of chunk n sees the state after chunk n - 1 if it is in that state's segment, and the
  # keys s <= t of its own segment in its chunk; c_t: the max of their shifts.
  c_prev_BxNxK = _before(c_BxNxK, _NEG)
  carried_BxNxCx1 = (seg_BxNxC == _before(last_BxN, -1)[..., None])[..., None]
  visible_BxNxCxC = (jnp.tril(jnp.ones((chunk, chunk), bool))
                     & (seg_BxNxC[..., :, None] == seg_BxNxC[..., None, :]))
  c_BxNxCxK = jnp.maximum(
      jnp.max(jnp.where(visible_BxNxCxC[..., None], a_BxNxCxK[:, :, None], _NEG), axis=3),
      jnp.where(carried_BxNxCx1, c_prev_BxNxK[:, :, None], _NEG))
  scale_BxNxCxK = jnp.where(carried_BxNxCx1, jnp.exp(jnp.minimum(
      c_prev_BxNxK[:, :, None] - c_BxNxCxK, 0.0)), 0.0)
  weight_BxNxCxCxK = jnp.where(visible_BxNxCxC[..., None], jnp.exp(jnp.minimum(
      a_BxNxCxK[:, :, None] - c_BxNxCxK[:, :, :, None], 0.0)), 0.0)  # (t, s): exp(a_s - c_t)
  scores = jnp.einsum("bntkgm,bnskm->bntskg", phi_q, phi_k) * weight_BxNxCxCxK[..., None]
  num = (jnp.einsum("bntskg,bnske->bntkge", scores, v)
         + jnp.einsum("bntkgm,bnkme->bntkge", phi_q, _before(s_BxNxKxMxE, 0.0))
         * scale_BxNxCxK[..., None, None])
  den = (jnp.sum(scores, axis=3)
         + jnp.einsum("bntkgm,bnkm->bntkg", phi_q, _before(z_BxNxKxM, 0.0))
         * scale_BxNxCxK[..., None])
  safe = jnp.where(den > 0, den, 1.0)
  out = jnp.where((den > 0)[..., None], num / safe[..., None], 0.0)
  return out.reshape(batch, -1, *out.shape[3:])[:, :length]


def favor_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, w_MxE, *, causal: bool, kernel: str,
                    q_segment_ids_BxT=None, kv_segment_ids_BxS=None, chunk: int = CHUNK):
  """FAVOR+ attention [B, T, H, E] float32 for the projection w_MxE (see the module docstring);
  H = K * G query heads share kv head K // G as GQA does. `chunk`: the causal form's most
  positions per chunk (`causal_attention`)."""
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_len, kv_heads = k_BxSxKxE.shape[1], k_BxSxKxE.shape[2]
  groups = heads // kv_heads
  visible_BxS = None if kv_segment_ids_BxS is None else kv_segment_ids_BxS != 0
  phi_q_BxTxKxGxM = query_features(q_BxTxHxE, w_MxE, kernel).reshape(
      batch, q_len, kv_heads, groups, -1)
  phi_k_BxSxKxM, a_BxSxK = key_features(k_BxSxKxE, w_MxE, kernel, visible_BxS)
  v_BxSxKxE = v_BxSxKxE.astype(jnp.float32)
  if causal:
    if q_len != kv_len:
      raise ValueError(f"causal Performer attention needs as many queries as keys, got "
                       f"{q_len} and {kv_len} (decoding continues cached sums: decode_step)")
    seg_BxS = kv_segment_ids_BxS if kv_segment_ids_BxS is not None else q_segment_ids_BxT
    starts_BxS = jnp.zeros((batch, kv_len), bool)
    if seg_BxS is not None:
      starts_BxS = starts_BxS.at[:, 1:].set(seg_BxS[:, 1:] != seg_BxS[:, :-1])
    out_BxTxKxGxE = causal_attention(phi_q_BxTxKxGxM, phi_k_BxSxKxM, a_BxSxK, v_BxSxKxE,
                                     starts_BxS, chunk=chunk)
  elif q_segment_ids_BxT is not None and kv_segment_ids_BxS is not None:
    s_BxTxKxMxE, z_BxTxKxM = _segment_sums(phi_k_BxSxKxM, a_BxSxK, v_BxSxKxE,
                                           kv_segment_ids_BxS, q_segment_ids_BxT)
  else:
    c_Bx1xK = jnp.max(a_BxSxK, axis=1, keepdims=True)  # one shift per sequence and kv head
    phi_k_BxSxKxM = phi_k_BxSxKxM * jnp.exp(a_BxSxK - c_Bx1xK)[..., None]
    s_BxTxKxMxE = jnp.einsum("bskm,bske->bkme", phi_k_BxSxKxM, v_BxSxKxE)[:, None]
    z_BxTxKxM = jnp.sum(phi_k_BxSxKxM, axis=1)[:, None]
  if not causal:
    out_BxTxKxGxE = _ratio(phi_q_BxTxKxGxM, s_BxTxKxMxE, z_BxTxKxM)
  if q_segment_ids_BxT is not None:  # a padding query sees no key (tfjax/nn/masks.py's rule)
    out_BxTxKxGxE = out_BxTxKxGxE * (q_segment_ids_BxT != 0)[:, :, None, None, None]
  return out_BxTxKxGxE.reshape(batch, q_len, heads, head_dim)


def _segment_sums(phi_k_BxSxKxM, a_BxSxK, v_BxSxKxE, kv_segment_ids_BxS, q_segment_ids_BxT):
  """Per-segment S and z (jax.ops.segment_sum over S + 1 ids per row), each scaled by its
  segment's max key shift, gathered at every query's segment id: [B, T, K, M, E], [B, T, K, M]."""
  batch, kv_len = kv_segment_ids_BxS.shape
  slots = kv_len + 1  # ids 0..S: packing numbers at most S segments in a row of S tokens
  ids_N = (jnp.arange(batch)[:, None] * slots + kv_segment_ids_BxS).reshape(-1)
  n = batch * slots
  c_NxK = jax.ops.segment_max(a_BxSxK.reshape(ids_N.shape[0], -1), ids_N, num_segments=n)
  scale_BxSxK = jnp.exp(a_BxSxK - c_NxK[ids_N].reshape(a_BxSxK.shape))
  phi_k_BxSxKxM = phi_k_BxSxKxM * scale_BxSxK[..., None]
  kv_BxSxKxMxE = jnp.einsum("bskm,bske->bskme", phi_k_BxSxKxM, v_BxSxKxE)
  keys = batch * kv_len  # the flattened (row, key) axis that ids_N labels
  s_NxKxMxE = jax.ops.segment_sum(kv_BxSxKxMxE.reshape(keys, *kv_BxSxKxMxE.shape[2:]), ids_N,
                                  num_segments=n)
  z_NxKxM = jax.ops.segment_sum(phi_k_BxSxKxM.reshape(keys, *phi_k_BxSxKxM.shape[2:]), ids_N,
                                num_segments=n)
  q_ids_BxT = jnp.arange(batch)[:, None] * slots + q_segment_ids_BxT
  return s_NxKxMxE[q_ids_BxT], z_NxKxM[q_ids_BxT]


# ---------------------------------------------------------------------------------------------
# The kind: projection draw, attend, FLOPs, validation, registration
# ---------------------------------------------------------------------------------------------
def fixed_projection_MxE(seed: int, path: tuple, num_features: int, head_dim: int):
  """The 'fixed' W of the attention module at `path` (its flax scope path): performer_seed
  folded with a CRC-32 of the path, so each layer draws its own, identically every call. A NumPy
  constant of the compiled step (not a QR per layer in every step), drawn once per process."""
  layer = zlib.crc32("/".join(path).encode()) & 0x7FFFFFFF
  return _fixed_draw(seed, layer, num_features, head_dim)


@functools.lru_cache(maxsize=None)
def _fixed_draw(seed: int, layer: int, num_features: int, head_dim: int) -> np.ndarray:
  """W of `fixed_projection_MxE`, computed eagerly and outside any mesh context: the caller may be
  tracing inside shard_map (the CPU data-parallel step, cpu_fusion.summed_over_shards), whose
  abstract mesh has manual axes, and an eager op there fails in JAX (`assert not
  hlo_sharding.is_manual()`)."""
  no_mesh = jax.sharding.AbstractMesh((), ())
  with jax.sharding.use_abstract_mesh(no_mesh), jax.ensure_compile_time_eval():
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), layer)
    w_MxE = np.asarray(orthogonal_projection_MxE(rng, num_features, head_dim))
  w_MxE.setflags(write=False)  # shared by every call (lru_cache)
  return w_MxE


def projection_MxE(owner, head_dim: int):
  """W of this call: redrawn from the 'dropout' stream in a training forward pass with
  performer_redraw='step', else the layer's fixed draw."""
  section = owner.config.attention.kind_config
  if section.redraw == "step" and not owner.config.deterministic:
    if not owner.has_rng("dropout"):
      raise ValueError("model.performer_redraw='step' redraws the features from the 'dropout' "
                       "rng in a training forward pass (deterministic=False): pass "
                       "rngs={'dropout': key} to apply, or set performer_redraw='fixed'")
    return orthogonal_projection_MxE(owner.make_rng("dropout"), section.features, head_dim)
  return fixed_projection_MxE(section.seed, tuple(owner.scope.path), section.features, head_dim)


def decode_step(owner, q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, w_MxE, kernel: str, visibility):
  """Causal self-attention of T new tokens (prefill or one step) continuing the running sums
  (c, S, z) kept in the 'cache' collection (O(m E) per kv head, whatever the length), which
  it then advances. Padding tokens (segment id 0) add no key; starts never reset the sums."""
  batch, q_len, heads, head_dim = q_BxTxHxE.shape
  kv_heads, m = k_BxTxKxE.shape[2], w_MxE.shape[0]
  shift = owner.variable("cache", "performer_shift",
                         lambda: jnp.full((batch, kv_heads), _NEG, jnp.float32))
  sums = owner.variable("cache", "performer_s", jnp.zeros, (batch, kv_heads, m, head_dim))
  norms = owner.variable("cache", "performer_z", jnp.zeros, (batch, kv_heads, m))
  seg_BxT = visibility.q_segment_ids_BxT
  visible_BxT = None if seg_BxT is None else seg_BxT != 0
  phi_k_BxTxKxM, a_BxTxK = key_features(k_BxTxKxE, w_MxE, kernel, visible_BxT)
  c_BxTxK, s_BxTxKxMxE, z_BxTxKxM = causal_sums(
      phi_k_BxTxKxM, a_BxTxK, v_BxTxKxE, jnp.zeros((batch, q_len), bool),
      initial=(shift.value, sums.value, norms.value))
  if not owner.is_initializing():  # init builds the empty cache
    shift.value, sums.value, norms.value = c_BxTxK[:, -1], s_BxTxKxMxE[:, -1], z_BxTxKxM[:, -1]
  phi_q_BxTxKxGxM = query_features(q_BxTxHxE, w_MxE, kernel).reshape(
      batch, q_len, kv_heads, heads // kv_heads, m)
  out_BxTxKxGxE = _ratio(phi_q_BxTxKxGxM, s_BxTxKxMxE, z_BxTxKxM)
  if visible_BxT is not None:
    out_BxTxKxGxE = out_BxTxKxGxE * visible_BxT[:, :, None, None, None]
  return out_BxTxKxGxE.reshape(batch, q_len, heads, head_dim)


def cache(owner, k_new_BxTxKxE, v_new_BxTxKxE, positions_BxT, visibility, *, cross: bool):
  """The `cache` hook: cross-attention caches the encoder's keys and values as softmax does
  (tfjax/nn/kv_cache.py; their sums are recomputed each step, O(S m E)); causal self-attention
  hands its new keys to `attend`, which keeps the running sums (`decode_step`)."""
  if cross:
    return kv_cache.step(owner, k_new_BxTxKxE, v_new_BxTxKxE, positions_BxT, visibility,
                         cross=True)
  return k_new_BxTxKxE, v_new_BxTxKxE, visibility


def attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias):
  """The heads' outputs [B, T, H, E] by FAVOR+ (`favor_attention`, or `decode_step` while
  decoding causal self-attention)."""
  del logits_bias  # logits_bias=False: validation rejects ALiBi and T5
  w_MxE = projection_MxE(owner, q_BxTxHxE.shape[-1])
  kernel = owner.config.attention.kind_config.kernel
  if owner.config.decode and visibility.causal:
    out_BxTxHxE = decode_step(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, w_MxE, kernel, visibility)
  else:
    out_BxTxHxE = favor_attention(
        q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, w_MxE, causal=visibility.causal, kernel=kernel,
        q_segment_ids_BxT=visibility.q_segment_ids_BxT,
        kv_segment_ids_BxS=visibility.kv_segment_ids_BxS)
  return out_BxTxHxE.astype(q_BxTxHxE.dtype)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Per query head: W q (2 m E), phi(q) S (2 m E), phi(q) . z (2 m); per kv head: W k (2 m E),
  phi(k) v^T into S (2 m E), phi(k) into z (m); the backward pass twice the forward (x3). The
  prefix sums of the causal form add the same m E + m per key. No seq_len term: O(L m E) in
  all. Elementwise exp / relu and the stabilizer's max are not counted."""
  del seq_len
  m, head_dim = cfg.attention.kind_config.features, cfg.dim_per_head
  forward = (cfg.attention.num_heads * (4 * m * head_dim + 2 * m)
             + cfg.attention.kv_heads * (4 * m * head_dim + m))
  return 3.0 * forward


def check(cfg: ModelConfig) -> None:
  if cfg.attention.window is not None:
    raise ValueError(
        f"model.window={cfg.attention.window} is a sliding window, which "
        f"model.attention_kind={NAME!r} cannot take (its prefix sums run over every earlier "
        "key); set model.window=None")


PERFORMER = register_attention_kind(AttentionKind(
    NAME, attend=attend, flops_per_token=flops_per_token, cache=cache, check=check,
    section=PerformerConfig))
