"""Parameter accounting: `python -m tfjax.params --config=configs/NAME.py`.

Counts come from `jax.eval_shape` of the model's init (nothing is allocated, so the 7B config runs
on a laptop) and are checked against `analytic_count`, a closed-form count from the config alone.
The last line printed is `total: N`.

  python -m tfjax.params --config=configs/NAME.py --mesh=DATA,FSDP,TENSOR [--seq_len=L]

also prints, before that line, the per-device bytes of parameters, gradients, optimizer state and
activations when training on that mesh (simulated from the mesh sizes and the sharding rules; no
devices needed). See "Per-device memory planning" below and docs/scaling.md.
"""

from __future__ import annotations

import collections
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from tfjax.config import ModelConfig
from tfjax.models import build_model

CATEGORIES = ("embeddings", "attention", "ffn", "norms", "output head")


def _dummy_inputs(cfg: ModelConfig, length: int = 4):
  x = jnp.zeros((1, min(length, cfg.max_len)), jnp.int32)
  return (x, x) if cfg.family == "encoder_decoder" else (x,)


def _shape_model(cfg: ModelConfig):
  # Parameter shapes do not depend on the attention kernel; 'xla' traces on any backend (a
  # 'cudnn' config is planned on a laptop).
  return build_model(cfg.replace(attention_impl="xla"))


def param_shapes(cfg: ModelConfig):
  """The (unboxed) parameter tree as ShapeDtypeStructs, without allocating anything."""
  model = _shape_model(cfg)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *_dummy_inputs(cfg)))
  return nn.meta.unbox(variables["params"])


def _category(path) -> str:
  names = [str(p) for p in path]
  if any(n.endswith("norm") for n in names):
    return "norms"
  if any(n in ("self_attention", "cross_attention") for n in names):
    return "attention"
  if "ffn" in names:
    return "ffn"
  if names[0] == "embed":
    return "embeddings"
  return "output head"


def count_by_category(cfg: ModelConfig) -> dict:
  counts = collections.OrderedDict((c, 0) for c in CATEGORIES)
  for path, leaf in traverse_util.flatten_dict(param_shapes(cfg)).items():
    counts[_category(path)] += int(np.prod(leaf.shape))
  return counts


def analytic_count(cfg: ModelConfig) -> int:
  """Closed-form parameter count, written from the architecture (not from the modules)."""
  d, f, hd = cfg.d_model, cfg.d_ff, cfg.dim_per_head
  h, kv = cfg.num_heads, cfg.kv_heads
  norm = d * (2 if cfg.norm == "layernorm" and cfg.norm_bias else 1)
  attn_bias = (h * hd + 2 * kv * hd + d) if cfg.attention_bias else 0
  attention = d * h * hd * 2 + d * kv * hd * 2 + attn_bias
  ffn_matrices = 3 if cfg.ffn in ("swiglu", "geglu") else 2
  ffn = ffn_matrices * d * f + ((ffn_matrices - 1) * f + d if cfg.ffn_bias else 0)
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  final_norm = norm if cfg.norm_placement == "pre" else 0
  embed = cfg.vocab_size * d + (cfg.max_len * d if cfg.position == "learned" else 0)
  embed += cfg.type_vocab_size * d + (norm if cfg.embed_norm else 0)
  untied_head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
  if cfg.family == "decoder":
    return embed + cfg.num_layers * encoder_layer + final_norm + untied_head
  if cfg.family == "encoder_decoder":
    return (embed + cfg.num_layers * encoder_layer + cfg.decoder_layers * decoder_layer
            + 2 * final_norm + untied_head)
  total = embed + cfg.num_layers * encoder_layer + final_norm
  if cfg.mlm_head:
    total += d * d + d + norm + cfg.vocab_size + untied_head
  if cfg.pooler:
    total += d * d + d
  if cfg.num_classes:
    total += d * cfg.num_classes + cfg.num_classes
  return total


def report(cfg: ModelConfig) -> str:
  counts = count_by_category(cfg)
  total = sum(counts.values())
  expected = analytic_count(cfg)
  if total != expected:  # Would mean a module and the architecture description disagree.
    raise AssertionError(f"module count {total:,} != analytic count {expected:,}")
  width = max(len(c) for c in CATEGORIES)
  lines = [f"{name:<{width}}  {n:>15,}  {100 * n / total:5.1f}%" for name, n in counts.items()]
  lines.append(f"total: {total}")
  return "\n".join(lines)


# ---- FLOPs and MFU ------------------------------------------------------------------------------
# Dense peak FLOP/s per device (bf16 tensor cores, no sparsity), matched against device_kind.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "TPU v4": 275e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token: 6N for the matmul parameters plus the attention scores/values
  (12 * heads * head_dim * seq_len per attention: QK^T and AV, forward x3 for backward; PaLM
  app. B; nanoGPT's estimate_mfu). N leaves out lookup-only tables (positions, token types, and the
  token table if untied). Encoder-decoder: per target token with source length = target length
  = seq_len; a decoder layer attends twice (self and cross)."""
  n = analytic_count(cfg)
  n -= cfg.max_len * cfg.d_model if cfg.position == "learned" else 0
  n -= cfg.type_vocab_size * cfg.d_model
  n -= 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
  attentions = cfg.num_layers + (2 * cfg.decoder_layers if cfg.family == "encoder_decoder" else 0)
  return 6.0 * n + 12.0 * attentions * cfg.num_heads * cfg.dim_per_head * seq_len


def peak_flops(configured: float = 0.0) -> float:
  """Peak FLOP/s of one local device: the configured value, else the table, else 0 (no MFU)."""
  if configured:
    return float(configured)
  kind = jax.devices()[0].device_kind
  for name, flops in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return flops
  return 0.0


# ---- Per-device memory planning -----------------------------------------------------------------
# `python -m tfjax.params --config=... --mesh=DATA,FSDP,TENSOR` adds what one device holds while
# training on that mesh, with no devices: shapes come from jax.eval_shape, the per-device shard of
# every array from the sharding rules and the mesh axis sizes (tfjax.sharding.partition_spec, the
# same function that lays out the real run, so indivisible dimensions are replicated here too).
#
#   params       every parameter's shard (float32)
#   gradients    the same shards again (float32); x2 with gradient accumulation (the running sum
#                plus one micro-batch's gradients)
#   optimizer    every leaf of optimizer.init(params) (Adam: mu and nu, float32, sharded like their
#                parameter; step counters replicated)
#   activations  what the backward pass keeps, for one micro-batch of
#                b = batch_size / grad_accum_steps rows of length s (see activation_arrays):
#                  remat none: n_layers * A_layer                  + A_head
#                  remat full: n_layers * A_input + A_layer        + A_head
#                  remat dots: n_layers * (A_input + A_dots) + (A_layer - A_dots) + A_head
#                where per layer, in elements (c = bytes of model.dtype; probabilities float32):
#                  A_layer = [4*d (two norm inputs and outputs) + 2*h*dh (Q, attention output)
#                             + 2*kv*dh (K, V) + g*f (FFN: g=2 gelu/relu, 3 gated)] * b*s * c
#                            + h*s*s*b * 4 (softmax probabilities; not with chunked/pallas/cudnn)
#                  A_dots  = [(h + 2*kv)*dh + h*dh + 2*d + (g-1)*f] * b*s * c + h*s*s*b * 4
#                  A_input = d * b*s * c  (the layer input, the only thing full remat keeps)
#                  A_head  = 2 * v * b*s * 4  (logits and log-softmax, float32)
#                each array divided over the mesh axes its logical axes map to (batch over
#                data x fsdp; heads, kv_heads, mlp, vocab over tensor; d stays whole: no sequence
#                parallelism). A decoder layer of encoder_decoder adds a cross-attention block.
# Not counted: XLA temporaries and fusion buffers, all-gathered FSDP weights of the layer being
# computed, dropout masks, the input batch. Budget ~10-20% headroom on top.


def boxed_param_shapes(cfg: ModelConfig):
  """The parameter tree with its nn.LogicallyPartitioned boxes (names), as ShapeDtypeStructs."""
  model = _shape_model(cfg)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *_dummy_inputs(cfg)))["params"]


def _nbytes(shape, spec, sizes, itemsize) -> int:
  from tfjax import sharding  # pylint: disable=g-import-not-at-top
  return int(np.prod(sharding.shard_shape(shape, spec, sizes), dtype=np.int64)) * int(itemsize)


def activation_arrays(cfg: ModelConfig, rows: int, seq_len: int, enc_len: int | None = None):
  """{'layer': [...], 'dots': [...], 'input': [...], 'head': [...]}: lists of (logical axes,
  shape, itemsize, count) making up A_layer, A_dots, A_input and A_head above, summed over the
  model's layers by activation_bytes."""
  c = jnp.dtype(cfg.compute_dtype).itemsize
  d, h, kv, dh, f, v = (cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head, cfg.d_ff,
                        cfg.vocab_size)
  b, s = rows, seq_len
  g = 3 if cfg.ffn in ("swiglu", "geglu") else 2
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
  from tfjax import sharding  # pylint: disable=g-import-not-at-top
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
  `mesh_sizes` (data, fsdp, tensor), simulated arithmetically (no devices)."""
  from tfjax import sharding  # pylint: disable=g-import-not-at-top
  rules = sharding.DEFAULT_RULES if rules is None else rules
  sizes = sharding.axis_sizes(mesh_sizes)
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
  rows = batch_size // grad_accum_steps
  return {
      "params": param_bytes,
      "gradients": param_bytes * (2 if grad_accum_steps > 1 else 1),
      "optimizer state": opt_bytes,
      "activations": activation_bytes(cfg, rows, seq_len, sizes, rules, enc_len),
      "devices": int(np.prod(list(sizes.values()))),
      "rows per device": rows / sharding.batch_shards(sizes, rules),
  }


def format_plan(plan: dict, sizes, batch_size: int, seq_len: int, grad_accum_steps: int,
                remat: str) -> str:
  sizes = dict(zip(("data", "fsdp", "tensor"), sizes))
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


def _sequence_lengths(config) -> tuple[int, int | None]:
  """(decoder/LM row length, encoder length or None) of the config's training batches: built
  from the data for synthetic tasks (cheap), else data.seq_len."""
  from tfjax import data  # pylint: disable=g-import-not-at-top
  if config.data.name in data.TEXT_DATASETS:
    return int(config.data.seq_len), None
  batch = data.make_dataset(config.data, config.task).train_batch(0, 1)
  if "decoder_inputs" in batch:
    return int(batch["decoder_inputs"].shape[1]), int(batch["encoder_inputs"].shape[1])
  return int(batch["inputs"].shape[1]), None


def _model_config(config) -> ModelConfig:
  """ModelConfig of a full experiment config; vocab_size=0 (take the data's) is resolved for
  synthetic data and the byte tokenizer."""
  model = dict(config.model)
  if model.get("vocab_size") in (0, None):
    from tfjax import data  # pylint: disable=g-import-not-at-top
    if config.data.name not in data.TEXT_DATASETS:
      model["vocab_size"] = data.make_dataset(config.data, config.task).vocab_size
    elif config.data.tokenizer == "byte":
      model["vocab_size"] = 256
    else:
      raise ValueError("model.vocab_size=0 takes the vocabulary from the data's "
                       f"'{config.data.tokenizer}' tokenizer; give it here with "
                       "--config.model.vocab_size=N")
  return ModelConfig.from_config(model)


def parse_mesh(text: str) -> tuple[int, int, int]:
  sizes = tuple(int(t) for t in text.replace("x", ",").split(","))
  if len(sizes) != 3 or any(n < 1 for n in sizes):
    raise ValueError(f"--mesh={text!r}: give three positive sizes DATA,FSDP,TENSOR, e.g. 1,8,1")
  return sizes


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/NAME.py).")
  _MESH = flags.DEFINE_string(
      "mesh", None, "DATA,FSDP,TENSOR mesh sizes (e.g. 1,8,1): also print per-device memory on "
      "that mesh (simulated; no devices needed).")
  _SEQ_LEN = flags.DEFINE_integer(
      "seq_len", None, "Row length for the activation estimate (default: the config's data).")

  def _main(argv):
    del argv
    try:
      _plan_and_print()
    except ValueError as e:  # a bad --mesh or config: one clear line, no traceback
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  def _plan_and_print():
    config = _CONFIG.value
    cfg = _model_config(config)
    text = report(cfg)
    if _MESH.value:
      from tfjax import sharding  # pylint: disable=g-import-not-at-top
      from tfjax.optimizer import make_optimizer  # pylint: disable=g-import-not-at-top
      sizes = parse_mesh(_MESH.value)
      seq_len, enc_len = _sequence_lengths(config)
      seq_len = _SEQ_LEN.value or seq_len
      accum = config.optimizer.grad_accum_steps
      optimizer, _ = make_optimizer(config.optimizer, config.train.num_steps, cfg.d_model)
      plan = memory_plan(cfg, sizes, batch_size=config.train.batch_size, seq_len=seq_len,
                         optimizer=optimizer, rules=sharding.rules(config),
                         grad_accum_steps=accum, enc_len=enc_len)
      body, last = text.rsplit("\n", 1)
      text = "\n".join([body, format_plan(plan, sizes, config.train.batch_size, seq_len, accum,
                                           cfg.remat), last])  # `total: N` stays the last line
    print(text)

  app.run(_main, argv=sys.argv)
