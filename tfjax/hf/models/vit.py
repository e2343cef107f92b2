"""ViT (`model_type` vit) <-> tfjax's ViTClassifier (tfjax/nn/vision.py):
  ViTForImageClassification   `vit.`-prefixed encoder + `classifier` (num_classes > 0)
  ViTModel                    the unprefixed encoder, with its `pooler` (tanh Dense on token 0,
                              ViTConfig.pooler) or without (add_pooling_layer=False)
Which one a checkpoint holds is read from its tensor names (`head`); other heads
(ViTForMaskedImageModeling's mask token and pixel decoder) are refused by name. Tensor names are
the hub's (what save_pretrained writes).

The stride-P patch convolution weight [D, C, P, P] is the Dense kernel [P*P*C, D] of the
patchified image (vision.patchify flattens each patch (row, column, channel)).
"""

from __future__ import annotations

import numpy as np

from tfjax.hf import mapping
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.vision import ViTClassifier, ViTConfig

MODEL_TYPE = "vit"
CONFIG = ViTConfig
# Fields that do not change the model: encoder_stride belongs to the masked-image-modeling
# decoder (refused by tensor name). The pooler fields are checked when the checkpoint has one.
IGNORED = frozenset({"encoder_stride"})
CLASSES = {"ViTForImageClassification": "vit.", "ViTModel": ""}  # tensor-name prefix of each
ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
        "quick_gelu": "quick_gelu", "relu": "relu"}
ACT_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_new", "quick_gelu": "quick_gelu", "relu": "relu"}


def activation(f: Fields, key: str, default: str) -> str:
  act = f.get(key, default)
  if act not in ACTS:
    raise UnsupportedError(f"{f.arch} config.json {key}={act!r} is not supported "
                           f"(supported: {sorted(ACTS)})")
  return ACTS[act]


def square(f: Fields, key: str, default: int | None = None) -> int:
  """An image/patch size: an int, or [h, w] with h == w (tfjax's patches and grid are square);
  required unless a `default` is given."""
  value = f.require(key) if default is None else f.get(key, default)
  if isinstance(value, (list, tuple)):
    if len(value) != 2 or value[0] != value[1]:
      raise UnsupportedError(f"{f.arch} config.json {key}={value!r}: tfjax reads square sizes")
    value = value[0]
  return int(value)


def patch_rules(hf: str, path: tuple, cfg: ViTConfig) -> mapping.Rule:
  """Conv2d weight [D, C, P, P] <-> Dense kernel [P*P*C, D]."""
  p, c = cfg.patch_size, cfg.channels
  return mapping.Rule(
      (hf,), (path,),
      lambda a: [np.asarray(a[0]).transpose(2, 3, 1, 0).reshape(p * p * c, -1)],
      lambda a: [np.asarray(a[0]).reshape(p, p, c, -1).transpose(3, 2, 0, 1)])


def squeeze(hf: str, path: tuple, lead: int = 1) -> mapping.Rule:
  """A tensor with `lead` leading unit axes (cls_token [1, 1, D]) <-> without them."""
  return mapping.Rule((hf,), (path,), lambda a: [np.asarray(a[0]).reshape(a[0].shape[lead:])],
                      lambda a: [np.asarray(a[0]).reshape((1,) * lead + a[0].shape)])


def head(names: set) -> tuple:
  """(transformers class, tensor-name prefix) of the tensor names `names`, or an UnsupportedError
  naming the tensors of a head tfjax does not have."""
  if "vit.embeddings.mask_token" in names or any(n.startswith("decoder.") for n in names):
    raise UnsupportedError(
        "vit checkpoint of ViTForMaskedImageModeling (tensors vit.embeddings.mask_token, "
        "decoder.*): its pixel decoder is not supported; tfjax imports "
        f"{sorted(CLASSES)}")
  if any(n.startswith("vit.") for n in names):
    if "classifier.weight" not in names:
      raise UnsupportedError(
          "vit checkpoint with vit.* tensors but no classifier.weight (a ViTForImageClassification"
          " with num_labels=0?); save the encoder as ViTModel, or the classifier with labels")
    return "ViTForImageClassification", "vit."
  if "embeddings.cls_token" in names:
    return "ViTModel", ""
  raise UnsupportedError(
      f"vit checkpoint tensors {sorted(names)[:3]} are neither ViTForImageClassification's "
      "(vit.embeddings.*, classifier.*) nor ViTModel's (embeddings.*, encoder.*, layernorm.*)")


def config_from_hf(f: Fields, names: set) -> ViTConfig:
  classes = 0
  if "classifier.weight" in names:
    classes = len(f.get("id2label") or {}) or int(f.get("num_labels", 2))
  pooler = "pooler.dense.weight" in names
  if pooler:
    f.expect("pooler_act", ("tanh",), "tanh")
    size = f.get("pooler_output_size")
    if size not in (None, f.require("hidden_size")):
      raise UnsupportedError(f"vit config.json pooler_output_size={size} differs from "
                             "hidden_size; tfjax's pooler keeps the width")
  else:
    f.ignore("pooler_act", "pooler_output_size")  # no pooler: the fields are not read
  return ViTConfig(
      image_size=square(f, "image_size"), patch_size=square(f, "patch_size"),
      channels=f.get("num_channels", 3), d_model=f.require("hidden_size"),
      num_layers=f.require("num_hidden_layers"), num_heads=f.require("num_attention_heads"),
      d_ff=f.require("intermediate_size"), ffn=activation(f, "hidden_act", "gelu"),
      norm_eps=float(f.get("layer_norm_eps", 1e-12)), qkv_bias=f.get("qkv_bias", True),
      patch_bias=True, num_classes=classes, pooler=pooler).validated()


def hf_class(cfg: ViTConfig) -> str:
  return "ViTForImageClassification" if cfg.num_classes else "ViTModel"


def config_to_hf(cfg: ViTConfig) -> dict:
  if cfg.num_classes and cfg.pooler:
    raise UnsupportedError("ViTForImageClassification has no pooler: a tfjax ViT with "
                           "num_classes and pooler=True has no Hugging Face class")
  labels = {i: f"LABEL_{i}" for i in range(cfg.num_classes)}
  extra = {"pooler_act": "tanh"} if cfg.pooler else {}
  return dict(**extra, model_type=MODEL_TYPE, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
              hidden_act=ACT_NAMES[cfg.ffn], layer_norm_eps=cfg.norm_eps,
              image_size=cfg.image_size, patch_size=cfg.patch_size, num_channels=cfg.channels,
              qkv_bias=cfg.qkv_bias, id2label=labels,
              label2id={v: k for k, v in labels.items()})


def layer_rules(cfg, hf: str, tj: tuple, names: dict) -> list:
  """One pre-LN encoder layer: `names` maps q, k, v, o, fc1, fc2, ln1, ln2 to HF module names
  under `hf`; `tj` is the tfjax layer path. Biases of q, k, v follow cfg.qkv_bias."""
  h, att = cfg.num_heads, tj + ("self_attention",)
  out = []
  for short, name in (("q", "query"), ("k", "key"), ("v", "value")):
    out.append(mapping.heads_in(f"{hf}{names[short]}.weight", att + (name, "kernel"), h))
    if cfg.qkv_bias:
      out.append(mapping.heads_bias(f"{hf}{names[short]}.bias", att + (name, "bias"), h))
  out += [mapping.heads_out(f"{hf}{names['o']}.weight", att + ("out", "kernel"), h),
          mapping.copy(f"{hf}{names['o']}.bias", att + ("out", "bias"))]
  for short, path in (("fc1", "wi"), ("fc2", "wo")):
    out += [mapping.linear(f"{hf}{names[short]}.weight", tj + ("ffn", path, "kernel")),
            mapping.copy(f"{hf}{names[short]}.bias", tj + ("ffn", path, "bias"))]
  for short, path in (("ln1", "self_attention_norm"), ("ln2", "ffn_norm")):
    out += norm_rules(f"{hf}{names[short]}", tj + (path,))
  return out


def norm_rules(hf: str, path: tuple) -> list:
  return [mapping.copy(f"{hf}.weight", path + ("scale",)),
          mapping.copy(f"{hf}.bias", path + ("bias",))]


_LAYER = {"q": "attention.attention.query", "k": "attention.attention.key",
          "v": "attention.attention.value", "o": "attention.output.dense",
          "fc1": "intermediate.dense", "fc2": "output.dense", "ln1": "layernorm_before",
          "ln2": "layernorm_after"}


def rules(cfg: ViTConfig, prefix: str | None = None) -> list:
  """`prefix`: the tensor names' (CLASSES); default: that of hf_class(cfg)."""
  pre = CLASSES[hf_class(cfg)] if prefix is None else prefix
  emb, v = f"{pre}embeddings.", ("vision",)
  out = [patch_rules(f"{emb}patch_embeddings.projection.weight", v + ("patch_embed", "kernel"),
                     cfg),
         mapping.copy(f"{emb}patch_embeddings.projection.bias", v + ("patch_embed", "bias")),
         squeeze(f"{emb}cls_token", v + ("cls_token",), 2),
         squeeze(f"{emb}position_embeddings", v + ("positions",))]
  for i in range(cfg.num_layers):
    out += layer_rules(cfg, f"{pre}encoder.layer.{i}.", v + ("encoder", f"layers_{i}"), _LAYER)
  out += norm_rules(f"{pre}layernorm", v + ("encoder", "final_norm"))
  if cfg.pooler:
    out += [mapping.linear(f"{pre}pooler.dense.weight", ("pooler", "kernel")),
            mapping.copy(f"{pre}pooler.dense.bias", ("pooler", "bias"))]
  if cfg.num_classes:
    out += [mapping.linear("classifier.weight", ("classifier", "kernel")),
            mapping.copy("classifier.bias", ("classifier", "bias"))]
  return out


def droppable(cfg: ViTConfig, name: str) -> bool:
  del cfg, name
  return False


def model(cfg: ViTConfig):
  return ViTClassifier(cfg)


def example_inputs(cfg: ViTConfig) -> tuple:
  return (np.zeros((1, cfg.image_size, cfg.image_size, cfg.channels), np.float32),)
