"""The registry of attention kinds: the one list of `model.attention_kind` values.

A kind is what MultiHeadAttention (tfjax/nn/attention.py) runs between its projections and its
output projection: given the projected, position-encoded queries, keys and values, which keys each
query sees and what the position kind adds to the scores, it returns the heads' outputs. One
module registers one kind (`register_attention_kind`), and everything else asks the registry:
config validation (tfjax/nn/attention.py's AttentionConfig), the block, decoding, FLOPs per token
(tfjax/training/flops.py) and parameter counts (tfjax/training/params.py). Softmax attention with
its implementations (tfjax/nn/softmax_attention.py) is the default kind.

Hugging Face conversion (tfjax/hf) maps softmax attention only: exporting a run of another kind
fails with an UnsupportedError naming model.attention_kind (the exporter's config round trip).

Shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Dict, Optional

if TYPE_CHECKING:
  from tfjax.nn.config import ModelConfig


def no_params(cfg) -> int:
  """A kind's hook for "no parameters of its own" (attention and position kinds share it)."""
  del cfg
  return 0


def no_check(cfg) -> None:
  """A kind's hook for "nothing of its own to validate"."""
  del cfg


@dataclasses.dataclass(frozen=True)
class AttentionKind:
  """What the library needs to know about one `model.attention_kind` value.

  attend(owner, q_BxTxHxE, k_BxSxKxE, v_BxSxKxE, visibility, logits_bias) -> out_BxTxHxE: the
    math. `owner` is the calling MultiHeadAttention: its `config`, rngs (`make_rng`), `sow` and
    parameter scope (a kind's own parameters are `owner.param(...)` or submodules built here,
    so they sit in the block's tree). visibility: tfjax.nn.masks.Visibility (causal, window,
    segment ids, positions); logits_bias: tfjax.nn.masks.LogitsBias of the position kind.
  cache(owner, k_BxSxKxE, v_BxSxKxE, positions_BxT, visibility, *, cross) -> (k, v, visibility):
    one decoding step (config.decode=True) of causal self-attention (cross=False) or
    cross-attention (k, v None once the encoder output is cached); what it returns goes to
    `attend`. None: the kind does not decode (validation rejects decode=True).
  flops_per_token(cfg, seq_len): training FLOPs (forward and backward) per token of one
    attention beyond its four projections, at context length seq_len.
  params(cfg): parameters of one attention beyond W_Q, W_K, W_V, W_O and the qk norms.
  check(cfg): the kind's own validation (a ValueError naming the flat key and the fix).
  reads: the AttentionConfig keys of `KIND_KEYS` the kind reads (others must keep their
    defaults). logits_bias: whether `attend` adds a position kind's LogitsBias (ALiBi, T5); a
    kind without it rejects such position kinds.
  """
  name: str
  attend: Callable
  flops_per_token: Callable[[ModelConfig, int], float]
  cache: Optional[Callable] = None
  params: Callable[[ModelConfig], int] = no_params
  check: Callable[[ModelConfig], None] = no_check
  reads: tuple = ()
  logits_bias: bool = False


ATTENTION_KINDS: Dict[str, AttentionKind] = {}


def register_attention_kind(kind: AttentionKind) -> AttentionKind:
  """Adds `kind` to the registry (validation and every consumer see it at once)."""
  ATTENTION_KINDS[kind.name] = kind
  return kind


def attention_kind(cfg: ModelConfig) -> AttentionKind:
  """The registry entry of `cfg`'s model.attention_kind."""
  return ATTENTION_KINDS[cfg.attention.kind]
