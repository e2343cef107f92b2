"""BART, mBART and Marian: encoder-decoders with biases everywhere and a final-logits bias.

BART: post-LN; one token table (`model.shared`) with per-side learned position tables read at
p + 2 and per-side embedding LayerNorms (`share_positions=False`, `position_offset=2`). mBART:
BART's embeddings with pre-LN layers and a final LayerNorm on each stack (`layer_norm`), the
sqrt(d_model) embedding scale of its released configs. Marian: post-LN, no embedding
norm, fixed sinusoidal positions in the [sin | cos] layout (`sinusoid_layout='halves'`, not
stored), sqrt(d_model) embedding scale when `scale_embedding`. Both tie the output head to the
token table and add `final_logits_bias` (a buffer in HF, a parameter here).
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.nn.positions import has_learned_table
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig

# config.json fields that do not change the seq2seq logits (beyond mapping.IGNORED): the
# classification head's dropout and label count under their legacy names, the legacy layer
# count, flags transformers no longer reads (Marian has no embedding norm, so its
# normalize_embedding is never read).
_COMMON = ("classif_dropout", "num_hidden_layers", "extra_pos_embeddings",
           "force_bos_token_to_be_generated")
IGNORED = {"bart": frozenset(_COMMON), "mbart": frozenset(_COMMON),
           "marian": frozenset(_COMMON + ("normalize_embedding",))}

ACTS = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu",
        "gelu_new": "gelu_tanh"}
ACT_NAMES = {"gelu": "gelu", "relu": "relu", "silu": "swish", "gelu_tanh": "gelu_new"}


def _same(f: Fields, a: str, b: str):
  if f.require(a) != f.require(b):
    raise UnsupportedError(f"{f.arch} config.json {a}={f.require(a)} differs from "
                           f"{b}={f.require(b)}; tfjax's encoder and decoder share these sizes")
  return f.require(a)


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del names
  act = f.get("activation_function", "gelu")
  if act not in ACTS:
    raise UnsupportedError(f"{kind} config.json activation_function={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  f.expect("is_decoder", (False,), False)
  # transformers' classes fix the norm placement (BART, Marian post-LN; mBART pre-LN with final
  # norms) whatever these legacy flags say; one that contradicts its class is refused.
  pre = kind == "mbart"
  f.expect("normalize_before", (pre,), pre)
  f.expect("add_final_layer_norm", (pre,), pre)
  f.expect("add_bias_logits", (False,), False)
  f.expect("static_position_embeddings", (kind == "marian",), kind == "marian")
  if not f.get("tie_word_embeddings", True):
    raise UnsupportedError(f"{kind} config.json tie_word_embeddings=False is not supported")
  out = dict(family="encoder_decoder", vocab_size=f.require("vocab_size"),
             d_model=f.require("d_model"), num_layers=f.require("encoder_layers"),
             num_decoder_layers=f.require("decoder_layers"),
             num_heads=_same(f, "encoder_attention_heads", "decoder_attention_heads"),
             d_ff=_same(f, "encoder_ffn_dim", "decoder_ffn_dim"), ffn=ACTS[act],
             ffn_bias=True, attention_bias=True, norm="layernorm", norm_placement="post",
             max_len=f.require("max_position_embeddings"), tie_embeddings=True,
             embed_scale=bool(f.get("scale_embedding", False)), final_logits_bias=True)
  if kind in ("bart", "mbart"):
    f.expect("normalize_embedding", (True,), True)
    out.update(position="learned", position_offset=2, embed_norm=True, share_embeddings=True,
               share_positions=False, norm_placement="pre" if pre else "post")
  else:
    if f.get("decoder_vocab_size", out["vocab_size"]) != out["vocab_size"]:
      raise UnsupportedError("marian config.json decoder_vocab_size differs from vocab_size "
                             "(separate target vocabulary) is not supported")
    f.expect("share_encoder_decoder_embeddings", (True,), True)
    out.update(position="sinusoidal", sinusoid_layout="halves", embed_norm=False)
  return out


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  heads, ffn = cfg.attention.num_heads, cfg.feed_forward
  out = dict(model_type=kind, vocab_size=cfg.vocab_size, d_model=cfg.d_model,
             encoder_layers=cfg.num_layers, decoder_layers=cfg.decoder_layers,
             encoder_attention_heads=heads, decoder_attention_heads=heads,
             encoder_ffn_dim=ffn.d_ff, decoder_ffn_dim=ffn.d_ff,
             activation_function=ACT_NAMES[ffn.activation], max_position_embeddings=cfg.max_len,
             scale_embedding=cfg.embed_scale, tie_word_embeddings=True, is_encoder_decoder=True)
  if kind == "marian":
    out.update(decoder_vocab_size=cfg.vocab_size, share_encoder_decoder_embeddings=True)
  return out


def _attention(hf: str, path: tuple, heads: int) -> list:
  out = []
  for name, tj in (("q", "query"), ("k", "key"), ("v", "value")):
    out += [mapping.heads_in(f"{hf}.{name}_proj.weight", path + (tj, "kernel"), heads),
            mapping.heads_bias(f"{hf}.{name}_proj.bias", path + (tj, "bias"), heads)]
  return out + [mapping.heads_out(f"{hf}.out_proj.weight", path + ("out", "kernel"), heads),
                mapping.copy(f"{hf}.out_proj.bias", path + ("out", "bias"))]


def _norm(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


def rules(cfg: ModelConfig) -> list:
  h = cfg.attention.num_heads
  bart = has_learned_table(cfg)
  tokens = ("shared", "embedding") if bart else ("embed", "tokens", "embedding")
  out = [mapping.copy("model.shared.weight", tokens),
         mapping.row_vector("final_logits_bias", ("final_logits_bias",))]
  for stack, layers in (("encoder", cfg.num_layers), ("decoder", cfg.decoder_layers)):
    hf_stack = f"model.{stack}."
    if bart:
      out.append(mapping.copy(f"{hf_stack}embed_positions.weight",
                              (f"{stack}_embed", "positions", "embedding")))
      out += _norm(f"{hf_stack}layernorm_embedding", (f"{stack}_embed", "norm"))
    if cfg.norms.has_final_norm:  # mBART
      out += _norm(f"{hf_stack}layer_norm", (stack, "final_norm"))
    for i in range(layers):
      hf, tj = f"{hf_stack}layers.{i}.", (stack, f"layers_{i}")
      out += _attention(f"{hf}self_attn", tj + ("self_attention",), h)
      out += _norm(f"{hf}self_attn_layer_norm", tj + ("self_attention_norm",))
      if stack == "decoder":
        out += _attention(f"{hf}encoder_attn", tj + ("cross_attention",), h)
        out += _norm(f"{hf}encoder_attn_layer_norm", tj + ("cross_attention_norm",))
      out += [mapping.linear(f"{hf}fc1.weight", tj + ("ffn", "wi", "kernel")),
              mapping.copy(f"{hf}fc1.bias", tj + ("ffn", "wi", "bias")),
              mapping.linear(f"{hf}fc2.weight", tj + ("ffn", "wo", "kernel")),
              mapping.copy(f"{hf}fc2.bias", tj + ("ffn", "wo", "bias"))]
      out += _norm(f"{hf}final_layer_norm", tj + ("ffn_norm",))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """The stacks' aliases of the shared table, the tied head, Marian's fixed sinusoid tables."""
  sinusoids = cfg.positions.kind == "sinusoidal" and name.endswith("embed_positions.weight")
  return sinusoids or name in ("model.encoder.embed_tokens.weight",
                               "model.decoder.embed_tokens.weight", "lm_head.weight")
