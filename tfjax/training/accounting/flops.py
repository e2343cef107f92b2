"""Training FLOPs per token and model FLOPs utilization (MFU) peaks.

The count is the matmul-parameter 6N rule plus the attention scores and values (PaLM app. B,
nanoGPT's estimate_mfu); the parameter count is tfjax.training.accounting.params.analytic_count.
"""

from __future__ import annotations

import jax

from tfjax.nn.attention_kinds import attention_kind
from tfjax.nn.config import ModelConfig
from tfjax.training.accounting.params import analytic_count, lookup_only_count

# Dense peak FLOP/s per device (bf16 tensor cores, no sparsity), matched against device_kind.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "TPU v4": 275e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token: 6N for the matmul parameters plus the attention scores/values
  (12 * heads * head_dim * seq_len per attention: QK^T and AV, forward x3 for backward; PaLM
  app. B; nanoGPT's estimate_mfu). N leaves out lookup-only tables (params.lookup_only_count:
  positions, token types, token tables that are not the output layer). Encoder-decoder: per
  target token with source length = target length = seq_len; a decoder layer attends twice (self
  and cross). An attention kind other than softmax gives its own count (attention_kinds.py)."""
  n = analytic_count(cfg) - lookup_only_count(cfg)
  attentions = cfg.num_layers + (2 * cfg.decoder_layers if cfg.family == "encoder_decoder" else 0)
  return 6.0 * n + attentions * attention_kind(cfg).flops_per_token(cfg, seq_len)


def peak_flops(configured: float = 0.0) -> float:
  """Peak FLOP/s of one local device: the configured value, else the table, else 0 (no MFU)."""
  if configured:
    return float(configured)
  kind = jax.devices()[0].device_kind
  for name, flops in PEAK_FLOPS.items():
    if name.lower() in kind.lower():
      return flops
  return 0.0
