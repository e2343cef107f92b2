"""Sigmoid attention, `model.attention_kind='sigmoid'`: an attention kind defined outside tfjax,
loaded with `--import=sigmoid_attention` (docs/attention/README.md, "A kind from a file of your
own").

Ramapuram et al. 2024, "Theory, Analysis, and Best Practices for Sigmoid Self-Attention": each
attention weight is an independent sigmoid instead of a softmax over the row,

  out_t = sum_s sigmoid(q_t . k_s / sqrt(d) + b) v_s,   b = -log(n),

n the sequence length. With b = -log n the weights of a row start summing to about 1 (each is
about 1/n while q.k is small), which the paper finds is what keeps early training stable.
model.sigmoid_bias=None (the default) uses that b with the actual n of each row (the
`seq_len_BxT` tfjax hands a kind declared with lengths=True: a row's real tokens, not
model.max_len); a number fixes b instead. Masked keys (causal, window, padding) get weight 0.

Decoding reuses softmax attention's KV cache, so `tfjax-generate` works; a decode step's n is the
tokens so far. Shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp

from tfjax.nn import kv_cache, ops
from tfjax.nn.attention_kinds import AttentionKind, register_attention_kind
from tfjax.nn.sections import Section, flat_key

NAME = "sigmoid"


@dataclasses.dataclass(frozen=True)
class SigmoidConfig(Section):
  """bias: b added to every score before the sigmoid; None = -log(n) per row (the paper's)."""
  bias: Optional[float] = flat_key("sigmoid_bias", None)

  def validate(self, model) -> None:
    del model
    if self.bias is not None and not math.isfinite(self.bias):
      raise ValueError(f"model.sigmoid_bias={self.bias} must be a finite number, or None for "
                       "-log(n) with n the sequence length")


def attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias, *, seq_len_BxT):
  """sum_s sigmoid(q.k / sqrt(E) + b + position bias) v_s over the visible keys."""
  cfg = owner.config
  fixed = cfg.attention.kind_config.bias
  b_BxT = (-jnp.log(seq_len_BxT.astype(jnp.float32)) if fixed is None
           else jnp.full(seq_len_BxT.shape, fixed, jnp.float32))
  bias_Bx1xTx1 = b_BxT[:, None, :, None]
  if logits_bias.bias_BxHxTxS is not None:  # T5-style position bias adds to the scores too
    bias_Bx1xTx1 = bias_Bx1xTx1 + logits_bias.bias_BxHxTxS
  # Scaled scores + b, each hidden key set to a large negative number: its sigmoid is exactly 0.
  scores_BxHxTxS, _ = ops.attention_logits_mask(
      q_BxTxHxE, k_BxSxKxE, **visibility.as_kwargs(), alibi_slopes=logits_bias.alibi_slopes_H,
      bias=bias_Bx1xTx1, scale=cfg.attention.scale)
  weights_BxHxTxS = jax.nn.sigmoid(scores_BxHxTxS)
  if owner.is_mutable_collection("intermediates"):
    owner.sow("intermediates", "attention_weights", weights_BxHxTxS)
  return ops.weighted_values(weights_BxHxTxS, v_BxSxKxE).astype(q_BxTxHxE.dtype)


def flops_per_token(cfg, seq_len: int) -> float:
  """QK^T and the weighted sum of V, as softmax attention: 12 * heads * head_dim * seq_len."""
  return 12.0 * cfg.attention.num_heads * cfg.dim_per_head * seq_len


SIGMOID = register_attention_kind(AttentionKind(
    NAME, attend=attend, flops_per_token=flops_per_token, cache=kv_cache.step,
    reads=("attention_scale",), section=SigmoidConfig, logits_bias=True, lengths=True))
