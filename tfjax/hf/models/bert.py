"""BERT: post-LayerNorm encoder with learned positions, token types and an embedding LayerNorm.

Imports BertForMaskedLM / BertForPreTraining / BertModel checkpoints: the MLM head (dense, GELU,
LayerNorm, tied decoder with its bias) when present, and the pooler when present. The
next-sentence head of BertForPreTraining has no tfjax counterpart and is left out (logged).
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig

# config.json fields that do not change BertForMaskedLM's logits: none beyond mapping.IGNORED
# (bert-base-uncased's released config.json reads entirely through it and the mapping below).
IGNORED = {"bert": frozenset()}

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}
ACT_NAMES = {v: k for k, v in ACTS.items()}


def _prefix(names: set) -> str:
  return "bert." if "bert.embeddings.word_embeddings.weight" in names else ""


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind
  act = f.get("hidden_act", "gelu")
  if act not in ACTS:
    raise UnsupportedError(f"bert config.json hidden_act={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  f.expect("position_embedding_type", ("absolute",), "absolute")
  f.expect("is_decoder", (False,), False)
  f.expect("add_cross_attention", (False,), False)
  mlm = "cls.predictions.transform.dense.weight" in names
  if not f.get("tie_word_embeddings", True):
    raise UnsupportedError("bert config.json tie_word_embeddings=False is not supported")
  pooler = f"{_prefix(names)}pooler.dense.weight" in names
  return dict(family="encoder", vocab_size=f.require("vocab_size"),
              d_model=f.require("hidden_size"), num_layers=f.require("num_hidden_layers"),
              num_heads=f.require("num_attention_heads"), d_ff=f.require("intermediate_size"),
              ffn=ACTS[act], ffn_bias=True, attention_bias=True, norm="layernorm",
              **NormConfig.eps_from_hf(f, "layer_norm_eps", 1e-12), norm_placement="post",
              embed_norm=True, position="learned",
              max_len=f.get("max_position_embeddings", 512),
              type_vocab_size=f.get("type_vocab_size", 2), tie_embeddings=True,
              mlm_head=mlm, mlm_activation=ACTS[act], pooler=pooler)


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  if cfg.mlm_head and cfg.mlm_activation != cfg.feed_forward.activation:
    raise UnsupportedError(
        f"model.mlm_activation={cfg.mlm_activation!r} differs from the FFN's "
        f"{cfg.feed_forward.activation!r}: Hugging Face's hidden_act sets both; set them alike")
  return dict(model_type="bert", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
              intermediate_size=cfg.feed_forward.d_ff,
              hidden_act=ACT_NAMES[cfg.feed_forward.activation],
              **cfg.norms.eps_to_hf("layer_norm_eps"), max_position_embeddings=cfg.max_len,
              type_vocab_size=cfg.type_vocab_size, tie_word_embeddings=True)


def export_prefix(cfg: ModelConfig) -> str:
  return "bert." if cfg.mlm_head else ""


def rules(cfg: ModelConfig, prefix: str = "bert.") -> list:
  h, p = cfg.attention.num_heads, prefix
  emb = f"{p}embeddings."
  out = [mapping.copy(f"{emb}word_embeddings.weight", ("embed", "tokens", "embedding")),
         mapping.copy(f"{emb}position_embeddings.weight", ("embed", "positions", "embedding")),
         mapping.copy(f"{emb}LayerNorm.weight", ("embed", "norm", "scale")),
         mapping.copy(f"{emb}LayerNorm.bias", ("embed", "norm", "bias"))]
  if cfg.type_vocab_size:
    out.append(mapping.copy(f"{emb}token_type_embeddings.weight",
                            ("embed", "token_types", "embedding")))
  for i in range(cfg.num_layers):
    hf, tj = f"{p}encoder.layer.{i}.", ("encoder", f"layers_{i}")
    att = tj + ("self_attention",)
    for name in ("query", "key", "value"):
      out += [mapping.heads_in(f"{hf}attention.self.{name}.weight", att + (name, "kernel"), h),
              mapping.heads_bias(f"{hf}attention.self.{name}.bias", att + (name, "bias"), h)]
    out += [mapping.heads_out(f"{hf}attention.output.dense.weight", att + ("out", "kernel"), h),
            mapping.copy(f"{hf}attention.output.dense.bias", att + ("out", "bias")),
            mapping.linear(f"{hf}intermediate.dense.weight", tj + ("ffn", "wi", "kernel")),
            mapping.copy(f"{hf}intermediate.dense.bias", tj + ("ffn", "wi", "bias")),
            mapping.linear(f"{hf}output.dense.weight", tj + ("ffn", "wo", "kernel")),
            mapping.copy(f"{hf}output.dense.bias", tj + ("ffn", "wo", "bias"))]
    for name, path in (("attention.output.LayerNorm", "self_attention_norm"),
                       ("output.LayerNorm", "ffn_norm")):
      out += [mapping.copy(f"{hf}{name}.weight", tj + (path, "scale")),
              mapping.copy(f"{hf}{name}.bias", tj + (path, "bias"))]
  if cfg.mlm_head:
    out += [mapping.linear("cls.predictions.transform.dense.weight", ("mlm_transform", "kernel")),
            mapping.copy("cls.predictions.transform.dense.bias", ("mlm_transform", "bias")),
            mapping.copy("cls.predictions.transform.LayerNorm.weight", ("mlm_norm", "scale")),
            mapping.copy("cls.predictions.transform.LayerNorm.bias", ("mlm_norm", "bias")),
            mapping.copy("cls.predictions.bias", ("mlm_bias",))]
  if cfg.pooler:
    out += [mapping.linear(f"{p}pooler.dense.weight", ("pooler", "kernel")),
            mapping.copy(f"{p}pooler.dense.bias", ("pooler", "bias"))]
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """The tied decoder (and its bias, a second name of cls.predictions.bias), position-id buffers
  and the next-sentence head."""
  del cfg
  return name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias") or (
      name.endswith("position_ids") or name.startswith("cls.seq_relationship."))
