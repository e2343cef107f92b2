"""Parameter accounting: `python -m tfjax.params --config=configs/NAME.py`.

Counts come from `jax.eval_shape` of the model's init (nothing is allocated, so the 7B config runs
on a laptop) and are checked against `analytic_count`, a closed-form count from the config alone.
The last line printed is `total: N`.
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


def param_shapes(cfg: ModelConfig):
  """The (unboxed) parameter tree as ShapeDtypeStructs, without allocating anything."""
  model = build_model(cfg)
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
  (12 * layers * heads * head_dim * seq_len: QK^T and AV, forward x3 for backward; PaLM app. B).
  N leaves out lookup-only tables (positions, token types, and the token table if untied)."""
  n = analytic_count(cfg)
  n -= cfg.max_len * cfg.d_model if cfg.position == "learned" else 0
  n -= cfg.type_vocab_size * cfg.d_model
  n -= 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
  layers = cfg.num_layers + (cfg.decoder_layers if cfg.family == "encoder_decoder" else 0)
  return 6.0 * n + 12.0 * layers * cfg.num_heads * cfg.dim_per_head * seq_len


def peak_flops(configured: float = 0.0) -> float:
  """Peak FLOP/s of one local device: the configured value, else the table, else 0 (no MFU)."""
  if configured:
    return float(configured)
  kind = jax.devices()[0].device_kind
  for name, flops in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return flops
  return 0.0


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/NAME.py).")

  def _main(argv):
    del argv
    print(report(ModelConfig.from_config(_CONFIG.value.model)))

  app.run(_main, argv=sys.argv)
