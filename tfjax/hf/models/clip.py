"""CLIP (`model_type` clip): CLIPModel <-> tfjax's CLIP (tfjax/nn/clip.py). Tensor names are
the hub's. config.json nests `text_config` and `vision_config`; each is read as strictly as a
top-level config (every field mapped, checked or ignored). The vision tower alone
(CLIPVisionModel, `model_type` clip_vision_model) is tfjax/hf/models/clip_vision.py, from the same
vision helpers below.
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.models import vit
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.clip import CLIP, CLIPConfig, TextConfig
from tfjax.nn.vision import ViTConfig

MODEL_TYPE = "clip"
HF_CLASS = "CLIPModel"
CLASSES = {HF_CLASS: ""}
CONFIG = CLIPConfig
# logit_scale_init_value only initializes logit_scale, which the checkpoint stores.
IGNORED = frozenset({"logit_scale_init_value"})
# A tower's projection_dim is read by CLIP{Text,Vision}ModelWithProjection only; CLIPModel's
# projections use the top-level one. Older configs dump every PretrainedConfig field into the
# towers: TensorFlow / bf16 flags, and tie_word_embeddings and cross_attention_hidden_size,
# which a tower without an output layer or cross-attention never reads (is_decoder and
# add_cross_attention are checked to be False instead).
SUB_IGNORED = frozenset({"projection_dim", "tf_legacy_loss", "use_bfloat16",
                         "tie_word_embeddings", "cross_attention_hidden_size"})

# CLIPTextConfig's eos_token_id default (transformers >= 4.31, PR #24773): a text_config without
# the field pools at the first <|endoftext|>. Configs written before dump eos_token_id (2) itself.
EOS = 49407

_LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
          "o": "self_attn.out_proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2", "ln1": "layer_norm1",
          "ln2": "layer_norm2"}


def _sub(f: Fields, key: str) -> Fields:
  """A tower's fields: `key`, updated by the legacy `<key>_dict` where present (transformers
  gives the _dict copy precedence too)."""
  values, legacy = f.get(key) or {}, f.get(f"{key}_dict") or {}
  if not isinstance(values, dict) or not isinstance(legacy, dict):
    raise UnsupportedError(f"clip config.json {key} must be an object, got {values!r}")
  sub = Fields({**values, **legacy}, f"clip {key}", SUB_IGNORED)
  sub.expect("is_decoder", (False,), False)
  sub.expect("add_cross_attention", (False,), False)
  return sub


def head(names: set) -> tuple:
  """(transformers class, prefix): CLIPModel, or an UnsupportedError naming the head."""
  if not any(n.startswith("text_model.") for n in names):
    kind = ("CLIPForImageClassification (vision tower + classifier)"
            if any(n.startswith("classifier.") for n in names)
            else "a checkpoint without the text tower")
    raise UnsupportedError(f"clip checkpoint is {kind}: not supported; tfjax imports CLIPModel "
                           "(model_type clip) and CLIPVisionModel (model_type clip_vision_model)")
  return HF_CLASS, ""


def hf_class(cfg: CLIPConfig) -> str:
  del cfg
  return HF_CLASS


def vision_from_fields(v: Fields) -> ViTConfig:
  """A CLIP vision tower's config (vision_config, or CLIPVisionModel's top level)."""
  return ViTConfig(
      image_size=vit.square(v, "image_size", 224), patch_size=vit.square(v, "patch_size", 32),
      channels=v.get("num_channels", 3), d_model=v.get("hidden_size", 768),
      num_layers=v.get("num_hidden_layers", 12), num_heads=v.get("num_attention_heads", 12),
      d_ff=v.get("intermediate_size", 3072), ffn=vit.activation(v, "hidden_act", "quick_gelu"),
      norm_eps=float(v.get("layer_norm_eps", 1e-5)), qkv_bias=True, patch_bias=False,
      pre_norm=True, num_classes=0)


def vision_to_hf(v: ViTConfig) -> dict:
  return dict(model_type="clip_vision_model", image_size=v.image_size,
              patch_size=v.patch_size, num_channels=v.channels, hidden_size=v.d_model,
              num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads,
              intermediate_size=v.d_ff, hidden_act=vit.ACT_NAMES[v.ffn],
              layer_norm_eps=v.norm_eps)


def vision_rules(vc: ViTConfig, pre: str) -> list:
  """The vision tower's tensors under `pre` (`vision_model.` in CLIPModel) <-> ('vision', ...)."""
  emb, v = f"{pre}embeddings.", ("vision",)
  out = [vit.patch_rules(f"{emb}patch_embedding.weight", v + ("patch_embed", "kernel"), vc),
         mapping.copy(f"{emb}class_embedding", v + ("cls_token",)),
         mapping.copy(f"{emb}position_embedding.weight", v + ("positions",))]
  out += vit.norm_rules(f"{pre}pre_layrnorm", v + ("pre_norm",))
  for i in range(vc.num_layers):
    out += vit.layer_rules(vc, f"{pre}encoder.layers.{i}.", v + ("encoder", f"layers_{i}"),
                           _LAYER)
  return out + vit.norm_rules(f"{pre}post_layernorm", v + ("encoder", "final_norm"))


def config_from_hf(f: Fields, names: set) -> CLIPConfig:
  del names
  t, v = _sub(f, "text_config"), _sub(f, "vision_config")
  text = TextConfig(
      vocab_size=t.get("vocab_size", 49408), max_len=t.get("max_position_embeddings", 77),
      d_model=t.get("hidden_size", 512), num_layers=t.get("num_hidden_layers", 12),
      num_heads=t.get("num_attention_heads", 8), d_ff=t.get("intermediate_size", 2048),
      ffn=vit.activation(t, "hidden_act", "quick_gelu"),
      norm_eps=float(t.get("layer_norm_eps", 1e-5)), eos_id=t.get("eos_token_id", EOS))
  vision = vision_from_fields(v)
  t.finish()
  v.finish()
  return CLIPConfig(text=text, vision=vision, projection_dim=f.get("projection_dim", 512),
                    logit_scale_init=float(f.get("logit_scale_init_value", 2.6592))).validated()


def config_to_hf(cfg: CLIPConfig) -> dict:
  t, v = cfg.text, cfg.vision
  text = dict(model_type="clip_text_model", vocab_size=t.vocab_size,
              max_position_embeddings=t.max_len, hidden_size=t.d_model,
              num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads,
              intermediate_size=t.d_ff, hidden_act=vit.ACT_NAMES[t.ffn],
              layer_norm_eps=t.norm_eps, eos_token_id=t.eos_id)
  vision = vision_to_hf(v)
  return dict(model_type=MODEL_TYPE, text_config=text, vision_config=vision,
              projection_dim=cfg.projection_dim, logit_scale_init_value=cfg.logit_scale_init)


def rules(cfg: CLIPConfig, prefix: str | None = None) -> list:
  del prefix  # CLIPModel's names have none
  tc = cfg.text
  out = vision_rules(cfg.vision, "vision_model.")
  t = ("text",)
  out += [mapping.copy("text_model.embeddings.token_embedding.weight",
                       t + ("tokens", "embedding")),
          mapping.copy("text_model.embeddings.position_embedding.weight", t + ("positions",))]
  text_heads = ViTConfig(num_heads=tc.num_heads, qkv_bias=True)  # what layer_rules reads
  for i in range(tc.num_layers):
    out += vit.layer_rules(text_heads, f"text_model.encoder.layers.{i}.",
                           t + ("encoder", f"layers_{i}"), _LAYER)
  out += vit.norm_rules("text_model.final_layer_norm", t + ("encoder", "final_norm"))
  out += [mapping.linear("visual_projection.weight", ("visual_projection", "kernel")),
          mapping.linear("text_projection.weight", ("text_projection", "kernel")),
          mapping.copy("logit_scale", ("logit_scale",))]
  return out


def droppable(cfg: CLIPConfig, name: str) -> bool:
  """Position-id buffers (older checkpoints store them; the model derives them)."""
  del cfg
  return name.endswith("embeddings.position_ids")


def model(cfg: CLIPConfig):
  return CLIP(cfg)


def example_inputs(cfg: CLIPConfig) -> tuple:
  v = cfg.vision
  return (np.zeros((1, v.image_size, v.image_size, v.channels), np.float32),
          np.full((1, 2), cfg.text.eos_id, np.int32))
