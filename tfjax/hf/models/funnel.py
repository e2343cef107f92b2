"""Funnel Transformer (`model_type` funnel) <-> tfjax's Funnel (tfjax/nn/funnel.py):
  FunnelModel                       the encoder and the up-sampling decoder
  FunnelBaseModel                   the encoder only
  FunnelForMaskedLM                 FunnelModel under `funnel.`, plus lm_head.bias (lm_head.weight
                                    is the tied token table, not stored)
  FunnelForSequenceClassification   FunnelBaseModel under `funnel.`, plus classifier.linear_hidden
                                    and classifier.linear_out (tanh MLP on token 0)
Which one a checkpoint holds is read from its tensor names (what save_pretrained writes).
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.models import vit
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.funnel import Funnel, FunnelConfig

MODEL_TYPE = "funnel"
HF_CLASS = "FunnelModel"
CLASSES = {"FunnelModel": "", "FunnelBaseModel": "", "FunnelForMaskedLM": "funnel.",
           "FunnelForSequenceClassification": "funnel."}
_REFUSED = {"discriminator_predictions.": "FunnelForPreTraining", "qa_outputs.":
            "FunnelForQuestionAnswering", "classifier.weight": "FunnelForTokenClassification"}
CONFIG = FunnelConfig
# Fields transformers' Funnel models do not read: the released configs' legacy rel_attn_type
# (the code reads attention_type), type_vocab_size and max_position_embeddings (token types
# enter only through the same-segment matrix, positions are computed from the length; there
# are no tables), the output-layer tie (checked for FunnelForMaskedLM; the bare models have no
# output layer) and the init std.
IGNORED = frozenset({"rel_attn_type", "type_vocab_size", "max_position_embeddings",
                     "tie_word_embeddings", "hidden_dropout", "initializer_std"})


def hf_class(cfg: FunnelConfig) -> str:
  if cfg.mlm_head:
    return "FunnelForMaskedLM"
  if cfg.num_classes:
    return "FunnelForSequenceClassification"
  return "FunnelModel" if cfg.decoder else "FunnelBaseModel"


def head(names: set) -> tuple:
  """(transformers class, prefix) of `names`, or an UnsupportedError naming the head."""
  for start, cls in _REFUSED.items():
    if any(n.startswith(start) for n in names):
      raise UnsupportedError(f"funnel checkpoint of {cls} ({start}*): its head is not "
                             f"supported; tfjax imports {sorted(CLASSES)}")
  if "lm_head.bias" in names:
    return "FunnelForMaskedLM", "funnel."
  if "classifier.linear_out.weight" in names:
    return "FunnelForSequenceClassification", "funnel."
  if "embeddings.word_embeddings.weight" in names:
    decoder = any(n.startswith("decoder.") for n in names)
    return ("FunnelModel" if decoder else "FunnelBaseModel"), ""
  raise UnsupportedError(f"funnel checkpoint tensors {sorted(names)[:3]} are not "
                         f"{sorted(CLASSES)}'s")


def _prefix(cfg: FunnelConfig) -> str:
  return "funnel." if cfg.mlm_head or cfg.num_classes else ""


def config_from_hf(f: Fields, names: set) -> FunnelConfig:
  mlm = "lm_head.bias" in names
  classes = 0
  if "classifier.linear_out.weight" in names:
    classes = len(f.get("id2label") or {}) or int(f.get("num_labels", 2))
  decoder = any(n.startswith(("decoder.", "funnel.decoder.")) for n in names)
  if mlm:  # the output layer is the token table (an untied one would be an unread tensor)
    f.expect("tie_word_embeddings", (True,), True)
  try:
    return FunnelConfig(
        vocab_size=f.require("vocab_size"), block_sizes=tuple(f.require("block_sizes")),
        block_repeats=tuple(f.get("block_repeats") or ()), decoder=decoder,
        num_decoder_layers=f.get("num_decoder_layers", 2), d_model=f.require("d_model"),
        n_head=f.require("n_head"), d_head=f.require("d_head"), d_inner=f.require("d_inner"),
        ffn=vit.activation(f, "hidden_act", "gelu_new"),
        norm_eps=float(f.get("layer_norm_eps", 1e-9)),
        pooling=f.expect("pooling_type", ("mean", "max"), "mean"),
        attention_type=f.expect("attention_type", ("relative_shift", "factorized"),
                                "relative_shift"),
        separate_cls=f.get("separate_cls", True), truncate_seq=f.get("truncate_seq", True),
        pool_q_only=f.get("pool_q_only", True), mlm_head=mlm,
        num_classes=classes).validated()
  except ValueError as e:
    raise UnsupportedError(f"funnel config.json: {e}") from e


def config_to_hf(cfg: FunnelConfig) -> dict:
  if cfg.num_classes and cfg.decoder:
    raise UnsupportedError(
        "FunnelForSequenceClassification classifies the encoder's output (FunnelBaseModel); "
        "a tfjax Funnel with num_classes and decoder=True has no Hugging Face class: set "
        "decoder=False")
  extra = {"tie_word_embeddings": True} if cfg.mlm_head else {}
  if cfg.num_classes:
    labels = {i: f"LABEL_{i}" for i in range(cfg.num_classes)}
    extra.update(id2label=labels, label2id={v: k for k, v in labels.items()})
  return dict(**extra, model_type=MODEL_TYPE, vocab_size=cfg.vocab_size,
              block_sizes=list(cfg.block_sizes), block_repeats=list(cfg.block_repeats),
              num_decoder_layers=cfg.num_decoder_layers, d_model=cfg.d_model,
              n_head=cfg.n_head, d_head=cfg.d_head, d_inner=cfg.d_inner,
              hidden_act=vit.ACT_NAMES[cfg.ffn], layer_norm_eps=cfg.norm_eps,
              pooling_type=cfg.pooling, attention_type=cfg.attention_type,
              separate_cls=cfg.separate_cls, truncate_seq=cfg.truncate_seq,
              pool_q_only=cfg.pool_q_only)


def layer_rules(cfg: FunnelConfig, hf: str, tj: tuple) -> list:
  """One FunnelLayer: `hf` its module prefix, `tj` its tfjax path."""
  n, att = cfg.n_head, tj + ("attention",)
  out = [mapping.heads_in(f"{hf}attention.q_head.weight", att + ("query", "kernel"), n)]
  for short, name in (("k", "key"), ("v", "value")):
    out += [mapping.heads_in(f"{hf}attention.{short}_head.weight", att + (name, "kernel"), n),
            mapping.heads_bias(f"{hf}attention.{short}_head.bias", att + (name, "bias"), n)]
  out += [mapping.heads_out(f"{hf}attention.post_proj.weight", att + ("out", "kernel"), n),
          mapping.copy(f"{hf}attention.post_proj.bias", att + ("out", "bias"))]
  out += [mapping.copy(f"{hf}attention.{p}", att + (p,))
          for p in ("r_w_bias", "r_r_bias", "r_kernel", "r_s_bias", "seg_embed")]
  out += vit.norm_rules(f"{hf}attention.layer_norm", att + ("norm",))
  for hf_name, path in (("linear_1", "wi"), ("linear_2", "wo")):
    out += [mapping.linear(f"{hf}ffn.{hf_name}.weight", tj + ("ffn", path, "kernel")),
            mapping.copy(f"{hf}ffn.{hf_name}.bias", tj + ("ffn", path, "bias"))]
  return out + vit.norm_rules(f"{hf}ffn.layer_norm", tj + ("ffn_norm",))


def rules(cfg: FunnelConfig, prefix: str | None = None) -> list:
  pre = _prefix(cfg) if prefix is None else prefix
  out = [mapping.copy(f"{pre}embeddings.word_embeddings.weight", ("tokens", "embedding"))]
  out += vit.norm_rules(f"{pre}embeddings.layer_norm", ("embed_norm",))
  for b, size in enumerate(cfg.block_sizes):
    for i in range(size):
      out += layer_rules(cfg, f"{pre}encoder.blocks.{b}.{i}.", (f"blocks_{b}_{i}",))
  if cfg.decoder:
    for i in range(cfg.num_decoder_layers):
      out += layer_rules(cfg, f"{pre}decoder.layers.{i}.", (f"decoder_{i}",))
  if cfg.mlm_head:
    out.append(mapping.copy("lm_head.bias", ("mlm_bias",)))
  if cfg.num_classes:
    for hf_name, path in (("linear_hidden", "classifier_hidden"), ("linear_out", "classifier")):
      out += [mapping.linear(f"classifier.{hf_name}.weight", (path, "kernel")),
              mapping.copy(f"classifier.{hf_name}.bias", (path, "bias"))]
  return out


def droppable(cfg: FunnelConfig, name: str) -> bool:
  """A stored copy of the tied output layer (check_derived checks it is the token table)."""
  return cfg.mlm_head and name == "lm_head.weight"


def check_derived(cfg: FunnelConfig, ckpt) -> None:
  if cfg.mlm_head and "lm_head.weight" in ckpt.names:
    table = ckpt.get("funnel.embeddings.word_embeddings.weight")
    if not np.array_equal(ckpt.get("lm_head.weight"), table):
      raise UnsupportedError("lm_head.weight differs from the token table although "
                             "tie_word_embeddings is true; tfjax's output layer is the table")


def model(cfg: FunnelConfig):
  return Funnel(cfg)


def example_inputs(cfg: FunnelConfig) -> tuple:
  return (np.zeros((1, 2 ** len(cfg.block_sizes)), np.int32),)  # long enough to pool
