"""Parameter accounting (its command line, `python -m tfjax.params --config=configs/NAME.py`, is
tfjax/training/entry/params_main.py).

FLOPs per token and MFU are tfjax/training/accounting/flops.py; the per-device memory plan is
tfjax/training/parallel/memory_plan.py.
Counts come from `jax.eval_shape` of the model's init (nothing is allocated, so the 7B config runs
on a laptop) and are checked against `analytic_count`, a closed-form count from the config alone.
The last line printed is `total: N`. The modality configs (configs/vit_synthetic.py, clip_,
whisper_, funnel_: tfjax/modalities) get the same breakdown from their own model's init shapes
(`modality_report`); the memory plan below covers the text families only.

  python -m tfjax.params --config=configs/NAME.py --mesh=DATA,FSDP,TENSOR [--seq_len=L]

also prints, before that line, the per-device bytes of parameters, gradients, optimizer state and
activations when training on that mesh (simulated from the mesh sizes and the sharding rules; no
devices needed; tfjax/training/parallel/memory_plan.py and docs/scaling/meshes.md).
"""

from __future__ import annotations

import collections

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from tfjax.nn.attention_kinds import attention_kind
from tfjax.nn.config import GATED_FFNS, ModelConfig
from tfjax.nn.models import build_model
from tfjax.nn.positions import has_learned_table, position_kind

CATEGORIES = ("embeddings", "attention", "ffn", "norms", "output head")


def _dummy_inputs(cfg: ModelConfig, length: int = 4):
  x = jnp.zeros((1, min(length, cfg.max_len)), jnp.int32)
  return (x, x) if cfg.family == "encoder_decoder" else (x,)


def _shape_model(cfg: ModelConfig):
  # Parameter shapes do not depend on the attention kernel; 'xla' traces on any backend (a
  # 'cudnn' config is planned on a laptop).
  return build_model(cfg.replace(attention_impl="xla"))


def boxed_param_shapes(cfg: ModelConfig):
  """The parameter tree with its nn.LogicallyPartitioned boxes (names), as ShapeDtypeStructs."""
  model = _shape_model(cfg)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *_dummy_inputs(cfg)))["params"]


def param_shapes(cfg: ModelConfig):
  """The (unboxed) parameter tree as ShapeDtypeStructs, without allocating anything."""
  return nn.meta.unbox(boxed_param_shapes(cfg))


def _category(path) -> str:
  names = [str(p) for p in path]
  if "relative_bias" in names:  # T5's relative position table: a position encoding
    return "embeddings"
  if any(n.endswith("norm") for n in names):
    return "norms"
  if any(n in ("self_attention", "cross_attention") for n in names):
    return "attention"
  if "ffn" in names:
    return "ffn"
  if names[0] in ("embed", "encoder_embed", "decoder_embed", "shared"):
    return "embeddings"
  return "output head"


def count_by_category(cfg: ModelConfig) -> dict:
  counts = collections.OrderedDict((c, 0) for c in CATEGORIES)
  for path, leaf in traverse_util.flatten_dict(param_shapes(cfg)).items():
    counts[_category(path)] += int(np.prod(leaf.shape))
  return counts


def analytic_count(cfg: ModelConfig) -> int:
  """Closed-form parameter count, written from the architecture (not from the modules)."""
  d, f, hd = cfg.d_model, cfg.feed_forward.d_ff, cfg.dim_per_head
  h, kv = cfg.attention.num_heads, cfg.attention.kv_heads
  norm = d * (2 if cfg.norms.kind == "layernorm" and cfg.norms.bias else 1)
  attn_bias = ((h * hd + 2 * kv * hd if cfg.attention.bias else 0)
               + (d if cfg.attention.uses_out_bias else 0))
  qk_norm = 0 if cfg.attention.qk_norm == "none" else 2 * hd * (
      2 if cfg.attention.qk_norm == "layernorm" and cfg.norms.bias else 1)  # query_norm, key_norm
  attention = (d * h * hd * 2 + d * kv * hd * 2 + attn_bias + qk_norm
               + attention_kind(cfg).params(cfg))  # the kind's own (tfjax/nn/attention_kinds.py)
  ffn_matrices = 3 if cfg.feed_forward.activation in GATED_FFNS else 2
  ffn = ffn_matrices * d * f + ((ffn_matrices - 1) * f + d if cfg.feed_forward.bias else 0)
  sublayer_norms = 2 if cfg.norms.placement == "sandwich" else 1  # sandwich: pre and post
  if cfg.parallel_block:  # one residual step; one norm or one per branch
    encoder_layer = attention + ffn + (1 if cfg.norms.parallel_shared_norm else 2) * norm
  else:
    encoder_layer = attention + ffn + 2 * sublayer_norms * norm
  decoder_layer = 2 * attention + ffn + 3 * sublayer_norms * norm
  final_norm = norm if cfg.norms.has_final_norm else 0
  token_tables = 1 if cfg.share_embeddings else 2  # encoder_decoder may keep one per side
  position_sides = 1 if cfg.shares_positions else 2
  embed = token_tables * cfg.vocab_size * d + cfg.type_vocab_size * d
  positions = position_kind(cfg)  # the registry's closed-form counts of its tables
  embed += position_sides * (positions.embedding_params(cfg) + (norm if cfg.embed_norm else 0))
  untied_head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
  untied_head += cfg.vocab_size if cfg.final_logits_bias else 0
  stacks = 2 if cfg.family == "encoder_decoder" else 1
  embed += stacks * positions.stack_params(cfg)
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


def lookup_only_count(cfg: ModelConfig) -> int:
  """Parameters only looked up, never multiplied: position tables (learned, T5 buckets), token
  types, and the token tables that are not the output layer (all if untied; the encoder's own
  table if tied with separate encoder and decoder tables)."""
  d = cfg.d_model
  n = cfg.type_vocab_size * d
  if has_learned_table(cfg):
    n += (1 if cfg.shares_positions else 2) * cfg.position_table_rows * d
  if cfg.positions.kind == "t5_bias":
    n += ((2 if cfg.family == "encoder_decoder" else 1) * cfg.positions.relative_buckets
          * cfg.attention.num_heads)
  token_tables = 1 if cfg.share_embeddings else 2
  n += (token_tables - (1 if cfg.tie_embeddings else 0)) * cfg.vocab_size * d
  return n


def _format(counts: dict) -> str:
  total = sum(counts.values())
  width = max(len(c) for c in CATEGORIES)
  lines = [f"{name:<{width}}  {n:>15,}  {100 * n / total:5.1f}%" for name, n in counts.items()]
  lines.append(f"total: {total}")
  return "\n".join(lines)


def report(cfg: ModelConfig) -> str:
  counts = count_by_category(cfg)
  total = sum(counts.values())
  expected = analytic_count(cfg)
  if total != expected:  # Would mean a module and the architecture description disagree.
    raise AssertionError(f"module count {total:,} != analytic count {expected:,}")
  return _format(counts)


# The modality models (ViTConfig, CLIPConfig, WhisperConfig, FunnelConfig: tfjax/nn/vision.py,
# clip.py, audio.py, funnel.py) are not ModelConfig families. Their input front-ends (patch and
# conv projections, [CLS], position and token tables) count as embeddings; the named heads as
# the output head. A parameter in neither set nor a block is refused (a new name needs a place).
_FRONT_END = frozenset({"tokens", "positions", "decoder_positions", "cls_token", "patch_embed",
                        "conv1", "conv2"})
_HEADS = frozenset({"classifier", "classifier_hidden", "visual_projection", "text_projection",
                    "logit_scale", "mlm_bias"})


def _modality_category(path) -> str:
  names = [str(p) for p in path]
  if any(n.endswith("norm") for n in names):
    return "norms"
  if any(n in ("self_attention", "cross_attention", "attention") for n in names):
    return "attention"  # Funnel's relative attention is `attention`
  if "ffn" in names:
    return "ffn"
  if _FRONT_END & set(names):
    return "embeddings"
  if names[0] in _HEADS:
    return "output head"
  raise AssertionError(f"parameter {'/'.join(names)} has no category: add it to params.py")


def modality_count_by_category(shapes) -> dict:
  """Per-category counts of a modality model's parameter tree of ShapeDtypeStructs, e.g.
  `jax.eval_shape(task.init, key)["params"]` of a tfjax/modalities task (no arrays)."""
  counts = collections.OrderedDict((c, 0) for c in CATEGORIES)
  for path, leaf in traverse_util.flatten_dict(nn.meta.unbox(shapes)).items():
    counts[_modality_category(path)] += int(np.prod(leaf.shape))
  return counts


def modality_report(shapes) -> str:
  """report()'s breakdown for a modality model (checked against transformers' models in
  tests/training/test_params_modalities.py; there is no analytic_count for these)."""
  return _format(modality_count_by_category(shapes))
