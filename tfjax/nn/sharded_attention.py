"""Attention kernels on a device mesh: every fused implementation of `tfjax.nn.ops` runs per device
inside `shard_map`, so a sharded batch, sharded heads and a sharded sequence all keep the kernel.

Why: XLA's SPMD partitioner cannot split a custom kernel (a Mosaic or Triton call; chunked's scan
with data-dependent tile skipping partitions no better), so on a mesh each device is handed its own
block explicitly. The layout is the run's logical-axis rules (flax's `logical_axis_rules`, the ones
tfjax/training/parallel/sharding.py activates), read when tracing:
  q     [batch, length, heads,    head_dim]
  k, v  [batch, length, kv_heads, head_dim]
  batch     over the mesh axes of 'batch' (data x fsdp by default): every device its own rows;
  heads     over the axes of 'heads' (tensor): every device its heads, with their ALiBi slopes
            and dropout keys;
  kv_heads  over the same axes when they divide K. GQA / MQA with fewer kv heads than shards (the
            shard count a multiple of K) keep K/V whole on every shard, and each shard reads the
            one kv head its query heads share;
  length    over the axes of 'length' (context), below.
Only mesh axes of size > 1 that are not manual already (inside the shard_map of the CPU training
step's flat gradient all-reduce, 'data' is) are used. A dimension an axis does not divide stays
whole on that axis: every device of it then computes the same block, as GSPMD would have.

Dropout. The keep mask hashes (seed, batch, head, query, key) (tfjax/nn/dropout_hash.py). Its
per-(batch, head) keys are computed for the whole [B, H] before the split and sliced like q, so
each device drops exactly the weights the one-device program drops. Over a context axis the keys
are gathered from 0 and each query chunk passes its start as the Pallas kernels'
`dropout_q_offset`, so the indices are the sequence's there too (chunked has no dropout; xla
with dropout is left to GSPMD).

The context axis (sequence parallelism). Each device holds a contiguous block of every sequence.
Its queries need every key, so K/V (with their positions and segment ids) are all-gathered over
the context axis; the backward pass reduce-scatters their gradients back (the transpose of
all_gather). Under a causal or window mask the blocks of a sequence see unequal numbers of keys
(the first one block, the last all of them). The queries are therefore re-dealt in zigzag order
(as Megatron's context parallelism does): the sequence is cut into 2C chunks and device i works
on chunks i and 2C-1-i, so every device has the same number of visible keys. Two ppermutes carry
the query chunks there and the outputs back. Masks and ALiBi read global positions:
  * xla and chunked take explicit positions, formed for the whole sequence before the split (the
    defaults or the caller's); chunked skips the tiles they hide.
  * The Pallas kernels (Triton, Mosaic GPU, Mosaic TPU) and cudnn take default positions only
    (queries aligned to the end of the keys). Each dealt chunk c of C queries is therefore called
    with exactly the keys [0, (c+1) C) it may see, which puts its queries at their global
    positions (`_chunk_calls`); the kernel skips the blocks above the diagonal as on one device.
    Without a causal mask every query sees every key and one call takes them all; ALiBi there
    (distances from a block in the middle) is refused by name.

All-gather, not a ring (Liu et al. 2023): per device and layer both receive (C-1)/C of the
sequence's K/V, so the bytes are the same; a ring hides the transfers behind C kernel calls and
holds two K/V blocks instead of the whole sequence's. The all-gather calls each kernel once per
query chunk with no online-softmax merge across calls (the kernels' own forward and backward, as
on one device), and the gathered K/V of one layer (2 * L * K * E elements) is small next to the
layer's activations kept for the backward pass. docs/scaling/context.md gives the bytes per device
and per step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from tfjax.nn import dropout_hash, masks

# Implementations that take explicit query / key positions (the others: `_chunk_calls`).
POSITION_IMPLS = ("xla", "chunked")

Axes = tuple  # mesh axis names; () = not split


def _size(sizes: dict, axes: Axes) -> int:
  return math.prod(sizes[a] for a in axes)


def _spec_entry(axes: Axes):
  return None if not axes else axes[0] if len(axes) == 1 else axes


def _axes_of(logical: str, rules, free: dict) -> Axes:
  """The free mesh axes (size > 1, not manual) the rules put logical axis `logical` on."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top  (ops must not import Pallas)
  entry = nn.logical_to_mesh_axes((logical,), rules)[0]
  entry = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  return tuple(a for a in entry if a in free)


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one attention call is split over the mesh (each entry: mesh axes, () = whole)."""
  batch: Axes = ()
  heads: Axes = ()
  kv_heads: Axes = ()       # () with heads split: K/V whole, each shard picks its kv head
  q_length: Axes = ()       # the context axes, when the query length is split
  kv_length: Axes = ()      # the context axes, when K/V are gathered over them
  balance: bool = False     # zigzag the query chunks (causal or window masks)

  @property
  def split(self) -> bool:
    return bool(self.batch or self.heads or self.q_length or self.kv_length)

  @property
  def context(self) -> bool:
    return bool(self.q_length or self.kv_length)


def _auto_axes() -> dict:
  """{name: size} of the current mesh's axes that are not manual already."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return {}
  manual = set(getattr(mesh, "manual_axes", ()))
  return {a: s for a, s in mesh.shape.items() if a not in manual}


def free_axes() -> dict:
  """{name: size} of the current mesh's axes a shard_map may split now: size > 1, not manual."""
  return {a: s for a, s in _auto_axes().items() if s > 1}


def layout(q_shape, k_shape, *, causal: bool, window: Optional[int], rules=None,
           free: Optional[dict] = None) -> Layout:
  """The split of an attention call with these q [B, T, H, E] and k [B, S, K, E] shapes under the
  current mesh and rules (or `free` axis sizes and `rules` given)."""
  free = free_axes() if free is None else free
  if rules is None:
    import flax.linen as nn  # pylint: disable=g-import-not-at-top  (ops must not import Pallas)
    rules = nn.get_logical_axis_rules()
  if not free or not rules:
    return Layout()
  batch, q_len, heads, _ = q_shape
  kv_len, kv_heads = k_shape[1], k_shape[2]
  batch_axes = _axes_of("batch", rules, free)
  if batch % _size(free, batch_axes):
    batch_axes = ()
  used = set(batch_axes)
  head_axes = tuple(a for a in _axes_of("heads", rules, free) if a not in used)
  shards = _size(free, head_axes)
  if heads % shards or (kv_heads % shards and shards % kv_heads):
    head_axes, shards = (), 1  # e.g. 6 kv heads on 4 shards: no whole group per shard
  kv_axes = head_axes if kv_heads % shards == 0 else ()
  used |= set(head_axes)
  ctx = tuple(a for a in _axes_of("length", rules, free) if a not in used)
  c = _size(free, ctx)
  balance = bool(causal or window is not None)
  q_ctx = ctx if q_len % (2 * c if balance else c) == 0 else ()
  if balance and q_len != kv_len:  # causal queries not at the keys' positions (decoding with a
    q_ctx = ()                     # cache): every device takes them all, end-aligned as ever
  kv_ctx = ctx if kv_len % c == 0 else ()
  if ctx and q_len == kv_len and q_len > 1 and not q_ctx:
    raise ValueError(
        f"a sequence of {q_len} tokens does not split over the context axis {ctx} of size {c}"
        f"{' into 2 x ' + str(c) + ' zigzag chunks (causal balance)' if balance else ''}; "
        f"make data.seq_len a multiple of {2 * c if balance else c}")
  return Layout(batch_axes, head_axes, kv_axes, q_ctx, kv_ctx, balance and bool(q_ctx) and c > 1)


def _zigzag_perms(n: int):
  """ppermute pairs moving each device's first and second half-block (chunks 2i, 2i+1 of 2n) to
  the device that works on it: chunk c goes to c if c < n else 2n-1-c."""
  target = lambda c: c if c < n else 2 * n - 1 - c  # pylint: disable=unnecessary-lambda-assignment
  return ([(i, target(2 * i)) for i in range(n)], [(i, target(2 * i + 1)) for i in range(n)])


def _deal(x, axis: int, axes: Axes, n: int, inverse: bool = False):
  """Zigzag re-deal of `x`'s `axis` (halves to their working devices), or its inverse."""
  first, second = jnp.split(x, 2, axis=axis)
  perms = _zigzag_perms(n)
  if inverse:
    perms = tuple([(d, s) for s, d in p] for p in perms)
  return jnp.concatenate([lax.ppermute(first, axes, perms[0]),
                          lax.ppermute(second, axes, perms[1])], axis=axis)


def _chunk_calls(fn: Callable, q, k, v, extra: dict, axes: Axes, n: int):
  """Causal attention of this device's two dealt query chunks against the gathered keys, by a
  kernel that takes default positions only (queries aligned to the end of the keys).

  After the deal device d holds chunk a = d (d even) or 2n-1-d (d odd) in its first half (an
  even chunk) and the other in its second (an odd chunk). Chunk c of C queries sees keys
  [0, (c+1) C): called with exactly those keys, the end alignment puts its queries at their
  global positions, so causal and window masks, ALiBi distances and segment ids are exact and
  the kernel skips the blocks above the diagonal. The key count is static per chunk, so each
  half is a `lax.switch` over its n possible chunks (one kernel instance each)."""
  d = lax.axis_index(axes)
  chunk = q.shape[1] // 2
  first_chunk = jnp.where(d % 2 == 0, d, 2 * n - 1 - d)
  q_halves = jnp.split(q, 2, axis=1)
  q_ids = extra.get("q_segment_ids")
  q_id_halves = (None, None) if q_ids is None else jnp.split(q_ids, 2, axis=1)
  kv_ids = extra.get("kv_segment_ids")
  shared = {key: extra[key] for key in ("alibi_slopes", "dropout_seed") if key in extra}

  def call(c, q_c, q_ids_c):
    keys = (c + 1) * chunk
    more = dict(shared)
    if "dropout_seed" in more:  # the hash's query index: the chunk's place in the sequence
      more["dropout_q_offset"] = c * chunk
    if q_ids_c is not None:
      more["q_segment_ids"] = q_ids_c
    if kv_ids is not None:
      more["kv_segment_ids"] = kv_ids[:, :keys]
    return fn(q_c, k[:, :keys], v[:, :keys], **more)

  outs = []
  for half, index in enumerate((first_chunk, 2 * n - 1 - first_chunk)):
    branches = [functools.partial(call, c) for c in range(half, 2 * n, 2)]  # its parity's chunks
    outs.append(lax.switch(index // 2, branches, q_halves[half], q_id_halves[half]))
  return jnp.concatenate(outs, axis=1)


def _offset_calls(fn: Callable, q, k, v, extra: dict, axes: Axes, n: int):
  """`fn` on this device's contiguous query block (no causal mask), with dropout hashing the
  block's global query indices: a `lax.switch` over the n static offsets."""
  branches = [functools.partial(fn, dropout_q_offset=i * q.shape[1]) for i in range(n)]
  return lax.switch(lax.axis_index(axes), [lambda q, k, v, e, f=f: f(q, k, v, **e)
                                           for f in branches], q, k, v, extra)


def _pick_kv_head(x_BxSxKxE, head_axes: Axes, shards: int):
  """The kv head of this shard's query heads (K/V whole; `shards` a multiple of K)."""
  kv_heads = x_BxSxKxE.shape[2]
  index = lax.axis_index(head_axes) * kv_heads // shards
  return lax.dynamic_slice_in_dim(x_BxSxKxE, index, 1, axis=2)


def attention(fn: Callable, name: str, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs):
  """`fn(q, k, v, **kwargs)` (an implementation of tfjax.nn.ops with its keyword arguments), per
  device under the current mesh when the layout splits anything, else called as it is."""
  if kwargs.get("bias") is not None:  # a dense [B, H, T, S] bias is xla's: GSPMD partitions it
    return fn(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)
  lay = layout(q_BxTxHxE.shape, k_BxSxKxE.shape, causal=kwargs.get("causal", False),
               window=kwargs.get("window"))
  if not lay.split:
    return fn(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, **kwargs)
  by_chunks = lay.context and name not in POSITION_IMPLS  # default positions: _chunk_calls
  if by_chunks and not lay.balance and lay.q_length and kwargs.get("alibi_slopes") is not None:
    raise ValueError(
        f"attention_impl={name!r} over a context axis with ALiBi and no causal mask: the kernel "
        f"takes default (end-aligned) positions, which a block of queries in the middle of the "
        f"sequence does not have; use model.attention_impl='chunked' or mesh.context=1")
  if by_chunks and lay.balance and name == "cudnn":
    raise ValueError(
        "attention_impl='cudnn' over a context axis with a causal or window mask: each device's "
        "query chunks see a prefix of the keys, which cuDNN's top-left-aligned causal mask does "
        "not express; use model.attention_impl='pallas' (or 'auto') or 'chunked'")
  if lay.context and not by_chunks and kwargs.get("dropout_rate", 0.0) > 0.0:
    raise ValueError(
        f"attention dropout over a context axis with implementation {name!r}: its dropout hash "
        f"would read block-local query indices; set model.attention_impl='pallas' (which takes "
        f"each block's offset) or 'xla', model.attention_dropout=0 or mesh.context=1")
  free = free_axes()
  batch, q_len, heads, _ = q_BxTxHxE.shape
  kv_len = k_BxSxKxE.shape[1]
  B, H = _spec_entry(lay.batch), _spec_entry(lay.heads)  # pylint: disable=invalid-name
  Tq, Skv = _spec_entry(lay.q_length), _spec_entry(lay.kv_length)  # pylint: disable=invalid-name

  operands, specs = {}, {}

  def add(key, value, spec):
    if value is not None:
      operands[key], specs[key] = value, spec

  def rows(x):  # the batch entry of an array whose leading axis is the batch or a broadcast 1
    return B if jnp.shape(x)[0] == batch else None

  if lay.context and not by_chunks:  # global positions, formed before the split
    q_pos, kv_pos = masks.query_key_positions(q_len, kv_len, kwargs.pop("q_positions", None),
                                              kwargs.pop("kv_positions", None))
    add("q_positions", jnp.asarray(q_pos, jnp.int32), P(rows(q_pos), Tq))
    add("kv_positions", jnp.asarray(kv_pos, jnp.int32), P(rows(kv_pos), Skv))
  else:
    add("q_positions", kwargs.pop("q_positions", None), None)
    add("kv_positions", kwargs.pop("kv_positions", None), None)
    for key in ("q_positions", "kv_positions"):
      if key in operands:
        specs[key] = P(rows(operands[key]), None)
  q_ids = kwargs.pop("q_segment_ids", None)
  kv_ids = kwargs.pop("kv_segment_ids", None)
  add("q_segment_ids", q_ids, P(rows(q_ids), Tq) if q_ids is not None else None)
  add("kv_segment_ids", kv_ids, P(rows(kv_ids), Skv) if kv_ids is not None else None)
  slopes = kwargs.pop("alibi_slopes", None)
  if slopes is not None:
    slopes = jnp.asarray(slopes)
    add("alibi_slopes", slopes, P(H) if slopes.ndim == 1 else P(rows(slopes), H))
  seed = kwargs.pop("dropout_seed", None)
  if seed is not None:  # the whole [B, H] of per-(batch, head) keys, sliced like q
    add("dropout_seed", dropout_hash.head_keys(seed, batch, heads), P(B, H))
  static = kwargs
  head_shards = _size(free, lay.heads)
  pick_kv = bool(lay.heads) and not lay.kv_heads
  n_ctx = _size(free, lay.q_length)

  def local(q, k, v, extra):
    if pick_kv:
      k, v = (_pick_kv_head(x, lay.heads, head_shards) for x in (k, v))
    if lay.kv_length:
      def gather(x):
        return lax.all_gather(x, lay.kv_length, axis=1, tiled=True)
      k, v = gather(k), gather(v)
      for key in ("kv_positions", "kv_segment_ids"):
        if key in extra:
          extra[key] = gather(extra[key])
    if lay.balance:
      q = _deal(q, 1, lay.q_length, n_ctx)
      for key in ("q_positions", "q_segment_ids"):
        if key in extra:
          extra[key] = _deal(extra[key], 1, lay.q_length, n_ctx)
    if by_chunks and lay.balance:
      out = _chunk_calls(functools.partial(fn, **static), q, k, v, extra, lay.q_length, n_ctx)
    elif by_chunks and lay.q_length and "dropout_seed" in extra:
      out = _offset_calls(functools.partial(fn, **static), q, k, v, extra, lay.q_length, n_ctx)
    else:
      out = fn(q, k, v, **extra, **static)
    return _deal(out, 1, lay.q_length, n_ctx, inverse=True) if lay.balance else out

  q_spec = P(B, Tq, H, None)
  kv_spec = P(B, Skv, _spec_entry(lay.kv_heads), None)
  # Manual over every axis left (those not split hold copies): a Mosaic kernel may not sit in
  # a computation the partitioner still shards automatically, even over a size-1 axis.
  axes = frozenset(_auto_axes())
  mapped = jax.shard_map(local, in_specs=(q_spec, kv_spec, kv_spec, specs), out_specs=q_spec,
                         axis_names=axes, check_vma=False)
  return mapped(q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, operands)
