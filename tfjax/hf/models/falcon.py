"""Falcon: a pre-LayerNorm RoPE decoder, parallel (Falcon-7B: one shared norm, multi-query) or
the "new decoder architecture" (Falcon-40B/180B: grouped-query, ln_attn and ln_mlp), or
sequential (parallel_attn=False).

`query_key_value` holds, per kv group g of the K groups, its H/K query heads then its key head
then its value head ([K (H/K + 2) E, D]); multi-query is one group (K = 1) and the old
multi-head layout one group per head (K = H, [q, k, v] per head), so one rule reads all three.
The output head is tied to `word_embeddings` unless tie_word_embeddings=False. ALiBi Falcons
(falcon-rw) are refused.
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

# config.json fields Falcon's causal LM does not read (beyond mapping.IGNORED): its residual
# dropout.
IGNORED = {"falcon": frozenset(("hidden_dropout",))}


def _layout(f: Fields, heads: int):
  """(new_decoder_architecture, kv heads) as transformers' FalconAttention derives them."""
  new = bool(f.get("new_decoder_architecture", False))
  kv = f.get("num_kv_heads") or heads
  if new:
    f.ignore("multi_query")  # the new architecture reads num_kv_heads only
    kv = int(kv)
  else:
    kv = 1 if f.get("multi_query", True) else heads
  # transformers >= 5 also writes the derived count; it must agree with the layout above.
  stated = f.get("num_key_value_heads")
  if stated is not None and int(stated) != kv:
    raise UnsupportedError(f"falcon config.json num_key_value_heads={stated} disagrees with the "
                           f"{kv} key/value heads its num_kv_heads / multi_query give")
  return new, kv


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  d, heads = f.require("hidden_size"), f.require("num_attention_heads")
  if f.get("alibi", False):
    raise UnsupportedError("falcon config.json alibi=True (falcon-rw) is not supported")
  f.expect("apply_residual_connection_post_layernorm", (False,), False)
  act = f.get("activation", "gelu")
  if act not in ACTS:
    raise UnsupportedError(f"falcon config.json activation={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  new, kv = _layout(f, heads)
  parallel = bool(f.get("parallel_attn", True))
  norms = f.get("num_ln_in_parallel_attn")
  if new:
    norms = 2 if norms is None else int(norms)
    if norms == 1 and not parallel:
      raise UnsupportedError("falcon config.json new_decoder_architecture with "
                             "num_ln_in_parallel_attn=1 and parallel_attn=False is not a model "
                             "transformers can run")
    parallel = True  # the new architecture always adds attention and MLP in parallel
  bias = bool(f.get("bias", False))
  max_len = int(f.get("max_position_embeddings", 2048))
  return dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=d,
      num_layers=f.require("num_hidden_layers"), num_heads=heads, num_kv_heads=kv,
      d_ff=f.get("ffn_hidden_size") or 4 * d, ffn=ACTS[act], ffn_bias=bias,
      attention_bias=bias, norm="layernorm",
      **NormConfig.eps_from_hf(f, "layer_norm_epsilon", 1e-5),
      norm_placement="pre", parallel_block=parallel,
      parallel_shared_norm=not (new and norms == 2), position="rope", max_len=max_len,
      tie_embeddings=bool(f.get("tie_word_embeddings", True)),
      **RopeConfig.from_hf(f, max_len))


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  two_norms = cfg.parallel_block and not cfg.norms.parallel_shared_norm
  new = two_norms or cfg.attention.kv_heads not in (1, cfg.attention.num_heads)
  act = cfg.feed_forward.activation
  out = dict(model_type="falcon", vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
             num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
             num_kv_heads=cfg.attention.kv_heads, new_decoder_architecture=new,
             multi_query=cfg.attention.kv_heads == 1 and cfg.attention.num_heads > 1,
             parallel_attn=cfg.parallel_block,
             bias=cfg.attention.bias, ffn_hidden_size=cfg.feed_forward.d_ff,
             activation=ACT_NAMES.get(act, act),
             **cfg.norms.eps_to_hf("layer_norm_epsilon"),
             max_position_embeddings=cfg.max_len, alibi=False,
             tie_word_embeddings=cfg.tie_embeddings, **cfg.positions.rope.to_hf())
  if new:
    out["num_ln_in_parallel_attn"] = 2 if two_norms else 1
  return out


def grouped_qkv(hf: str, paths, heads: int, kv: int, weight: bool) -> Rule:
  """query_key_value [K (G + 2) E, D] (bias [K (G + 2) E]), G = heads / K, rows ordered (group,
  [G query heads, key, value], channel) <-> query [D, H, E], key and value [D, K, E] kernels
  (biases [H, E], [K, E])."""
  group = heads // kv

  def to_tfjax(arrays):
    w = arrays[0].reshape((kv, group + 2, -1) + arrays[0].shape[1:])  # [K, G+2, E(, D)]
    q = w[:, :group].reshape((heads,) + w.shape[2:])
    parts = [q, w[:, group], w[:, group + 1]]
    return [np.moveaxis(p, -1, 0) for p in parts] if weight else parts

  def to_hf(arrays):
    q, k, v = [np.moveaxis(a, 0, -1) for a in arrays] if weight else arrays
    q = q.reshape((kv, group) + q.shape[1:])
    stacked = np.concatenate([q, k[:, None], v[:, None]], axis=1)  # [K, G+2, E(, D)]
    return [stacked.reshape((-1,) + stacked.shape[3:]) if weight else stacked.reshape(-1)]
  return Rule((hf,), tuple(paths), to_tfjax, to_hf)


def _norm(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


def rules(cfg: ModelConfig) -> list:
  h, kv = cfg.attention.num_heads, cfg.attention.kv_heads
  out = [mapping.copy("transformer.word_embeddings.weight", ("embed", "tokens", "embedding"))]
  out += _norm("transformer.ln_f", ("decoder", "final_norm"))
  if not cfg.tie_embeddings:
    out.append(mapping.linear("lm_head.weight", ("lm_head", "kernel")))
  for i in range(cfg.num_layers):
    hf, tj = f"transformer.h.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    qkv = [att + (p,) for p in ("query", "key", "value")]
    out += [grouped_qkv(f"{hf}self_attention.query_key_value.weight",
                        [p + ("kernel",) for p in qkv], h, kv, weight=True),
            mapping.heads_out(f"{hf}self_attention.dense.weight", att + ("out", "kernel"), h)]
    for name, path in (("dense_h_to_4h", "wi"), ("dense_4h_to_h", "wo")):
      out.append(mapping.linear(f"{hf}mlp.{name}.weight", tj + ("ffn", path, "kernel")))
    if cfg.attention.bias:
      out += [grouped_qkv(f"{hf}self_attention.query_key_value.bias",
                          [p + ("bias",) for p in qkv], h, kv, weight=False),
              mapping.copy(f"{hf}self_attention.dense.bias", att + ("out", "bias")),
              mapping.copy(f"{hf}mlp.dense_h_to_4h.bias", tj + ("ffn", "wi", "bias")),
              mapping.copy(f"{hf}mlp.dense_4h_to_h.bias", tj + ("ffn", "wo", "bias"))]
    if cfg.parallel_block and not cfg.norms.parallel_shared_norm:
      out += _norm(f"{hf}ln_attn", tj + ("self_attention_norm",))
      out += _norm(f"{hf}ln_mlp", tj + ("ffn_norm",))
    else:
      out += _norm(f"{hf}input_layernorm", tj + ("self_attention_norm",))
      if not cfg.parallel_block:
        out += _norm(f"{hf}post_attention_layernorm", tj + ("ffn_norm",))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  return (cfg.tie_embeddings and name == "lm_head.weight") or name.endswith(
      "rotary_emb.inv_freq")
