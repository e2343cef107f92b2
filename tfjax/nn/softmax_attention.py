"""Softmax attention, `model.attention_kind='softmax'` (the default kind).

softmax(cap(q k^T * scale) + bias + mask) v, written once in tfjax/nn/ops.py's
`dot_product_attention` and computed by the implementation model.attention_impl names (xla |
chunked | pallas | cudnn | auto; `ATTENTION_IMPLS`). It reads model.attention_scale,
model.attention_softcap and model.attention_dropout, decodes through the KV cache of
tfjax/nn/kv_cache.py, and costs 12 * heads * head_dim * seq_len training FLOPs per token (QK^T
and AV, the backward pass twice the forward; PaLM app. B, nanoGPT's estimate_mfu).

Attention weights for visualization: apply with `mutable=['intermediates']` and each attention
module sows its [batch, heads, q_len, kv_len] probabilities as 'attention_weights'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import flax.linen as nn

from tfjax.nn import kv_cache, ops
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.masks import LogitsBias, Visibility

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


def attend(owner: nn.Module, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility: Visibility,
           logits_bias: LogitsBias):
  """The heads' outputs [B, T, H, E] by tfjax.nn.ops.dot_product_attention."""
  cfg = owner.config
  kwargs = dict(**visibility.as_kwargs(), **logits_bias.as_kwargs(),
                scale=cfg.attention.scale, softcap=cfg.attention.softcap)
  if owner.is_mutable_collection("intermediates"):
    owner.sow("intermediates", "attention_weights",
              ops.attention_weights(q_BxTxHxE, k_BxSxKxE, **kwargs))
  dropout = 0.0 if cfg.deterministic else cfg.attention.dropout
  return ops.dot_product_attention(
      q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, implementation=cfg.attention_impl,
      dropout_rate=dropout, dropout_rng=owner.make_rng("dropout") if dropout else None, **kwargs)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """QK^T and AV: 2 * 2 * heads * head_dim * seq_len forward, three times that with backward."""
  return 12.0 * cfg.attention.num_heads * cfg.dim_per_head * seq_len


def check(cfg: ModelConfig) -> None:
  softcap = cfg.attention.softcap
  if softcap is not None and cfg.attention_impl not in (*ops.SOFTCAP_IMPLS, "auto"):
    raise ValueError(
        f"model.attention_softcap={softcap} is computed by attention_impl in "
        f"{ops.SOFTCAP_IMPLS}, not model.attention_impl={cfg.attention_impl!r}; set one of "
        "them or 'auto'")


SOFTMAX = register_attention_kind(AttentionKind(
    "softmax", attend=attend, flops_per_token=flops_per_token, cache=kv_cache.step, check=check,
    reads=("attention_scale", "attention_softcap", "attention_dropout"), logits_bias=True,
    context_parallel=True))
