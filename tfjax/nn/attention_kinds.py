"""The registry of attention kinds: the one list of `model.attention_kind` values.

A kind is what MultiHeadAttention (tfjax/nn/attention.py) runs between its projections and its
output projection: given the projected, position-encoded queries, keys and values, which keys each
query sees and what the position kind adds to the scores, it returns the heads' outputs. One
module registers one kind (`register_attention_kind`), and everything else asks the registry:
config validation (tfjax/nn/attention.py's AttentionConfig), the block, decoding, FLOPs per token
(tfjax/training/accounting/flops.py) and parameter counts (tfjax/training/accounting/params.py).
Softmax attention with its implementations (tfjax/nn/softmax_attention.py) is the default kind.

Hugging Face conversion (tfjax/hf) maps softmax attention, Longformer's and BigBird's (their
architectures' modules set the kind's keys); exporting a run of a kind the target architecture
cannot express fails with an UnsupportedError naming model.attention_kind (the exporter's config
round trip). The built-in kinds beside softmax are the files of tfjax/nn/kinds/.

Shape letters as in tfjax/nn/axes.py.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

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
    defaults). section: the kind's own config, a tfjax.nn.sections.Section subclass whose fields
    are flat keys named after the kind (`features: int = flat_key("performer_features", 256)`)
    and whose `validate(model)` checks them; every registered kind's keys are config.model keys
    with their defaults, a key of another kind than model.attention_kind must keep its default,
    and the block and hooks read the chosen kind's values as `cfg.attention.kind_config`.
    logits_bias: whether `attend` adds a position kind's LogitsBias (ALiBi, T5); a
    kind without it rejects such position kinds. inputs: `attend` also takes the block input
    as keyword x_BxTxD (projections of its own, e.g. Longformer's global ones). lengths:
    `attend` also takes keyword seq_len_BxT, int32 [B or 1, T]: the actual length n of the
    sequence each query belongs to (tfjax.nn.masks.Visibility.sequence_lengths: its segment's
    keys, padding left out; while decoding, the tokens so far), for math that depends on n
    (sigmoid attention's bias -log n) where model.max_len is only an upper bound.
  context_parallel: whether `attend` is exact with every activation's length split over a
    context mesh axis (softmax: tfjax/nn/sharded_attention.py); training refuses the others
    there by name rather than leave a kind's length-mixing math to the SPMD partitioner.
  """
  name: str
  attend: Callable
  flops_per_token: Callable[[ModelConfig, int], float]
  cache: Optional[Callable] = None
  params: Callable[[ModelConfig], int] = no_params
  check: Callable[[ModelConfig], None] = no_check
  reads: tuple = ()
  section: Optional[type] = None
  logits_bias: bool = False
  inputs: bool = False
  lengths: bool = False
  context_parallel: bool = False


ATTENTION_KINDS: Dict[str, AttentionKind] = {}


def register_attention_kind(kind: AttentionKind) -> AttentionKind:
  """Adds `kind` to the registry (validation and every consumer see it at once; its section's
  keys join config.model for configs built from then on)."""
  if kind.section is not None:
    taken = {key: other.name for other in ATTENTION_KINDS.values()
             if other.section is not None and other.name != kind.name
             for key in other.section.flat_keys()}
    clash = sorted(key for key in kind.section.flat_keys() if key in taken)
    if clash:
      raise TypeError(f"attention kind {kind.name!r} declares config keys {clash} that kind "
                      f"{taken[clash[0]]!r} already declares; prefix each key with the kind's name")
  ATTENTION_KINDS[kind.name] = kind
  return kind


def kind_sections() -> Tuple[Tuple[str, type], ...]:
  """(kind name, section class) of the registered kinds that declare a section."""
  return tuple((kind.name, kind.section) for kind in ATTENTION_KINDS.values()
               if kind.section is not None)


def attention_kind(cfg: ModelConfig) -> AttentionKind:
  """The registry entry of `cfg`'s model.attention_kind."""
  return ATTENTION_KINDS[cfg.attention.kind]
