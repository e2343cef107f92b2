"""BigBird ITC block-sparse attention, `model.attention_kind='bigbird'` (Zaheer et al. 2020).

The sequence of L tokens is cut into n = L / b blocks of b = model.bigbird_block_size tokens.
The first and the last block are global (ITC: internal transformer construction): their queries
see every key, and every query sees their keys. Every other query block i (1 <= i <= n-2) sees
the key blocks

    0 (global), i-1, i, i+1 (a sliding window of 3 blocks), n-1 (global), r random blocks,

r = model.bigbird_num_random_blocks, with the window blocks that are global dropped at i = 1 and
i = n-2. Scores are q k^T / sqrt(head_dim), softmax over that key set, times v. This is Hugging
Face's BigBirdBlockSparseAttention (transformers' modeling_big_bird.py, attention_type=
'block_sparse'), computed the same way: the key and value blocks of each query block are gathered
(a [n-2, 5+r, b] block index table) and attended densely within the gather; no L x L matrix is
formed. Cost per head: 2 b L for the global rows plus (L - 2b)(5 + r) b for the others, so
O(L b (5 + r)) time and memory instead of O(L^2).

Random blocks (`model.bigbird_random`, a per-layer pattern fixed when the step is traced):
  seeded  transformers' training-mode generator, reproduced bit for bit: layer l draws its
          [heads, n-2, r] block table with NumPy seeded by model.bigbird_seed + l (transformers
          seeds layer l with l, so bigbird_seed=0 is its pattern), by its plan (random blocks of
          long sequences drawn from the first 2r+5 blocks; the older per-head plan at L in {1024,
          3072, 4096}, which reads model.max_len as transformers reads max_position_embeddings).
          The same pattern in training and evaluation.
  hf      what transformers computes: `seeded` while training (config.deterministic=False); in
          evaluation (deterministic, transformers' model.eval()) every random block is block 0,
          so block 0's keys are counted r + 1 times in the softmax of rows 1..n-2 (transformers
          makes evaluation deterministic that way). Hugging Face imports set it.
A key block that appears twice in a row's key set (hf evaluation; the 1024/3072/4096 plan may
draw a window block or the last block) is counted twice, as transformers counts it; otherwise
the result equals softmax attention under the dense mask of the pattern
(tests/nn/test_bigbird.py).

Masks: segment ids mark padding (0; its keys are dropped, its queries give zeros, as
transformers' attention_mask) and, in packed rows, documents (a key is seen only by queries of
its own segment). The global and window blocks are the row's, not each document's: BigBird's
pattern is one sequence per row.

Lengths, as transformers defines the model: a sequence of at most (5 + 2r) b tokens is attended
in full (softmax attention by tfjax.nn.ops, model.attention_impl; transformers switches such
inputs to attention_type='original_full', since its pattern needs more blocks than that); a
longer one must be a multiple of b (transformers pads it; tfjax raises, naming the fix). Encoder
family only (bidirectional), no decoding, no logits-bias position kinds (ALiBi, T5), no attention
dropout (transformers' block-sparse path has none), model.scan_layers=False (layers differ by
their random blocks). No parameters beyond W_Q, W_K, W_V, W_O. docs/attention/bigbird.md.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from tfjax.nn import ops
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.choices import one_of
from tfjax.nn.masks import MASK_VALUE, Visibility
from tfjax.nn.sections import Section, flat_key

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig

NAME = "bigbird"
RANDOM_POLICIES = ("seeded", "hf")
# transformers' older random plan applies at these lengths (its "old plans used in paper").
LEGACY_LENGTHS = (1024, 3072, 4096)
# Slots of a middle row's key-block list: global first, window i-1, i, i+1, global last, random.
FIXED_SLOTS = 5


@dataclasses.dataclass(frozen=True)
class BigBirdConfig(Section):
  """model.bigbird_*: block size b, random blocks r per query block, the random-block policy
  (seeded | hf, see the module docstring) and the seed of layer 0's pattern."""
  block_size: int = flat_key("bigbird_block_size", 64)
  num_random_blocks: int = flat_key("bigbird_num_random_blocks", 3)
  random: str = flat_key("bigbird_random", "seeded")
  seed: int = flat_key("bigbird_seed", 0)

  def validate(self, model) -> None:
    one_of("model.bigbird_random", self.random, RANDOM_POLICIES)
    if self.block_size < 1:
      raise ValueError(f"model.bigbird_block_size={self.block_size} must be a positive number "
                       "of tokens per block (BigBird's released models: 64)")
    if self.num_random_blocks < 0:
      raise ValueError(f"model.bigbird_num_random_blocks={self.num_random_blocks} must be >= 0 "
                       "(BigBird's released models: 3)")
    if self.seed < 0:
      raise ValueError(f"model.bigbird_seed={self.seed} must be >= 0 (a NumPy seed)")
    shortest = min_length(self.block_size, self.num_random_blocks)
    if model.max_len < shortest:
      raise ValueError(
          f"model.max_len={model.max_len} is below {shortest}, the shortest sequence that "
          f"takes block-sparse attention with model.bigbird_block_size={self.block_size} and "
          f"model.bigbird_num_random_blocks={self.num_random_blocks} (shorter ones are "
          "attended in full), so the model would never be sparse; raise max_len or lower the "
          "block size or the random blocks")


def min_length(block_size: int, num_random: int) -> int:
  """The shortest block-sparse sequence: the first multiple of b above (5 + 2r) b (transformers
  attends shorter ones in full)."""
  return (6 + 2 * num_random) * block_size


def is_sparse(length: int, block_size: int, num_random: int) -> bool:
  """Whether a sequence of `length` tokens takes block-sparse attention (else full), or a
  ValueError naming the length, the block size and the fix."""
  if length <= (5 + 2 * num_random) * block_size:
    return False
  if length % block_size:
    raise ValueError(
        f"model.attention_kind='bigbird' takes sequences longer than (5 + 2 * "
        f"bigbird_num_random_blocks) * bigbird_block_size = "
        f"{(5 + 2 * num_random) * block_size} tokens in blocks of "
        f"model.bigbird_block_size={block_size}; got length {length}, not a multiple of it: "
        f"pad the sequences to a multiple of {block_size} (padding segment id 0) or change "
        "model.bigbird_block_size")
  return True


# ---- random blocks: transformers' generator (modeling_big_bird.py), with a local RandomState ----

def _row_random(rng, block_id: int, to_start: int, to_end: int, num: int) -> list:
  """transformers' _get_single_block_row_attention: `num` blocks of [to_start, to_end) in a random
  order, skipping the row's window, the range's ends, and (rows 1 and to_end-2) each other."""
  perm = rng.permutation(np.arange(to_start, to_end, dtype=np.int32))
  illegal = set(range(block_id - 1, block_id + 2)) | {0, to_end - 1}
  if block_id == 1:
    illegal.add(to_end - 2)
  if block_id == to_end - 2:
    illegal.add(1)
  return [b for b in perm if b not in illegal][:num]


def _plan(num_blocks: int, num_random: int):
  """transformers' _get_rand_attn_plan in blocks: ([end block of each part], [its r])."""
  if 2 * num_random + 5 < num_blocks:
    return [2 * num_random + 5, num_blocks], [num_random, 0]
  if num_random + 5 < num_blocks:
    return [num_random + 5, num_blocks], [num_random // 2, num_random - num_random // 2]
  return [num_blocks], [num_random]


def _planned(rng, num_blocks: int, heads: int, num_random: int) -> np.ndarray:
  """transformers' _bigbird_block_rand_mask_with_head (one window and global block each side),
  the same draws in the same order: [heads, n-2, r]."""
  ends, counts = _plan(num_blocks, num_random)
  table = np.zeros((heads, num_blocks, sum(counts)), np.int32)

  def fill(rows, to_start, to_end, part):
    lo, hi = sum(counts[:part]), sum(counts[:part + 1])
    for row in rows:
      for h in range(heads):
        table[h, row, lo:hi] = _row_random(rng, row, to_start, to_end, counts[part])

  for part in range(len(ends)):
    if part > 0:
      if counts[part] > 0:
        fill(range(1, ends[part - 1]), ends[part - 1], ends[part], part)
      for earlier in range(part):
        if counts[earlier] > 0:
          fill(range(ends[part - 1], ends[part]), ends[earlier - 1] if earlier else 0,
               ends[earlier], earlier)
    if counts[part] > 0:
      start = ends[part - 1] if part else 0
      fill(range(max(start, 1), ends[part]), start, ends[part], part)
  return table[:, 1:num_blocks - 1]


def _legacy(rng, num_blocks: int, heads: int, num_random: int, max_blocks: int,
            block_size: int) -> np.ndarray:
  """transformers' _bigbird_block_rand_mask (its plan at L in LEGACY_LENGTHS), drawn over
  max_position_embeddings / b blocks with last_idx=1024 for each head in turn: [heads, n-2, r]."""
  middle = np.arange(1, max_blocks - 1, dtype=np.int32)
  last = 1024 // block_size - 1 if 1024 > 2 * block_size else max_blocks - 1
  out = []
  for _ in range(heads):
    table = np.zeros((max_blocks - 2, num_random), np.int32)
    for i in range(1, max_blocks - 1):
      start, end = i - 2, i
      if i in (1, 2):
        pool = middle[i + 1:last]
      elif i in (max_blocks - 3, max_blocks - 2):
        pool = middle[:last]
      elif start > last:
        pool = middle[:last]
      elif end + 1 == last:
        pool = middle[:start]
      else:
        pool = np.concatenate((middle[:start], middle[end + 1:last]))
      table[i - 1, :] = rng.permutation(pool)[:num_random]
    out.append(table[:num_blocks - 2])
  return np.stack(out)


@functools.lru_cache(maxsize=64)
def random_blocks(length: int, block_size: int, num_random: int, heads: int, seed: int,
                  max_len: int) -> np.ndarray:
  """int32 [heads, n-2, r]: the random key blocks of query blocks 1..n-2 under the `seeded`
  policy (transformers' training-mode pattern of the layer whose NumPy seed is `seed`)."""
  rng = np.random.RandomState(seed)
  num_blocks = length // block_size
  if length in LEGACY_LENGTHS:
    table = _legacy(rng, num_blocks, heads, num_random, max_len // block_size, block_size)
  else:
    table = _planned(rng, num_blocks, heads, num_random)
  table.setflags(write=False)  # cached and shared by every caller
  return table


def key_blocks(random_HxMxR: np.ndarray, num_blocks: int):
  """(int32 [H, n-2, 5+r] key blocks of query blocks 1..n-2, bool [n-2, 5+r] slots counted):
  global 0, window i-1, i, i+1, global n-1, then the random blocks; at i = 1 and i = n-2 the
  window block that is a global block is not counted twice (transformers' 4-block rows)."""
  heads, rows, _ = random_HxMxR.shape
  i_M = np.arange(1, num_blocks - 1)
  fixed_MxF = np.stack([np.zeros_like(i_M), i_M - 1, i_M, i_M + 1,
                        np.full_like(i_M, num_blocks - 1)], axis=1)
  idx_HxMxK = np.concatenate(
      [np.broadcast_to(fixed_MxF, (heads, rows, FIXED_SLOTS)), random_HxMxR], axis=2)
  keep_MxK = np.ones(idx_HxMxK.shape[1:], bool)
  keep_MxK[0, 1] = False   # i = 1: window block 0 is the global first block
  keep_MxK[-1, 3] = False  # i = n-2: window block n-1 is the global last block
  return idx_HxMxK.astype(np.int32), keep_MxK


# ---- the math ----

def _to_blocks(x_BxLxHxE, block_size: int):
  """[B, L, H, E] -> [B, H, n, b, E]."""
  batch, length, heads, dim = x_BxLxHxE.shape
  return x_BxLxHxE.reshape(batch, length // block_size, block_size, heads, dim).transpose(
      0, 3, 1, 2, 4)


def block_sparse_attention(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, random_HxMxR, *, block_size: int,
                           q_segment_ids_BxL=None, kv_segment_ids_BxL=None):
  """BigBird ITC attention [B, L, H, E] (the module docstring); random_HxMxR: int [H, n-2, r]
  random key blocks of query blocks 1..n-2. Segment ids: 0 = padding, else a document."""
  batch, length, heads, dim = q_BxLxHxE.shape
  num_blocks = length // block_size
  group = heads // k_BxLxKxE.shape[2]
  if group > 1:  # GQA / MQA: each query head reads its kv head (h // group), as ops.py does
    k_BxLxKxE = jnp.repeat(k_BxLxKxE, group, axis=2)
    v_BxLxKxE = jnp.repeat(v_BxLxKxE, group, axis=2)
  scale = dim ** -0.5  # applied to the float32 scores, as transformers does
  q_BxHxNxbxE = _to_blocks(q_BxLxHxE, block_size)
  k_BxHxNxbxE = _to_blocks(k_BxLxKxE, block_size)
  v_BxHxNxbxE = _to_blocks(v_BxLxKxE, block_size)
  idx_HxMxK, keep_MxK = key_blocks(np.asarray(random_HxMxR), num_blocks)
  head_Hx1x1 = np.arange(heads)[:, None, None]
  # The gathered key / value blocks of each middle query block: [B, H, n-2, 5+r, b, E].
  k_BxHxMxKxbxE = k_BxHxNxbxE[:, head_Hx1x1, idx_HxMxK]
  v_BxHxMxKxbxE = v_BxHxNxbxE[:, head_Hx1x1, idx_HxMxK]
  q_seg_BxL = q_segment_ids_BxL
  kv_seg_BxL = kv_segment_ids_BxL

  # Middle rows: query blocks 1..n-2 over their 5+r key blocks.
  logits_BxHxMxbxKxb = jnp.einsum("bhmqe,bhmkse->bhmqks", q_BxHxNxbxE[:, :, 1:-1],
                                  k_BxHxMxKxbxE, preferred_element_type=jnp.float32) * scale
  mask_1xHxMx1xKx1 = jnp.asarray(keep_MxK)[None, None, :, None, :, None]
  if kv_seg_BxL is not None:
    kv_seg_BxNxb = kv_seg_BxL.reshape(batch, num_blocks, block_size)
    kv_seg_BxHxMxKxb = kv_seg_BxNxb[:, idx_HxMxK]
    seen = (kv_seg_BxHxMxKxb != 0)[:, :, :, None]
    if q_seg_BxL is not None:
      q_seg_BxMxb = q_seg_BxL.reshape(batch, num_blocks, block_size)[:, 1:-1]
      seen = jnp.logical_and(
          seen, q_seg_BxMxb[:, None, :, :, None, None] == kv_seg_BxHxMxKxb[:, :, :, None])
    mask_1xHxMx1xKx1 = jnp.logical_and(mask_1xHxMx1xKx1, seen)
  shape = logits_BxHxMxbxKxb.shape
  logits_BxHxMxbxKxb = jnp.where(mask_1xHxMx1xKx1, logits_BxHxMxbxKxb, MASK_VALUE)
  probs = jax.nn.softmax(logits_BxHxMxbxKxb.reshape(shape[:4] + (-1,)), axis=-1).reshape(shape)
  mid_BxHxMxbxE = jnp.einsum("bhmqks,bhmkse->bhmqe", probs.astype(v_BxLxKxE.dtype),
                             v_BxHxMxKxbxE, preferred_element_type=jnp.float32)

  # Global rows: query blocks 0 and n-1 over every key.
  k_BxHxLxE = k_BxHxNxbxE.reshape(batch, heads, length, dim)
  v_BxHxLxE = v_BxHxNxbxE.reshape(batch, heads, length, dim)
  q_BxHx2xbxE = q_BxHxNxbxE[:, :, np.array([0, num_blocks - 1])]
  logits_BxHx2xbxL = jnp.einsum("bhgqe,bhse->bhgqs", q_BxHx2xbxE, k_BxHxLxE,
                                preferred_element_type=jnp.float32) * scale
  if kv_seg_BxL is not None:
    seen = (kv_seg_BxL != 0)[:, None, None, None, :]
    if q_seg_BxL is not None:
      q_seg_Bx2xb = q_seg_BxL.reshape(batch, num_blocks, block_size)[:, np.array([0, -1])]
      seen = jnp.logical_and(seen, q_seg_Bx2xb[:, None, :, :, None]
                             == kv_seg_BxL[:, None, None, None, :])
    logits_BxHx2xbxL = jnp.where(seen, logits_BxHx2xbxL, MASK_VALUE)
  glob_BxHx2xbxE = jnp.einsum("bhgqs,bhse->bhgqe",
                              jax.nn.softmax(logits_BxHx2xbxL, axis=-1).astype(v_BxLxKxE.dtype),
                              v_BxHxLxE, preferred_element_type=jnp.float32)

  out_BxHxNxbxE = jnp.concatenate(
      [glob_BxHx2xbxE[:, :, :1], mid_BxHxMxbxE, glob_BxHx2xbxE[:, :, 1:]], axis=2)
  out_BxLxHxE = out_BxHxNxbxE.transpose(0, 2, 3, 1, 4).reshape(batch, length, heads, dim)
  if q_seg_BxL is not None:  # padding queries give zeros (transformers' from_mask)
    out_BxLxHxE = out_BxLxHxE * (q_seg_BxL != 0)[:, :, None, None]
  return out_BxLxHxE.astype(q_BxLxHxE.dtype)


# ---- the kind's hooks ----

def layer_index(owner) -> int:
  """The 0-based layer of the calling attention, from its parameter path (`layers_<i>`); 0
  outside a layer stack."""
  for name in reversed(tuple(owner.scope.path)):
    match = re.fullmatch(r"layers_(\d+)", str(name))
    if match:
      return int(match.group(1))
  return 0


def layer_random_blocks(cfg: ModelConfig, length: int, layer: int) -> np.ndarray:
  """The random-block table [H, n-2, r] of layer `layer` under model.bigbird_random."""
  kind_cfg = cfg.attention.kind_config
  heads, num_random = cfg.attention.num_heads, kind_cfg.num_random_blocks
  if kind_cfg.random == "hf" and cfg.deterministic:  # transformers' model.eval(): block 0
    return np.zeros((heads, length // kind_cfg.block_size - 2, num_random), np.int32)
  return random_blocks(length, kind_cfg.block_size, num_random, heads, kind_cfg.seed + layer,
                       cfg.max_len)


def attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility: Visibility, logits_bias):
  """The heads' outputs [B, T, H, E] by `block_sparse_attention`; full softmax attention for
  sequences of at most (5 + 2r) b tokens (transformers' rule)."""
  del logits_bias  # logits_bias=False: validation rejects position kinds that add one
  cfg = owner.config
  kind_cfg = cfg.attention.kind_config
  length = q_BxTxHxE.shape[1]
  if not is_sparse(length, kind_cfg.block_size, kind_cfg.num_random_blocks):
    return ops.dot_product_attention(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE,
                                     implementation=cfg.attention_impl, **visibility.as_kwargs())
  return block_sparse_attention(
      q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, layer_random_blocks(cfg, length, layer_index(owner)),
      block_size=kind_cfg.block_size, q_segment_ids_BxL=visibility.q_segment_ids_BxT,
      kv_segment_ids_BxL=visibility.kv_segment_ids_BxS)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """QK^T and AV (2 * 2 * head_dim per query-key pair, x3 with backward) over the pairs computed:
  2b rows of L keys and L - 2b rows of (5 + r) b keys (the masked duplicate window slot of rows 1
  and n-2 included), per token; L x L at lengths attended in full."""
  kind_cfg = cfg.attention.kind_config
  b, r = kind_cfg.block_size, kind_cfg.num_random_blocks
  pairs = seq_len * seq_len  # full attention up to (5 + 2r) b tokens
  if seq_len > (5 + 2 * r) * b:
    pairs = 2 * b * seq_len + (seq_len - 2 * b) * (FIXED_SLOTS + r) * b
  return 12.0 * cfg.attention.num_heads * cfg.dim_per_head * pairs / seq_len


def check(cfg: ModelConfig) -> None:
  if cfg.family != "encoder":
    raise ValueError(
        f"model.attention_kind='bigbird' is bidirectional block-sparse attention (BigBird ITC), "
        f"an encoder's; model.family={cfg.family!r} needs causal or cross-attention: set "
        "family='encoder' or another attention_kind")
  if cfg.scan_layers:
    raise ValueError(
        "model.attention_kind='bigbird' draws each layer's random blocks with its own seed "
        "(model.bigbird_seed + layer), which nn.scan's identical layers cannot express; set "
        "model.scan_layers=False")


BIGBIRD = register_attention_kind(AttentionKind(
    NAME, attend=attend, flops_per_token=flops_per_token, check=check, section=BigBirdConfig))
