"""GPT-NeoX (Pythia): pre-LayerNorm decoder with a parallel block, partial RoPE, fused QKV.

Each layer computes x + attn(input_layernorm(x)) + mlp(post_attention_layernorm(x))
(`use_parallel_residual`, tfjax `parallel_block` with two norms) or, with
use_parallel_residual=False, the sequential pre-LN block. RoPE (rotate-half pairing) turns the
first rotary_pct of each head's channels (`rotary_fraction`, 0.25 in Pythia). `query_key_value`
interleaves per head: output row h*3E + j*E + e is head h's q (j=0), k (1) or v (2) channel e.
The untied output head is `embed_out`.
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, Rule, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig
from tfjax.nn.rope_config import RopeConfig

ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
        "relu": "relu", "silu": "silu"}
ACT_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}

# config.json fields GPT-NeoX's causal LM does not read (beyond mapping.IGNORED): its residual
# dropout and the decoder flag (the causal LM is causal either way).
IGNORED = {"gpt_neox": frozenset(("hidden_dropout", "is_decoder"))}


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  act = f.get("hidden_act", "gelu")
  if act not in ACTS:
    raise UnsupportedError(f"gpt_neox config.json hidden_act={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  max_len = int(f.get("max_position_embeddings", 2048))
  parallel = bool(f.get("use_parallel_residual", True))
  bias = bool(f.get("attention_bias", True))
  return dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=f.require("hidden_size"),
      num_layers=f.require("num_hidden_layers"), num_heads=f.require("num_attention_heads"),
      d_ff=f.require("intermediate_size"), ffn=ACTS[act], ffn_bias=True, attention_bias=bias,
      norm="layernorm", **NormConfig.eps_from_hf(f, "layer_norm_eps", 1e-5), norm_placement="pre",
      parallel_block=parallel, parallel_shared_norm=not parallel, position="rope",
      max_len=max_len, tie_embeddings=bool(f.get("tie_word_embeddings", False)),
      **RopeConfig.from_hf(f, max_len, theta_key="rotary_emb_base", fraction_key="rotary_pct",
                           fraction_default=0.25))


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  act = cfg.feed_forward.activation
  return dict(model_type="gpt_neox", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
              intermediate_size=cfg.feed_forward.d_ff, hidden_act=ACT_NAMES.get(act, act),
              attention_bias=cfg.attention.bias, **cfg.norms.eps_to_hf("layer_norm_eps"),
              use_parallel_residual=cfg.parallel_block, max_position_embeddings=cfg.max_len,
              tie_word_embeddings=cfg.tie_embeddings,
              **cfg.positions.rope.to_hf(with_fraction=True))


def interleaved_qkv(hf: str, paths, heads: int, weight: bool) -> Rule:
  """query_key_value weight [H*3*E, D] (bias [H*3*E]), rows ordered (head, q/k/v, channel) <->
  query, key, value kernels [D, H, E] (biases [H, E])."""
  def to_tfjax(arrays):
    w = arrays[0].reshape((heads, 3, -1) + arrays[0].shape[1:])
    if weight:  # [H, 3, E, D] -> three [D, H, E]
      return [np.transpose(w[:, j], (2, 0, 1)) for j in range(3)]
    return [w[:, j] for j in range(3)]

  def to_hf(arrays):
    if weight:
      stacked = np.stack([np.transpose(a, (1, 2, 0)) for a in arrays], axis=1)  # [H, 3, E, D]
      return [stacked.reshape(-1, stacked.shape[-1])]
    return [np.stack(arrays, axis=1).reshape(-1)]
  return Rule((hf,), tuple(paths), to_tfjax, to_hf)


def _norm(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


def rules(cfg: ModelConfig) -> list:
  h = cfg.attention.num_heads
  out = [mapping.copy("gpt_neox.embed_in.weight", ("embed", "tokens", "embedding"))]
  out += _norm("gpt_neox.final_layer_norm", ("decoder", "final_norm"))
  if not cfg.tie_embeddings:
    out.append(mapping.linear("embed_out.weight", ("lm_head", "kernel")))
  for i in range(cfg.num_layers):
    hf, tj = f"gpt_neox.layers.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    qkv = [att + (p,) for p in ("query", "key", "value")]
    out.append(interleaved_qkv(f"{hf}attention.query_key_value.weight",
                               [p + ("kernel",) for p in qkv], h, weight=True))
    out.append(mapping.heads_out(f"{hf}attention.dense.weight", att + ("out", "kernel"), h))
    if cfg.attention.bias:
      out.append(interleaved_qkv(f"{hf}attention.query_key_value.bias",
                                 [p + ("bias",) for p in qkv], h, weight=False))
      out.append(mapping.copy(f"{hf}attention.dense.bias", att + ("out", "bias")))
    for name, path in (("dense_h_to_4h", "wi"), ("dense_4h_to_h", "wo")):
      out += [mapping.linear(f"{hf}mlp.{name}.weight", tj + ("ffn", path, "kernel")),
              mapping.copy(f"{hf}mlp.{name}.bias", tj + ("ffn", path, "bias"))]
    out += _norm(f"{hf}input_layernorm", tj + ("self_attention_norm",))
    out += _norm(f"{hf}post_attention_layernorm", tj + ("ffn_norm",))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """A tied head saved anyway, the causal-mask and RoPE buffers old checkpoints hold."""
  return (cfg.tie_embeddings and name == "embed_out.weight") or name.endswith(
      ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq"))
