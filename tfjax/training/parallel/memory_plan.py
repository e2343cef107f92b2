"""Per-device memory planning: what one device holds while training on a mesh, with no devices.

`python -m tfjax.params --config=... --mesh=DATA,FSDP,TENSOR` prints this plan. Shapes come from
jax.eval_shape, the per-device shard of every array from the sharding rules and the mesh axis
sizes (tfjax.training.parallel.sharding.partition_spec, the same function that lays out the real
run, so indivisible dimensions are replicated here too).

  params       every parameter's shard (float32)
  gradients    the same shards again (float32); x2 with gradient accumulation (the running sum
               plus one micro-batch's gradients)
  optimizer    every leaf of optimizer.init(params) (Adam: mu and nu, float32, sharded like their
               parameter; step counters replicated)
  activations  what the backward pass keeps, for one micro-batch of
               b = batch_size / grad_accum_steps rows of length s (see activation_arrays):
                 remat none: n_layers * A_layer                  + A_head
                 remat full: n_layers * A_input + A_layer        + A_head
                 remat dots: n_layers * (A_input + A_dots) + (A_layer - A_dots) + A_head
               where per layer, in elements (c = bytes of model.dtype; probabilities float32):
                 A_layer = [4*d (two norm inputs and outputs) + 2*h*dh (Q, attention output)
                            + 2*kv*dh (K, V) + g*f (FFN: g=2 gelu/relu, 3 gated)] * b*s * c
                           + h*s*s*b * 4 (softmax probabilities; not with chunked/pallas/cudnn)
                 A_dots  = [(h + 2*kv)*dh + h*dh + 2*d + (g-1)*f] * b*s * c + h*s*s*b * 4
                 A_input = d * b*s * c  (the layer input, the only thing full remat keeps)
                 A_head  = 2 * v * b*s * 4  (logits and log-softmax, float32)
               each array divided over the mesh axes its logical axes map to (batch over
               data x fsdp; heads, kv_heads, mlp, vocab over tensor; the length over context;
               d stays whole). A decoder layer of encoder_decoder adds a cross-attention block.
Not counted: XLA temporaries and fusion buffers, all-gathered FSDP weights of the layer being
computed, dropout masks, the input batch. Budget ~10-20% headroom on top.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfjax.training.parallel import sharding
from tfjax.nn.config import GATED_FFNS, ModelConfig
from tfjax.training.accounting.params import boxed_param_shapes


def _nbytes(shape, spec, sizes, itemsize) -> int:
  return int(np.prod(sharding.shard_shape(shape, spec, sizes), dtype=np.int64)) * int(itemsize)


def activation_arrays(cfg: ModelConfig, rows: int, seq_len: int, enc_len: int | None = None):
  """{'layer': [...], 'dots': [...], 'input': [...], 'head': [...]}: lists of (logical axes,
  shape, itemsize, count) making up A_layer, A_dots, A_input and A_head above, summed over the
  model's layers by activation_bytes."""
  c = jnp.dtype(cfg.compute_dtype).itemsize
  d, h, kv, dh, f, v = (cfg.d_model, cfg.attention.num_heads, cfg.attention.kv_heads,
                        cfg.dim_per_head, cfg.feed_forward.d_ff, cfg.vocab_size)
  b, s = rows, seq_len
  g = 3 if cfg.feed_forward.activation in GATED_FFNS else 2
  materialized = cfg.attention_impl in ("xla", "auto")  # auto: counted (upper bound)
  x = (("batch", "length", "embed"), (b, s, d), c)
  q = (("batch", "length", "heads", "head_dim"), (b, s, h, dh), c)
  kv_ = (("batch", "length", "kv_heads", "head_dim"), (b, s, kv, dh), c)
  mlp = (("batch", "length", "mlp"), (b, s, f), c)

  def attention(kv_len):
    kv_x = (kv_[0], (b, kv_len, kv, dh), c)
    probs = [(("batch", "heads", "length", None), (b, h, s, kv_len), 4, 1)] if materialized else []
    layer = [x + (2,), q + (2,), kv_x + (2,)] + probs
    dots = [q + (2,), kv_x + (2,), x + (1,)] + probs
    return layer, dots

  def layer_sets(kv_len, cross_len=None):
    layer, dots = attention(kv_len)
    if cross_len is not None:
      cross_layer, cross_dots = attention(cross_len)
      layer, dots = layer + cross_layer, dots + cross_dots
    layer = layer + [x + (2,), mlp + (g,)]
    dots = dots + [x + (1,), mlp + (g - 1,)]
    return layer, dots

  head = [(("batch", "length", "vocab"), (b, s, v), 4, 2)] if cfg.family != "encoder" or \
      cfg.mlm_head else []
  out = {"input": [x + (1,)], "head": head}
  if cfg.family == "encoder_decoder":
    enc = enc_len or seq_len
    xe = (x[0], (b, enc, d), c)
    enc_layer, enc_dots = layer_sets(enc)
    enc_layer = [(a, (b, enc) + sh[2:], it, n) if sh[:2] == (b, s) else (a, sh, it, n)
                 for a, sh, it, n in enc_layer]
    enc_dots = [(a, (b, enc) + sh[2:], it, n) if sh[:2] == (b, s) else (a, sh, it, n)
                for a, sh, it, n in enc_dots]
    dec_layer, dec_dots = layer_sets(s, enc)
    out.update(enc_layer=enc_layer, enc_dots=enc_dots, enc_input=[xe + (1,)], layer=dec_layer,
               dots=dec_dots)
    out["head"] = out["head"] + [xe + (1,)]  # the encoder output, read by every decoder layer
  else:
    out["layer"], out["dots"] = layer_sets(s)
  return out


def activation_bytes(cfg: ModelConfig, rows: int, seq_len: int, sizes: dict, rules,
                     enc_len: int | None = None) -> int:
  """Per-device bytes kept for the backward pass (the formula above)."""
  arrays = activation_arrays(cfg, rows, seq_len, enc_len)

  def total(key):
    return sum(n * _nbytes(shape, sharding.partition_spec(shape, axes, rules, sizes), sizes, it)
               for axes, shape, it, n in arrays.get(key, []))

  def stack(prefix, num_layers):
    layer, dots, inp = total(prefix + "layer"), total(prefix + "dots"), total(prefix + "input")
    if cfg.remat == "full":
      return num_layers * inp + layer
    if cfg.remat == "dots":
      return num_layers * (inp + dots) + (layer - dots)
    return num_layers * layer

  result = stack("", cfg.decoder_layers if cfg.family == "encoder_decoder" else cfg.num_layers)
  if cfg.family == "encoder_decoder":
    result += stack("enc_", cfg.num_layers)
  return result + total("head")


def memory_plan(cfg: ModelConfig, mesh_sizes, *, batch_size: int, seq_len: int,
                optimizer=None, rules=None, grad_accum_steps: int = 1,
                enc_len: int | None = None) -> dict:
  """Per-device bytes of params, gradients, optimizer state and activations on a mesh of
  `mesh_sizes` (data, fsdp, tensor[, context]), simulated arithmetically (no devices)."""
  rules = sharding.DEFAULT_RULES if rules is None else rules
  sizes = sharding.axis_sizes(mesh_sizes)
  # First what training itself would refuse: laying out the params warns about each dimension
  # the mesh does not divide, noise before this error.
  rows = batch_size // grad_accum_steps
  shards = sharding.batch_shards(sizes, rules)
  if batch_size % grad_accum_steps or rows % shards:  # what training itself would refuse
    raise ValueError(
        f"train.batch_size={batch_size} (/ {grad_accum_steps} micro-batches = "
        f"{batch_size / grad_accum_steps:g} rows) does not split over the {shards} batch shards "
        f"of mesh {dict(sizes)}; use a batch size that is a multiple of "
        f"{shards * grad_accum_steps}, or another mesh")
  boxed = boxed_param_shapes(cfg)
  specs = sharding.logical_specs(boxed, rules, sizes)
  params = nn.meta.unbox(boxed)
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
  leaf_bytes = lambda leaf, spec: _nbytes(leaf.shape, spec, sizes, leaf.dtype.itemsize)  # noqa
  param_bytes = sum(jax.tree.leaves(jax.tree.map(leaf_bytes, params, specs)))
  opt_bytes = 0
  if optimizer is not None:
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_specs = sharding.follow_params(opt_state, specs, jax.sharding.PartitionSpec(), is_spec)
    opt_bytes = sum(jax.tree.leaves(jax.tree.map(leaf_bytes, opt_state, opt_specs)))
  return {
      "params": param_bytes,
      "gradients": param_bytes * (2 if grad_accum_steps > 1 else 1),
      "optimizer state": opt_bytes,
      "activations": activation_bytes(cfg, rows, seq_len, sizes, rules, enc_len),
      "devices": int(np.prod(list(sizes.values()))),
      "rows per device": rows // shards,
  }


def format_plan(plan: dict, sizes, batch_size: int, seq_len: int, grad_accum_steps: int,
                remat: str) -> str:
  sizes = sharding.axis_sizes(sizes)
  if sizes.get("context", 1) == 1:  # printed as before the axis existed
    sizes.pop("context", None)
  mesh = " ".join(f"{k}={v}" for k, v in sizes.items())
  micro = f" in {grad_accum_steps} micro-batches" if grad_accum_steps > 1 else ""
  lines = [f"per-device memory, mesh {mesh} ({plan['devices']} devices), batch {batch_size} x "
           f"seq {seq_len}{micro} ({plan['rows per device']:g} rows per device), remat "
           f"{remat}:"]
  keys = ("params", "gradients", "optimizer state", "activations")
  for key in keys + ("sum",):
    n = sum(plan[k] for k in keys) if key == "sum" else plan[key]
    lines.append(f"  {key + ':':<17}{n:>18,} bytes {n / 2**30:>10.3f} GiB")
  return "\n".join(lines)
