"""OPT: a decoder with learned positions read at p + 2, ReLU FFN, biases everywhere, a tied head.

OPT's position table has max_position_embeddings + 2 rows and position p reads row p + 2
(tfjax `position_offset=2`; transformers counts p over the attention mask's ones, which is
0, 1, ... for unpadded rows, tfjax's default positions). Pre-LN with a
final LayerNorm (do_layer_norm_before, all released sizes but 350m) or post-LN without one
(opt-350m, whose 512-wide embedding projected in and out is not supported).
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.models import bart
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig

# config.json fields OPT's causal LM does not read (beyond mapping.IGNORED): none; its dropouts
# and layerdrop are there.
IGNORED = {"opt": frozenset()}


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  act = f.get("activation_function", "relu")
  if act not in bart.ACTS:
    raise UnsupportedError(f"opt config.json activation_function={act!r} is not supported "
                           f"(supported: {sorted(bart.ACTS)})")
  d = f.require("hidden_size")
  proj = f.get("word_embed_proj_dim")
  if proj is not None and proj != d:
    raise UnsupportedError(f"opt config.json word_embed_proj_dim={proj} differs from "
                           f"hidden_size={d} (embeddings projected in and out, opt-350m) is not "
                           "supported")
  f.expect("layer_norm_elementwise_affine", (True,), True)
  pre = bool(f.get("do_layer_norm_before", True))
  if pre:
    f.expect("_remove_final_layer_norm", (False,), False)
  else:
    f.ignore("_remove_final_layer_norm")  # post-LN OPT has no final norm either way
  if not f.get("tie_word_embeddings", True):
    raise UnsupportedError("opt config.json tie_word_embeddings=False is not supported")
  bias = bool(f.get("enable_bias", True))
  return dict(family="decoder", vocab_size=f.require("vocab_size"), d_model=d,
              num_layers=f.require("num_hidden_layers"),
              num_heads=f.require("num_attention_heads"), d_ff=f.require("ffn_dim"),
              ffn=bart.ACTS[act], ffn_bias=bias, attention_bias=bias, norm="layernorm",
              norm_eps=1e-5, norm_placement="pre" if pre else "post", position="learned",
              max_len=f.require("max_position_embeddings"), position_offset=2,
              tie_embeddings=True)


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  return dict(model_type="opt", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              word_embed_proj_dim=cfg.d_model, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.attention.num_heads, ffn_dim=cfg.feed_forward.d_ff,
              activation_function=bart.ACT_NAMES[cfg.feed_forward.activation],
              enable_bias=cfg.attention.bias,
              do_layer_norm_before=cfg.norms.placement == "pre",
              max_position_embeddings=cfg.max_len, tie_word_embeddings=True)


def _norm(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


def rules(cfg: ModelConfig) -> list:
  h, bias = cfg.attention.num_heads, cfg.attention.bias
  out = [mapping.copy("model.decoder.embed_tokens.weight", ("embed", "tokens", "embedding")),
         mapping.copy("model.decoder.embed_positions.weight",
                      ("embed", "positions", "embedding"))]
  if cfg.norms.has_final_norm:
    out += _norm("model.decoder.final_layer_norm", ("decoder", "final_norm"))
  for i in range(cfg.num_layers):
    hf, tj = f"model.decoder.layers.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    for name, path in (("q", "query"), ("k", "key"), ("v", "value")):
      out.append(mapping.heads_in(f"{hf}self_attn.{name}_proj.weight", att + (path, "kernel"), h))
      if bias:
        out.append(mapping.heads_bias(f"{hf}self_attn.{name}_proj.bias", att + (path, "bias"),
                                      h))
    out.append(mapping.heads_out(f"{hf}self_attn.out_proj.weight", att + ("out", "kernel"), h))
    for name, path in (("fc1", "wi"), ("fc2", "wo")):
      out.append(mapping.linear(f"{hf}{name}.weight", tj + ("ffn", path, "kernel")))
    if bias:
      out += [mapping.copy(f"{hf}self_attn.out_proj.bias", att + ("out", "bias")),
              mapping.copy(f"{hf}fc1.bias", tj + ("ffn", "wi", "bias")),
              mapping.copy(f"{hf}fc2.bias", tj + ("ffn", "wo", "bias"))]
    out += _norm(f"{hf}self_attn_layer_norm", tj + ("self_attention_norm",))
    out += _norm(f"{hf}final_layer_norm", tj + ("ffn_norm",))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  del cfg
  return name == "lm_head.weight"
