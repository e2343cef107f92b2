"""Phi (phi-1, phi-1.5, phi-2): a parallel block with one shared LayerNorm, partial RoPE and an
output head with a bias.

Each layer computes x + attn(input_layernorm(x)) + mlp(input_layernorm(x)) (tfjax
`parallel_block` with `parallel_shared_norm`); RoPE (rotate-half) turns the first
partial_rotary_factor of each head's channels (`rotary_fraction`, 0.4 in phi-2; 0.5 when the
field is absent, as transformers' PhiConfig sets it). Every projection has a bias; the untied
`lm_head` bias is tfjax's decoder `final_logits_bias`.
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.models import gpt_neox
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig
from tfjax.nn.rope_config import RopeConfig

# config.json fields Phi's causal LM does not read: none beyond mapping.IGNORED (its dropouts,
# resid_pdrop and embd_pdrop, are there).
IGNORED = {"phi": frozenset()}


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  act = f.get("hidden_act", "gelu_new")
  if act not in gpt_neox.ACTS:
    raise UnsupportedError(f"phi config.json hidden_act={act!r} is not supported "
                           f"(supported: {sorted(gpt_neox.ACTS)})")
  f.expect("qk_layernorm", (False,), False)
  if f.get("tie_word_embeddings", False):
    raise UnsupportedError("phi config.json tie_word_embeddings=True (a tied head with its own "
                           "bias) is not supported")
  heads = f.require("num_attention_heads")
  max_len = int(f.get("max_position_embeddings", 2048))
  return dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=f.require("hidden_size"),
      num_layers=f.require("num_hidden_layers"), num_heads=heads,
      num_kv_heads=f.get("num_key_value_heads") or heads, d_ff=f.require("intermediate_size"),
      ffn=gpt_neox.ACTS[act], ffn_bias=True, attention_bias=True, norm="layernorm",
      **NormConfig.eps_from_hf(f, "layer_norm_eps", 1e-5), norm_placement="pre",
      parallel_block=True,
      position="rope", max_len=max_len, tie_embeddings=False, final_logits_bias=True,
      **RopeConfig.from_hf(f, max_len, fraction_default=0.5))


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  act = cfg.feed_forward.activation
  return dict(model_type="phi", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
              num_key_value_heads=cfg.attention.kv_heads, intermediate_size=cfg.feed_forward.d_ff,
              hidden_act=gpt_neox.ACT_NAMES.get(act, act),
              **cfg.norms.eps_to_hf("layer_norm_eps"),
              max_position_embeddings=cfg.max_len, qk_layernorm=False,
              tie_word_embeddings=False, **cfg.positions.rope.to_hf(with_fraction=True))


def _norm(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


def rules(cfg: ModelConfig) -> list:
  heads, kv = cfg.attention.num_heads, cfg.attention.kv_heads
  out = [mapping.copy("model.embed_tokens.weight", ("embed", "tokens", "embedding")),
         mapping.linear("lm_head.weight", ("lm_head", "kernel")),
         mapping.copy("lm_head.bias", ("final_logits_bias",))]
  out += _norm("model.final_layernorm", ("decoder", "final_norm"))
  for i in range(cfg.num_layers):
    hf, tj = f"model.layers.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    for name, path, n in (("q", "query", heads), ("k", "key", kv), ("v", "value", kv)):
      out += [mapping.heads_in(f"{hf}self_attn.{name}_proj.weight", att + (path, "kernel"), n),
              mapping.heads_bias(f"{hf}self_attn.{name}_proj.bias", att + (path, "bias"), n)]
    out += [mapping.heads_out(f"{hf}self_attn.dense.weight", att + ("out", "kernel"), heads),
            mapping.copy(f"{hf}self_attn.dense.bias", att + ("out", "bias"))]
    for name, path in (("fc1", "wi"), ("fc2", "wo")):
      out += [mapping.linear(f"{hf}mlp.{name}.weight", tj + ("ffn", path, "kernel")),
              mapping.copy(f"{hf}mlp.{name}.bias", tj + ("ffn", path, "bias"))]
    out += _norm(f"{hf}input_layernorm", tj + ("self_attention_norm",))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  del cfg
  return name.endswith("rotary_emb.inv_freq")
