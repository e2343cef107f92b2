"""LLaMA 1/2/3, Mistral, Qwen2, Qwen3, Gemma and Gemma 2: the pre-RMSNorm, RoPE, gated-FFN
decoders.

All share Hugging Face's `LlamaForCausalLM` tensor layout (q/k/v/o_proj, gate/up/down_proj,
input/post_attention_layernorm); they differ in config: Mistral's sliding window, Qwen2's q/k/v
biases without an o_proj bias, Qwen3's per-head RMSNorm of q and k (q_norm/k_norm, `qk_norm`),
Gemma's sqrt(d_model) embedding scale, (1 + w) norm gain and tanh GEGLU, Gemma 2's sandwich
norms, soft-capping, alternating sliding/global layers and query scale.
HF's RoPE is the rotate-half pairing (tfjax `position="rope"`).
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig
from tfjax.nn.rope_config import RopeConfig

# hidden_act -> model.ffn (each gated, as these families' MLPs are).
GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu",
              "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh"}
ACT_NAMES = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh"}

# config.json fields each model_type's transformers model does not read (beyond
# mapping.IGNORED). Qwen2/Qwen3 read the window fields only with use_sliding_window=True (which
# is refused); Gemma 2 reads `hidden_activation` only, so its released configs' `hidden_act` is
# inert.
_QWEN = ("sliding_window", "max_window_layers")
IGNORED = {"qwen2": frozenset(_QWEN), "qwen3": frozenset(_QWEN),
           "gemma2": frozenset(("hidden_act",))}


def activation(kind: str, f: Fields) -> str:
  """The gated FFN's activation name as transformers runs it.

  Gemma 2 and 3 read `hidden_activation` (default tanh GELU). Gemma 1 reads `hidden_act` and, like
  transformers' GemmaConfig, runs its legacy value "gelu" as tanh GELU (the released
  checkpoints were trained with it); transformers releases before that rewrite read
  `hidden_activation` instead, so a config where the two disagree is refused. The others read
  `hidden_act`.
  """
  if kind in ("gemma2", "gemma3_text"):
    return f.get("hidden_activation") or "gelu_pytorch_tanh"
  if kind != "gemma":
    return f.get("hidden_act", "silu")
  act = f.get("hidden_act", "gelu_pytorch_tanh")
  act = "gelu_pytorch_tanh" if act == "gelu" else act
  legacy = f.get("hidden_activation")
  if legacy is not None and GATED_ACTS.get(legacy) != GATED_ACTS.get(act):
    raise UnsupportedError(
        f"gemma config.json hidden_act={f.values.get('hidden_act')!r} (run as {act!r}) and "
        f"hidden_activation={legacy!r} disagree, and transformers versions read different "
        "ones; remove hidden_activation or make them agree")
  return act


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  """ModelConfig keys of a LLaMA-family config.json (`kind` = its model_type)."""
  del names
  d, heads = f.require("hidden_size"), f.require("num_attention_heads")
  head_dim = f.get("head_dim") or d // heads
  max_len = int(f.get("max_position_embeddings", 2048))
  act = activation(kind, f)
  if act not in GATED_ACTS:
    raise UnsupportedError(f"{kind} config.json hidden_act={act!r} is not supported "
                           f"(supported: {sorted(GATED_ACTS)})")
  qkv_bias = bool(f.get("attention_bias", False))
  cfg = dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=d,
      num_layers=f.require("num_hidden_layers"), num_heads=heads,
      num_kv_heads=f.get("num_key_value_heads") or heads,
      head_dim=None if head_dim * heads == d else head_dim,
      d_ff=f.require("intermediate_size"), ffn=GATED_ACTS[act],
      ffn_bias=bool(f.expect("mlp_bias", (False, True), False)) if kind == "llama" else False,
      attention_bias=qkv_bias, norm="rmsnorm", **NormConfig.eps_from_hf(f, "rms_norm_eps", 1e-6),
      norm_placement="pre", position="rope", max_len=max_len,
      tie_embeddings=bool(f.get("tie_word_embeddings", kind.startswith("gemma"))),
      **RopeConfig.from_hf(f, max_len))
  if "rotary_fraction" in cfg:
    raise UnsupportedError(f"{kind} config.json partial_rotary_factor={cfg['rotary_fraction']} "
                           f"(partial RoPE) is not supported for {kind}: its attention rotates "
                           "every channel")
  layer_types = f.get("layer_types")
  if kind in ("qwen2", "qwen3"):
    if kind == "qwen2":
      cfg["attention_bias"], cfg["attention_out_bias"] = True, False
    else:
      cfg["qk_norm"] = "rmsnorm"
    if f.get("use_sliding_window", False):
      raise UnsupportedError(f"{kind} config.json use_sliding_window=True (sliding window on the "
                             "layers above max_window_layers) is not supported")
  elif kind == "mistral":
    window = f.get("sliding_window")
    if window is not None:
      cfg["window"] = int(window)
  if kind.startswith("gemma"):
    cfg.update(embed_scale=True, norm_unit_offset=True)
    if f.get("use_bidirectional_attention"):
      raise UnsupportedError(f"{kind} config.json use_bidirectional_attention=True is not "
                             "supported")
  if kind == "gemma2":
    cfg.update(_gemma2(f, layer_types, head_dim))
  elif layer_types is not None and set(layer_types) != {"full_attention"} and kind != "mistral":
    raise UnsupportedError(f"{kind} config.json layer_types={layer_types} (sliding-window "
                           "layers) is not supported")
  return cfg


def _gemma2(f: Fields, layer_types, head_dim) -> dict:
  window = int(f.require("sliding_window"))
  n = f.require("num_hidden_layers")
  pattern = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
  if layer_types is not None and list(layer_types) != pattern:
    raise UnsupportedError(f"gemma2 config.json layer_types={layer_types}: tfjax supports "
                           "Gemma 2's alternation (sliding, full, sliding, ...) only")
  scalar = f.get("query_pre_attn_scalar", head_dim)
  return dict(norm_placement="sandwich", window=window, window_pattern=2,
              attention_softcap=f.get("attn_logit_softcapping"),
              logits_softcap=f.get("final_logit_softcapping"),
              attention_scale=float(scalar) ** -0.5)


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  act = cfg.feed_forward.activation
  out = dict(
      model_type=kind, vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.attention.num_heads,
      num_key_value_heads=cfg.attention.kv_heads, head_dim=cfg.dim_per_head,
      intermediate_size=cfg.feed_forward.d_ff, hidden_act=ACT_NAMES.get(act, act),
      **cfg.norms.eps_to_hf("rms_norm_eps"), max_position_embeddings=cfg.max_len,
      tie_word_embeddings=cfg.tie_embeddings, **cfg.positions.rope.to_hf())
  if kind == "llama":
    out.update(attention_bias=cfg.attention.bias, mlp_bias=cfg.feed_forward.bias)
  if kind == "gemma":
    if act == "geglu":
      raise UnsupportedError(
          "model_type 'gemma' cannot express model.ffn='geglu' (exact-erf GeGLU): transformers' "
          "GemmaConfig runs hidden_act='gelu' as tanh GELU; train with model.ffn='geglu_tanh'")
    out["attention_bias"] = cfg.attention.bias
  if kind == "mistral":
    out["sliding_window"] = cfg.attention.window
  if kind in ("qwen2", "qwen3"):
    out.update(use_sliding_window=False, sliding_window=None)
  if kind == "qwen3":
    out["attention_bias"] = cfg.attention.bias
  if kind == "gemma2":
    del out["hidden_act"]
    out.update(hidden_activation=ACT_NAMES[act], attention_bias=cfg.attention.bias,
               sliding_window=cfg.attention.window,
               query_pre_attn_scalar=round(cfg.attention.scale ** -2),
               attn_logit_softcapping=cfg.attention.softcap,
               final_logit_softcapping=cfg.logits_softcap)
  return out


def rules(cfg: ModelConfig) -> list:
  heads, kv = cfg.attention.num_heads, cfg.attention.kv_heads
  out = [mapping.copy("model.embed_tokens.weight", ("embed", "tokens", "embedding")),
         mapping.copy("model.norm.weight", ("decoder", "final_norm", "scale"))]
  if not cfg.tie_embeddings:
    out.append(mapping.linear("lm_head.weight", ("lm_head", "kernel")))
  for i in range(cfg.num_layers):
    hf, tj = f"model.layers.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    for name, path, n in (("q", "query", heads), ("k", "key", kv), ("v", "value", kv)):
      out.append(mapping.heads_in(f"{hf}self_attn.{name}_proj.weight", att + (path, "kernel"), n))
      if cfg.attention.bias:
        out.append(mapping.heads_bias(f"{hf}self_attn.{name}_proj.bias", att + (path, "bias"), n))
    if cfg.attention.qk_norm == "rmsnorm":  # Qwen3: one [head_dim] gain for every head
      out += [mapping.copy(f"{hf}self_attn.q_norm.weight", att + ("query_norm", "scale")),
              mapping.copy(f"{hf}self_attn.k_norm.weight", att + ("key_norm", "scale"))]
    out.append(mapping.heads_out(f"{hf}self_attn.o_proj.weight", att + ("out", "kernel"), heads))
    if cfg.attention.uses_out_bias:
      out.append(mapping.copy(f"{hf}self_attn.o_proj.bias", att + ("out", "bias")))
    for name, path in (("gate_proj", "wi_gate"), ("up_proj", "wi"), ("down_proj", "wo")):
      out.append(mapping.linear(f"{hf}mlp.{name}.weight", tj + ("ffn", path, "kernel")))
      if cfg.feed_forward.bias:
        out.append(mapping.copy(f"{hf}mlp.{name}.bias", tj + ("ffn", path, "bias")))
    out.append(mapping.copy(f"{hf}input_layernorm.weight", tj + ("self_attention_norm", "scale")))
    if cfg.norms.placement == "sandwich":
      norms = (("post_attention_layernorm", "self_attention_post_norm"),
               ("pre_feedforward_layernorm", "ffn_norm"),
               ("post_feedforward_layernorm", "ffn_post_norm"))
    else:
      norms = (("post_attention_layernorm", "ffn_norm"),)
    for name, path in norms:
      out.append(mapping.copy(f"{hf}{name}.weight", tj + (path, "scale")))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """Tensors a checkpoint may hold that the model derives: a tied output matrix, RoPE buffers."""
  return (cfg.tie_embeddings and name == "lm_head.weight") or name.endswith("rotary_emb.inv_freq")
