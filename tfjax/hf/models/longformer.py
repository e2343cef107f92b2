"""Longformer (`model_type` longformer): LongformerForMaskedLM / LongformerModel <-> a tfjax encoder
with model.attention_kind='longformer' (tfjax/nn/kinds/longformer.py).

The embeddings, layers and MLM head are RoBERTa's (tfjax/hf/models/roberta.py: positions from
pad_token_id + 1, `lm_head`) under the prefix `longformer.`; each layer adds the global
projections attention.self.{query,key,value}_global. config.json's attention_window (an int, or
one per layer, all equal: tfjax has one window for every layer) is model.longformer_window.

Global tokens are not in config.json: transformers takes them per call (global_attention_mask).
An import sets model.longformer_global_tokens=0, transformers' call without that mask; a run with
G > 0 computes what transformers computes with global_attention_mask[:, :G] = 1, and its export
is refused (the exported model, called as usual, would compute something else).
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.models import roberta
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig

PREFIX = "longformer."
# Fields that do not change the forward pass: onnx_export picks an equivalent chunking op.
IGNORED = {"longformer": frozenset({"onnx_export"})}


def _prefix(names) -> str:
  return PREFIX if f"{PREFIX}embeddings.word_embeddings.weight" in names else ""


def _window(f: Fields, layers: int) -> int:
  window = f.require("attention_window")
  if isinstance(window, (list, tuple)):
    if len(window) != layers or len(set(window)) != 1:
      raise UnsupportedError(
          f"longformer config.json attention_window={list(window)}: tfjax has one window for "
          f"every layer (model.longformer_window), so the {layers} values must be equal")
    window = window[0]
  return int(window)


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  prefix = _prefix(names)
  as_roberta = {"roberta." + n[len(prefix):] if prefix and n.startswith(prefix) else n
                for n in names}
  cfg = roberta.config_from_hf(kind, f, as_roberta)
  f.expect("attention_mode", ("longformer",), "longformer")  # the original repo's other kernels
  f.expect("ignore_attention_mask", (False,), False)
  cfg.update(attention_kind="longformer", longformer_window=_window(f, cfg["num_layers"]),
             longformer_global_tokens=0)
  return cfg


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  if cfg.attention.kind != "longformer":
    raise UnsupportedError(f"model_type 'longformer' is Longformer attention, not "
                           f"model.attention_kind={cfg.attention.kind!r}; export as 'roberta'")
  lf = cfg.attention.kind_config
  if lf.global_tokens:
    raise UnsupportedError(
        f"model.longformer_global_tokens={lf.global_tokens}: transformers' Longformer takes its "
        "global tokens per call (global_attention_mask), not from config.json, so the exported "
        "model called as usual would compute something else; export a run with "
        "longformer_global_tokens=0 and pass global_attention_mask[:, :G] = 1 to transformers")
  out = roberta.config_to_hf(kind, cfg)
  out.update(model_type="longformer", attention_window=[lf.window] * cfg.num_layers,
             attention_mode="longformer", ignore_attention_mask=False)
  return out


def rules(cfg: ModelConfig, names=None) -> list:
  prefix = (PREFIX if cfg.mlm_head else "") if names is None else _prefix(names)
  out = []
  for rule in roberta.rules(cfg, {"roberta.embeddings.word_embeddings.weight"} if prefix else
                            set()):
    (name,) = rule.hf
    if prefix and name.startswith("roberta."):
      name = prefix + name[len("roberta."):]
    out.append(mapping.Rule((name,), rule.tfjax, rule.to_tfjax, rule.to_hf))
  h = cfg.attention.num_heads
  for i in range(cfg.num_layers):
    hf = f"{prefix}encoder.layer.{i}.attention.self."
    att = ("encoder", f"layers_{i}", "self_attention")
    for name in ("query_global", "key_global", "value_global"):
      out += [mapping.heads_in(f"{hf}{name}.weight", att + (name, "kernel"), h),
              mapping.heads_bias(f"{hf}{name}.bias", att + (name, "bias"), h)]
  return out


droppable = roberta.droppable
