"""GPT-2: pre-LayerNorm, learned positions, tanh-GELU FFN, fused QKV in Conv1D layout.

Hugging Face's Conv1D stores weights [in, out] (no transpose) and `c_attn` holds W_Q, W_K, W_V
side by side ([D, 3D]); the output head is tied to the token embedding.
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.nn.norms import NormConfig

# config.json fields transformers' GPT-2 model does not read (beyond mapping.IGNORED): the
# double-heads model's summary (multiple-choice) head settings and the legacy context length.
IGNORED = {"gpt2": frozenset(("reorder_and_upcast_attn", "n_ctx", "summary_activation",
                              "summary_proj_to_labels", "summary_type", "summary_use_proj"))}

ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
        "relu": "relu"}
ACT_NAMES = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  del kind, names
  d = f.require("n_embd")
  act = f.get("activation_function", "gelu_new")
  if act not in ACTS:
    raise UnsupportedError(f"gpt2 config.json activation_function={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  f.expect("scale_attn_weights", (True,), True)
  f.expect("scale_attn_by_inverse_layer_idx", (False,), False)
  f.expect("add_cross_attention", (False,), False)
  if not f.get("tie_word_embeddings", True):
    raise UnsupportedError("gpt2 config.json tie_word_embeddings=False is not supported")
  return dict(family="decoder", vocab_size=f.require("vocab_size"), d_model=d,
              num_layers=f.require("n_layer"), num_heads=f.require("n_head"),
              d_ff=f.get("n_inner") or 4 * d, ffn=ACTS[act], ffn_bias=True,
              attention_bias=True, norm="layernorm",
              **NormConfig.eps_from_hf(f, "layer_norm_epsilon", 1e-5),
              norm_placement="pre", position="learned", max_len=f.get("n_positions", 1024),
              tie_embeddings=True, scaled_residual_init=True)


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  del kind
  return dict(model_type="gpt2", vocab_size=cfg.vocab_size, n_embd=cfg.d_model,
              n_layer=cfg.num_layers, n_head=cfg.attention.num_heads, n_inner=cfg.feed_forward.d_ff,
              activation_function=ACT_NAMES[cfg.feed_forward.activation],
              **cfg.norms.eps_to_hf("layer_norm_epsilon"),
              n_positions=cfg.max_len, tie_word_embeddings=True)


def rules(cfg: ModelConfig) -> list:
  h = cfg.attention.num_heads
  out = [mapping.copy("transformer.wte.weight", ("embed", "tokens", "embedding")),
         mapping.copy("transformer.wpe.weight", ("embed", "positions", "embedding")),
         mapping.copy("transformer.ln_f.weight", ("decoder", "final_norm", "scale")),
         mapping.copy("transformer.ln_f.bias", ("decoder", "final_norm", "bias"))]
  for i in range(cfg.num_layers):
    hf, tj = f"transformer.h.{i}.", ("decoder", f"layers_{i}")
    att = tj + ("self_attention",)
    qkv = [att + (p,) for p in ("query", "key", "value")]
    out += [
        mapping.fused(f"{hf}attn.c_attn.weight", [p + ("kernel",) for p in qkv], h, weight=True),
        mapping.fused(f"{hf}attn.c_attn.bias", [p + ("bias",) for p in qkv], h, weight=False),
        mapping.heads_out(f"{hf}attn.c_proj.weight", att + ("out", "kernel"), h,
                          transposed=False),
        mapping.copy(f"{hf}attn.c_proj.bias", att + ("out", "bias")),
        mapping.conv1d(f"{hf}mlp.c_fc.weight", tj + ("ffn", "wi", "kernel")),
        mapping.copy(f"{hf}mlp.c_fc.bias", tj + ("ffn", "wi", "bias")),
        mapping.conv1d(f"{hf}mlp.c_proj.weight", tj + ("ffn", "wo", "kernel")),
        mapping.copy(f"{hf}mlp.c_proj.bias", tj + ("ffn", "wo", "bias")),
    ]
    for name, path in (("ln_1", "self_attention_norm"), ("ln_2", "ffn_norm")):
      out += [mapping.copy(f"{hf}{name}.weight", tj + (path, "scale")),
              mapping.copy(f"{hf}{name}.bias", tj + (path, "bias"))]
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """The tied head, and the causal-mask buffers old checkpoints saved (attn.bias, masked_bias)."""
  del cfg
  return name == "lm_head.weight" or name.endswith(("attn.masked_bias", "attn.bias"))
