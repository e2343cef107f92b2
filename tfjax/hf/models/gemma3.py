"""Gemma 3 (text, `gemma3_text`): Gemma 2's sandwich-normed decoder with QK RMSNorm, a
local/global layer pattern and two RoPE bases.

Layer i is global iff (i + 1) % pattern == 0 (pattern 6 in the released models: five
sliding-window layers, then one global; tfjax `window_pattern`), from `layer_types` or the legacy
`sliding_window_pattern` (export writes both, so a stack shorter than its pattern keeps it).
Global layers rotate with `rope_theta` (1e6) and the config's RoPE
scaling, sliding layers with `rope_local_base_freq` (1e4) unscaled (tfjax `rope_local_base`);
transformers 5 writes both as `rope_parameters` {"full_attention": ..., "sliding_attention":
...}. q and k get a per-head (1 + w) RMSNorm before RoPE (`qk_norm`), scores scale by
query_pre_attn_scalar^-0.5, embeddings by sqrt(d_model). The tensors are LLaMA's plus Gemma 2's
norms and q_norm / k_norm (tfjax/hf/models/llama.py rules).
"""

from __future__ import annotations

from tfjax.hf.models import llama
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig
from tfjax.nn.rope_config import RopeConfig

# config.json fields Gemma 3's text model does not read (beyond mapping.IGNORED): `hidden_act`
# (it reads hidden_activation).
IGNORED = {"gemma3_text": frozenset(("hidden_act",))}


def _layout(pattern, n: int) -> list:
  """transformers' layer_types of a pattern (None: every layer slides)."""
  return ["full_attention" if pattern and (i + 1) % pattern == 0 else "sliding_attention"
          for i in range(n)]


def _window_pattern(f: Fields, n: int):
  """tfjax window_pattern of the layout transformers runs (None: every layer slides).

  Gemma3TextConfig runs `layer_types` when given, else derives it from `sliding_window_pattern`
  (default 6); `_sliding_window_pattern` is only its saved copy, never a layout of its own. A
  pattern field that agrees with `layer_types` is kept as the pattern: a stack shorter than the
  pattern has no global layer, and its pattern is what an export writes back.
  """
  types = f.get("layer_types")
  given, saved = f.get("sliding_window_pattern"), f.get("_sliding_window_pattern")
  if types is None:
    return int(6 if given is None else given)
  for pattern in (given, saved):
    if isinstance(pattern, int) and pattern >= 1 and list(types) == _layout(pattern, n):
      return pattern
  full = [i for i, t in enumerate(types) if t == "full_attention"]
  pattern = full[0] + 1 if full else None
  if list(types) != _layout(pattern, n):
    raise UnsupportedError(f"gemma3_text config.json layer_types={types}: tfjax supports a "
                           "global layer every k-th layer (sliding otherwise) only")
  return pattern


def _window(f: Fields) -> int:
  window = f.require("sliding_window")
  if window is None:
    raise UnsupportedError("gemma3_text config.json sliding_window=None (no sliding window) is "
                           "not supported")
  return int(window)


def _rope(f: Fields, max_len: int) -> dict:
  params = f.get("rope_parameters") or {}
  full = dict(params.get("full_attention") or {"rope_type": "default"})
  full.update(f.get("rope_scaling") or {})
  full.setdefault("rope_theta", f.get("rope_theta", 1e6))
  local = dict(params.get("sliding_attention") or {"rope_type": "default"})
  local.setdefault("rope_theta", f.get("rope_local_base_freq", 1e4))
  if local.pop("rope_type", local.pop("type", "default")) != "default" or set(local) != {
      "rope_theta"}:
    raise UnsupportedError(f"gemma3_text config.json sliding_attention rope parameters {local} "
                           "(scaled local RoPE) are not supported")
  out = RopeConfig.from_hf(Fields({"rope_parameters": full}, f.arch), max_len)
  if "rotary_fraction" in out:
    raise UnsupportedError("gemma3_text config.json partial_rotary_factor is not supported")
  local_base = float(local["rope_theta"])
  if local_base != out["rope_base"] or "rope_scaling" in out:
    out["rope_local_base"] = local_base
  return out


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del names
  d, heads = f.require("hidden_size"), f.require("num_attention_heads")
  head_dim = f.get("head_dim") or d // heads
  n = f.require("num_hidden_layers")
  act = llama.activation(kind, f)
  if act not in llama.GATED_ACTS:
    raise UnsupportedError(f"{kind} config.json hidden_activation={act!r} is not supported "
                           f"(supported: {sorted(llama.GATED_ACTS)})")
  if f.get("use_bidirectional_attention"):
    raise UnsupportedError(f"{kind} config.json use_bidirectional_attention=True is not "
                           "supported")
  max_len = int(f.get("max_position_embeddings", 131072))
  return dict(
      family="decoder", vocab_size=f.require("vocab_size"), d_model=d, num_layers=n,
      num_heads=heads, num_kv_heads=f.get("num_key_value_heads") or heads,
      head_dim=None if head_dim * heads == d else head_dim, d_ff=f.require("intermediate_size"),
      ffn=llama.GATED_ACTS[act], ffn_bias=False,
      attention_bias=bool(f.get("attention_bias", False)), norm="rmsnorm",
      **NormConfig.eps_from_hf(f, "rms_norm_eps", 1e-6), norm_placement="sandwich",
      norm_unit_offset=True, embed_scale=True, qk_norm="rmsnorm", position="rope",
      max_len=max_len, tie_embeddings=bool(f.get("tie_word_embeddings", True)),
      window=_window(f), window_pattern=_window_pattern(f, n),
      attention_scale=float(f.get("query_pre_attn_scalar", head_dim)) ** -0.5,
      attention_softcap=f.get("attn_logit_softcapping"),
      logits_softcap=f.get("final_logit_softcapping"), **_rope(f, max_len))


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  if cfg.attention.window is None:
    raise UnsupportedError(f"model_type {kind!r} needs model.window (its sliding layers' window) "
                           "and model.window_pattern (every k-th layer global); set them "
                           "(gemma-3-1b: model.window=512, model.window_pattern=6)")
  rope, attention, act = cfg.positions.rope, cfg.attention, cfg.feed_forward.activation
  local = rope.base if rope.local_base is None else rope.local_base
  return dict(
      model_type=kind, vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
      num_hidden_layers=cfg.num_layers, num_attention_heads=attention.num_heads,
      num_key_value_heads=attention.kv_heads, head_dim=cfg.dim_per_head,
      intermediate_size=cfg.feed_forward.d_ff,
      hidden_activation=llama.ACT_NAMES.get(act, act),
      **cfg.norms.eps_to_hf("rms_norm_eps"),
      max_position_embeddings=cfg.max_len, tie_word_embeddings=cfg.tie_embeddings,
      attention_bias=attention.bias, sliding_window=attention.window,
      layer_types=["sliding_attention" if cfg.attention.is_sliding_layer(i) else "full_attention"
                   for i in range(cfg.num_layers)],
      **({} if attention.window_pattern is None else
         {"sliding_window_pattern": attention.window_pattern}),
      query_pre_attn_scalar=round(attention.scale ** -2),
      attn_logit_softcapping=attention.softcap, final_logit_softcapping=cfg.logits_softcap,
      rope_parameters={"full_attention": rope.to_hf()["rope_parameters"],
                       "sliding_attention": {"rope_type": "default", "rope_theta": local}})


rules = llama.rules
droppable = llama.droppable
