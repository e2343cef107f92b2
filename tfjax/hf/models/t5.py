"""T5 v1.0 and v1.1: pre-RMSNorm encoder-decoder with bucketed relative position bias.

One bias table per stack (in the first layer's self-attention in HF, `<stack>/relative_bias` in
tfjax), no attention biases and no 1/sqrt(d_k) score scale (`attention_scale=1`). v1.0: ReLU FFN
and the tied output head reading h * d_model^-0.5 (`scale_tied_logits`); v1.1: gated-GELU FFN
(`wi_0` is the gate) and no rescale. transformers 5 always ties the head to `shared` and records
the rescale as `scale_decoder_outputs`; a transformers 4 v1.1 checkpoint with its own `lm_head`
imports untied.
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig

# config.json fields that do not change T5's logits (beyond mapping.IGNORED): `n_positions`
# (relative position buckets have no table length; the released v1.0 configs carry it) and
# the activation fields transformers derives from feed_forward_proj.
IGNORED = {"t5": frozenset(("n_positions", "dense_act_fn", "is_gated_act"))}

# feed_forward_proj -> model.ffn
FFNS = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu_tanh", "gated-relu": "reglu",
        "gated-silu": "swiglu", "gated-gelu_new": "geglu_tanh"}
FFN_NAMES = {"relu": "relu", "gelu": "gelu", "geglu_tanh": "gated-gelu", "reglu": "gated-relu",
             "swiglu": "gated-silu"}
GATED = ("geglu_tanh", "reglu", "swiglu")


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind
  proj = f.get("feed_forward_proj", "relu")
  if proj not in FFNS:
    raise UnsupportedError(f"t5 config.json feed_forward_proj={proj!r} is not supported "
                           f"(supported: {sorted(FFNS)})")
  f.expect("is_decoder", (False,), False)
  tie_flag = f.get("tie_word_embeddings", True)
  untied = "lm_head.weight" in names and tie_flag is False
  scale = False if untied else bool(f.get("scale_decoder_outputs", tie_flag is not False))
  layers = f.require("num_layers")
  return dict(family="encoder_decoder", vocab_size=f.require("vocab_size"),
              d_model=f.require("d_model"), num_layers=layers,
              num_decoder_layers=f.get("num_decoder_layers") or layers,
              num_heads=f.require("num_heads"), head_dim=f.require("d_kv"),
              d_ff=f.require("d_ff"), ffn=FFNS[proj], ffn_bias=False, attention_bias=False,
              norm="rmsnorm", **NormConfig.eps_from_hf(f, "layer_norm_epsilon", 1e-6),
              norm_placement="pre", position="t5_bias", attention_scale=1.0,
              relative_buckets=f.get("relative_attention_num_buckets", 32),
              relative_max_distance=f.get("relative_attention_max_distance", 128),
              tie_embeddings=not untied, scale_tied_logits=scale)


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  return dict(model_type="t5", vocab_size=cfg.vocab_size, d_model=cfg.d_model,
              num_layers=cfg.num_layers, num_decoder_layers=cfg.decoder_layers,
              num_heads=cfg.attention.num_heads, d_kv=cfg.dim_per_head, d_ff=cfg.feed_forward.d_ff,
              feed_forward_proj=FFN_NAMES[cfg.feed_forward.activation],
              **cfg.norms.eps_to_hf("layer_norm_epsilon"),
              relative_attention_num_buckets=cfg.positions.relative_buckets,
              relative_attention_max_distance=cfg.positions.relative_max_distance,
              tie_word_embeddings=cfg.tie_embeddings,
              scale_decoder_outputs=cfg.scale_tied_logits, is_encoder_decoder=True)


def _attention(hf: str, path: tuple, heads: int) -> list:
  return [mapping.heads_in(f"{hf}.q.weight", path + ("query", "kernel"), heads),
          mapping.heads_in(f"{hf}.k.weight", path + ("key", "kernel"), heads),
          mapping.heads_in(f"{hf}.v.weight", path + ("value", "kernel"), heads),
          mapping.heads_out(f"{hf}.o.weight", path + ("out", "kernel"), heads)]


def _ffn(hf: str, path: tuple, gated: bool) -> list:
  if gated:
    out = [mapping.linear(f"{hf}.wi_0.weight", path + ("wi_gate", "kernel")),
           mapping.linear(f"{hf}.wi_1.weight", path + ("wi", "kernel"))]
  else:
    out = [mapping.linear(f"{hf}.wi.weight", path + ("wi", "kernel"))]
  return out + [mapping.linear(f"{hf}.wo.weight", path + ("wo", "kernel"))]


def rules(cfg: ModelConfig) -> list:
  h, gated = cfg.attention.num_heads, cfg.feed_forward.activation in GATED
  out = [mapping.copy("shared.weight", ("embed", "tokens", "embedding"))]
  if not cfg.tie_embeddings:
    out.append(mapping.linear("lm_head.weight", ("lm_head", "kernel")))
  for stack, layers in (("encoder", cfg.num_layers), ("decoder", cfg.decoder_layers)):
    out += [mapping.copy(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                         (stack, "relative_bias", "embedding")),
            mapping.copy(f"{stack}.final_layer_norm.weight", (stack, "final_norm", "scale"))]
    for i in range(layers):
      hf, tj = f"{stack}.block.{i}.layer.", (stack, f"layers_{i}")
      sub = [("SelfAttention", "self_attention")]
      if stack == "decoder":
        sub.append(("EncDecAttention", "cross_attention"))
      for j, (name, path) in enumerate(sub):
        out += _attention(f"{hf}{j}.{name}", tj + (path,), h)
        out.append(mapping.copy(f"{hf}{j}.layer_norm.weight", tj + (f"{path}_norm", "scale")))
      j = len(sub)
      out += _ffn(f"{hf}{j}.DenseReluDense", tj + ("ffn",), gated)
      out.append(mapping.copy(f"{hf}{j}.layer_norm.weight", tj + ("ffn_norm", "scale")))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """The stacks' aliases of the shared embedding, and a tied head saved anyway."""
  return name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight") or (
      cfg.tie_embeddings and name == "lm_head.weight")
