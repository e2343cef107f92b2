"""Hugging Face import and export of the models outside ModelConfig (ViT, CLIP, Whisper, Funnel).

These models are not `ModelConfig` families (tfjax/nn/vision.py, clip.py, audio.py hold their
own small configs around the shared encoder/decoder blocks), so they do not become training-run
directories as the text families do (tfjax/hf/importer.py); they load into memory and export
from memory:

  cfg, params = modalities.load(hf_dir)          # config.json + safetensors -> (config, params)
  logits = modalities.model(cfg).apply({"params": params}, ...)
  modalities.export(cfg, params, out_dir)        # -> a directory transformers loads

`read(hf_dir)` also says which transformers class the tensors are (ViTModel or
ViTForImageClassification, ...) and keeps the stored tensors the model derives (Whisper's
sinusoids), so that `export(..., hf_class=, prefix=, kept=)` writes the same tensors bit for bit;
`python -m tfjax.hf import|export` makes run directories of them (tfjax/hf/task_runs.py).

Each family module (tfjax/hf/models/vit.py, clip.py, clip_vision.py, whisper.py, funnel.py) gives
MODEL_TYPE, CONFIG, CLASSES ({transformers class: tensor-name prefix}), head(names) -> (class,
prefix) (an UnsupportedError naming a head tfjax lacks), hf_class(cfg) (export's default class),
IGNORED, config_from_hf(fields, names), config_to_hf(cfg), rules(cfg, prefix), droppable(cfg,
name), model(cfg) and example_inputs(cfg), the same vocabulary as the text families
(tfjax/hf/mapping.py). The
checks are the text importer's: every parameter produced exactly once with its shape, every
checkpoint tensor read (or derived by the model, `droppable`), every config.json field mapped,
checked or ignored, and an export's config translated back to the same config.
"""

from __future__ import annotations

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from tfjax.hf import reader, shards
from tfjax.hf.models import clip, clip_vision, funnel, vit, whisper
from tfjax.hf.mapping import Fields, UnsupportedError

FAMILIES = {m.MODEL_TYPE: m for m in (vit, clip, clip_vision, whisper, funnel)}


def family(model_type):
  if model_type not in FAMILIES:
    raise UnsupportedError(f"model_type {model_type!r} is not one of the modality front-ends "
                           f"{sorted(FAMILIES)} (text models: python -m tfjax.hf import)")
  return FAMILIES[model_type]


def family_of(cfg):
  """The family module whose config class `cfg` is (a ViTConfig: vit's)."""
  for module in FAMILIES.values():
    if isinstance(cfg, module.CONFIG):
      return module
  raise TypeError(f"{type(cfg).__name__} is not a modality config ({sorted(FAMILIES)})")


def model(cfg) -> nn.Module:
  return family_of(cfg).model(cfg)


def param_shapes(cfg) -> dict:
  """{path: shape} of the model's parameters (abstract init: no arrays)."""
  module = family_of(cfg)
  shapes = jax.eval_shape(lambda: module.model(cfg).init(jax.random.PRNGKey(0),
                                                         *module.example_inputs(cfg)))
  return {k: tuple(v.shape) for k, v in
          traverse_util.flatten_dict(nn.meta.unbox(shapes["params"])).items()}


def _check_rules(rule_list, shapes: dict) -> None:
  produced = [p for r in rule_list for p in r.tfjax]
  twice = sorted({p for p in produced if produced.count(p) > 1})
  missing, unknown = sorted(set(shapes) - set(produced)), sorted(set(produced) - set(shapes))
  if twice or missing or unknown:
    raise AssertionError(f"mapping bug: parameters produced twice {twice[:3]}, never "
                         f"{missing[:3]}, unknown {unknown[:3]}")


@dataclasses.dataclass
class Loaded:
  """A Hugging Face directory read into memory: the model's config and float32 params, its
  model_type, the transformers class its tensors are (hf_class) and their name prefix, the
  stored tensors the model derives instead of reading (`kept`, written back by export), and the
  source's config.json."""
  cfg: object
  params: dict
  model_type: str
  hf_class: str
  prefix: str
  kept: dict
  source: dict


def read(hf_dir: str) -> Loaded:
  """Reads a Hugging Face ViT / CLIP / CLIPVisionModel / Whisper / Funnel directory."""
  with reader.HFCheckpoint(hf_dir) as ckpt:
    module = family(ckpt.config.get("model_type"))
    hf_class, prefix = module.head(ckpt.names)
    fields = Fields(ckpt.config, module.MODEL_TYPE, module.IGNORED)
    cfg = module.config_from_hf(fields, ckpt.names)
    fields.finish()
    rule_list = module.rules(cfg, prefix)
    shapes = param_shapes(cfg)
    _check_rules(rule_list, shapes)
    wanted = {n for r in rule_list for n in r.hf}
    absent = sorted(wanted - ckpt.names)
    if absent:
      raise UnsupportedError(f"{hf_dir} ({hf_class}) lacks tensor(s) {absent[:5]} that this "
                             "model needs")
    unused = sorted(n for n in ckpt.names - wanted if not module.droppable(cfg, n))
    if unused:
      raise UnsupportedError(
          f"{hf_dir} ({hf_class}) has tensor(s) {unused[:5]} that the tfjax model has no place "
          "for; importing without them would give a different model")
    if hasattr(module, "check_derived"):
      module.check_derived(cfg, ckpt)
    derived = module.derived_tensors(cfg, prefix) if hasattr(module, "derived_tensors") else {}
    kept = {n: np.array(ckpt.get(n)) for n in derived if n in ckpt.names}
    params = {}
    for rule in rule_list:
      for path, value in zip(rule.tfjax, rule.to_tfjax([ckpt.get(n) for n in rule.hf])):
        if tuple(value.shape) != shapes[path]:
          raise UnsupportedError(f"tensor(s) {list(rule.hf)} give {'/'.join(path)} shape "
                                 f"{tuple(value.shape)}, but the config implies {shapes[path]}")
        params[path] = np.array(value, dtype=np.float32)
    source = dict(ckpt.config)
  return Loaded(cfg, traverse_util.unflatten_dict(params), module.MODEL_TYPE, hf_class, prefix,
                kept, source)


def load(hf_dir: str):
  """(config, params) of a Hugging Face ViT / CLIP / Whisper / Funnel directory, float32 NumPy
  params (`read` for the class, prefix and kept tensors too)."""
  loaded = read(hf_dir)
  return loaded.cfg, loaded.params


# Config fields that change how a model runs or is initialized, not what it computes.
EXECUTION = ("init_std", "dtype", "attention_impl")


def _architecture(cfg, prefix="") -> dict:
  """{dotted field: value} of a (nested) config dataclass, execution fields left out."""
  out = {}
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    if dataclasses.is_dataclass(value):
      out.update(_architecture(value, f"{prefix}{field.name}."))
    elif field.name not in EXECUTION:
      out[prefix + field.name] = value
  return out


def export(cfg, params, hf_dir: str, max_shard_size=shards.DEFAULT_MAX_SHARD_SIZE, *,
           model_type=None, hf_class=None, prefix=None, kept=None, extra=None) -> dict:
  """Writes `params` of `cfg` as a Hugging Face directory `hf_dir` (new or empty of weights);
  returns its config.json dict. `model_type` (default: the family of cfg's class; a ViTConfig
  can also be clip_vision_model), `hf_class` and `prefix` (default: the class cfg implies and its
  prefix) choose the transformers class written; `kept` ({name: array}) replaces derived tensors
  by stored ones (Loaded.kept); `extra` adds config.json fields (token ids, label names)."""
  present = shards.existing_weights(hf_dir)
  if present:
    raise ValueError(f"{hf_dir} already holds weights {present[:3]}; export into a new "
                     "directory")
  module = family(model_type) if model_type else family_of(cfg)
  if not isinstance(cfg, module.CONFIG):
    raise TypeError(f"{type(cfg).__name__} is not a {module.MODEL_TYPE} config")
  hf_class = hf_class or module.hf_class(cfg)
  if hf_class not in module.CLASSES:
    raise UnsupportedError(f"{module.MODEL_TYPE} exports as {sorted(module.CLASSES)}, not "
                           f"{hf_class!r}")
  prefix = module.CLASSES[hf_class] if prefix is None else prefix
  config = module.config_to_hf(cfg)
  rule_list = module.rules(cfg, prefix)
  fields = Fields(config, module.MODEL_TYPE, module.IGNORED)
  back = module.config_from_hf(fields, {n for r in rule_list for n in r.hf})
  fields.finish()
  want, got = _architecture(cfg), _architecture(back)
  differ = {k: v for k, v in want.items() if got.get(k) != v}
  if differ:
    raise UnsupportedError(f"model_type {module.MODEL_TYPE!r} cannot express {differ}")
  flat = traverse_util.flatten_dict(nn.meta.unbox(params))
  _check_rules(rule_list, {k: tuple(np.shape(v)) for k, v in flat.items()})
  tensors = {}
  for rule in rule_list:
    for name, value in zip(rule.hf, rule.to_hf([np.asarray(flat[p], np.float32)
                                                for p in rule.tfjax])):
      tensors[name] = np.array(value, dtype=np.float32, order="C")  # keeps 0-d scalars 0-d
  if hasattr(module, "derived_tensors"):
    derived = module.derived_tensors(cfg, prefix)
    for name, value in (kept or {}).items():
      if name not in derived or np.shape(value) != np.shape(derived[name]):
        raise ValueError(f"kept tensor {name} {np.shape(value)} is not one this model derives")
    tensors.update({**derived, **(kept or {})})
  config.update(extra or {})
  config.update(architectures=[hf_class], dtype="float32")
  os.makedirs(hf_dir, exist_ok=True)
  shards.write(tensors, hf_dir, max_shard_size)
  with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  return config
