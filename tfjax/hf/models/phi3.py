"""Phi-3 (and Phi-4-mini): LLaMA's pre-RMSNorm SwiGLU decoder with fused projections.

`qkv_proj` stacks W_Q, W_K, W_V by rows ([(H + 2K) E, D]: all query heads, then the key heads,
then the value heads) and `gate_up_proj` stacks the gate over the up projection ([2F, D]); both
split here into tfjax's separate kernels. `sliding_window` (2047 in Phi-3-mini) is tfjax's
`window`; `partial_rotary_factor` (Phi-4-mini: 0.75) is `rotary_fraction`. RoPE scaling: the
types tfjax implements (tfjax/hf/models/llama.py); `longrope` (the 128k models) is refused by name.
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.models import llama
from tfjax.hf.mapping import Fields, Rule, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig
from tfjax.nn.rope_config import RopeConfig

# config.json fields Phi-3's causal LM does not read (beyond mapping.IGNORED): the training
# context length, read only by `longrope` scaling (refused).
IGNORED = {"phi3": frozenset(("original_max_position_embeddings",))}


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  d, heads = f.require("hidden_size"), f.require("num_attention_heads")
  act = f.get("hidden_act", "silu")
  if act not in llama.GATED_ACTS:
    raise UnsupportedError(f"phi3 config.json hidden_act={act!r} is not supported "
                           f"(supported: {sorted(llama.GATED_ACTS)})")
  f.expect("attention_bias", (False,), False)  # transformers' Phi-3 has no biases
  max_len = int(f.get("max_position_embeddings", 4096))
  window = f.get("sliding_window")
  cfg = dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=d,
      num_layers=f.require("num_hidden_layers"), num_heads=heads,
      num_kv_heads=f.get("num_key_value_heads") or heads, d_ff=f.require("intermediate_size"),
      ffn=llama.GATED_ACTS[act], ffn_bias=False, attention_bias=False, norm="rmsnorm",
      **NormConfig.eps_from_hf(f, "rms_norm_eps", 1e-5), norm_placement="pre", position="rope",
      max_len=max_len, tie_embeddings=bool(f.get("tie_word_embeddings", False)),
      **RopeConfig.from_hf(f, max_len))
  if window is not None:
    cfg["window"] = int(window)
  return cfg


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  act = cfg.feed_forward.activation
  return dict(model_type="phi3", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
              num_key_value_heads=cfg.attention.kv_heads, intermediate_size=cfg.feed_forward.d_ff,
              hidden_act=llama.ACT_NAMES.get(act, act),
              **cfg.norms.eps_to_hf("rms_norm_eps"),
              max_position_embeddings=cfg.max_len, sliding_window=cfg.attention.window,
              tie_word_embeddings=cfg.tie_embeddings, **cfg.positions.rope.to_hf())


def stacked_heads(hf: str, paths, heads, head_dim: int) -> Rule:
  """Linear weight [(h_0 + h_1 + ...) E, D], row blocks of h_i heads each <-> kernels
  [D, h_i, E]."""
  bounds = np.cumsum([h * head_dim for h in heads])[:-1]

  def to_tfjax(arrays):
    return [w.T.reshape(w.shape[1], h, head_dim)
            for w, h in zip(np.split(arrays[0], bounds, axis=0), heads)]

  def to_hf(arrays):
    return [np.concatenate([k.reshape(k.shape[0], -1).T for k in arrays], axis=0)]
  return Rule((hf,), tuple(paths), to_tfjax, to_hf)


def stacked_linear(hf: str, paths) -> Rule:
  """Linear weight [n F, D], n equal row blocks <-> n kernels [D, F] (gate_up_proj: gate, up)."""
  def to_tfjax(arrays):
    return [w.T for w in np.split(arrays[0], len(paths), axis=0)]

  def to_hf(arrays):
    return [np.concatenate([k.T for k in arrays], axis=0)]
  return Rule((hf,), tuple(paths), to_tfjax, to_hf)


def rules(cfg: ModelConfig) -> list:
  out = [mapping.copy("model.embed_tokens.weight", ("embed", "tokens", "embedding")),
         mapping.copy("model.norm.weight", ("decoder", "final_norm", "scale"))]
  if not cfg.tie_embeddings:
    out.append(mapping.linear("lm_head.weight", ("lm_head", "kernel")))
  for i in range(cfg.num_layers):
    hf, tj = f"model.layers.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    out += [
        stacked_heads(f"{hf}self_attn.qkv_proj.weight",
                      [att + (p, "kernel") for p in ("query", "key", "value")],
                      (cfg.attention.num_heads, cfg.attention.kv_heads, cfg.attention.kv_heads),
                      cfg.dim_per_head),
        mapping.heads_out(f"{hf}self_attn.o_proj.weight", att + ("out", "kernel"),
                          cfg.attention.num_heads),
        stacked_linear(f"{hf}mlp.gate_up_proj.weight",
                       [tj + ("ffn", "wi_gate", "kernel"), tj + ("ffn", "wi", "kernel")]),
        mapping.linear(f"{hf}mlp.down_proj.weight", tj + ("ffn", "wo", "kernel")),
        mapping.copy(f"{hf}input_layernorm.weight", tj + ("self_attention_norm", "scale")),
        mapping.copy(f"{hf}post_attention_layernorm.weight", tj + ("ffn_norm", "scale"))]
  return out


droppable = llama.droppable
