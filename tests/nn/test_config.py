"""tfjax/nn/config.py: the model-wide fields' validation (each section's is tested next to its
owner: test_attention, test_ffn, test_norms, test_positions), the flat model.* keys routed to their
owners, and every key the README and the configs use."""

import glob
import os
import re

import pytest

from conftest import tiny_config
from tfjax.nn.config import (FAMILIES, FLAT_KEYS, SECTIONS, ModelConfig, default_model_config,
                             resolve_auto)
from tfjax.nn.models import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("overrides,patterns", [
    (dict(family="decoder_only"), ["model.family='decoder_only'", *FAMILIES]),
    (dict(remat="some"), ["model.remat='some'", "none", "full", "dots"]),
    (dict(attention_impl="flash"), ["model.attention_impl='flash'", "xla", "pallas"]),
    (dict(dropout=1.0), ["model.dropout=1.0", "[0, 1)"]),
    (dict(num_layers=0), ["model.num_layers=0", "positive"]),
    (dict(family="encoder_decoder", num_decoder_layers=0),
     ["model.num_decoder_layers=0", "positive"]),
])
def test_config_validation_names_key_value_and_choices(overrides, patterns):
  with pytest.raises(ValueError) as info:
    tiny_config(**overrides)
  for pattern in patterns:
    assert pattern in str(info.value), (pattern, str(info.value))
  # The same checks guard every other way of building a model.
  with pytest.raises(ValueError):
    build_model({**dict(vocab_size=31, d_model=16, num_heads=2, d_ff=32), **overrides})
  with pytest.raises(ValueError):
    tiny_config().replace(**overrides)


def test_unknown_config_key_is_named_with_the_valid_keys():
  with pytest.raises(ValueError, match=r"unknown model config key\(s\) \['d_modle'\]; valid keys "
                                       r"are: .*'d_model'"):
    ModelConfig.from_config({"d_modle": 16})
  cfg = default_model_config(d_model=16, num_heads=2)
  cfg.nmu_layers = 3
  with pytest.raises(ValueError, match="nmu_layers"):
    build_model(cfg)
  with pytest.raises(ValueError, match="nmu_layers"):
    default_model_config(nmu_layers=3)


def test_config_dict_round_trip_builds_the_same_config():
  cfg = default_model_config(d_model=16, num_heads=2, num_kv_heads=1, window=3)
  built = ModelConfig.from_config(cfg)
  assert built.attention.kv_heads == 1 and built.attention.window == 3
  assert built.dim_per_head == 8
  assert ModelConfig.from_config(default_model_config()) == ModelConfig()


def test_flat_keys_route_to_their_owners_and_back():
  """Every flat key is owned by exactly one place, reads back from there (`cfg.<key>` is an error
  naming the one spelling), and a config survives the trip through its flat keys."""
  cfg = tiny_config(position="rope", rope_scaling="llama3", rope_scaling_factor=8.0,
                    rope_original_max_len=8, rope_low_freq_factor=1.0, num_kv_heads=1, window=4,
                    norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", d_ff=24, attention_softcap=5.0)
  assert (cfg.attention.num_kv_heads, cfg.attention.window, cfg.attention.softcap) == (1, 4, 5.0)
  assert (cfg.norms.kind, cfg.norms.eps) == ("rmsnorm", 1e-6)
  assert (cfg.feed_forward.activation, cfg.feed_forward.d_ff) == ("swiglu", 24)
  assert (cfg.positions.kind, cfg.positions.rope.scaling, cfg.positions.rope.scaling_factor) == (
      "rope", "llama3", 8.0)
  flat = cfg.to_flat()
  assert sorted(flat) == sorted(FLAT_KEYS) and len(set(FLAT_KEYS)) == len(FLAT_KEYS)
  assert (flat["num_kv_heads"], flat["window"], flat["rope_scaling_factor"]) == (1, 4, 8.0)
  with pytest.raises(AttributeError, match=r"no attribute 'num_heads': read cfg\.attention\."
                                           r"num_heads \(model\.num_heads is the flat"):
    cfg.num_heads  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError, match=r"read cfg\.positions\.rope\.base"):
    cfg.rope_base  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError, match=r"^'ModelConfig' object has no attribute 'nmu_heads'$"):
    cfg.nmu_heads  # pylint: disable=pointless-statement
  assert ModelConfig.from_flat(flat) == cfg
  owned = [key for section in SECTIONS.values() for key in section.flat_keys()]
  assert len(owned) == len(set(owned)) and not set(owned) & set(ModelConfig.__dataclass_fields__)
  assert cfg.replace(window=2).attention.window == 2 and cfg.replace(decode=True).decode


def _keys_used_in(paths, pattern):
  keys = set()
  for path in paths:
    with open(path, encoding="utf-8") as f:
      keys |= set(re.findall(pattern, f.read()))
  return keys


def test_every_model_key_in_the_readme_and_configs_parses():
  """`model.<key>` in README.md, configs/*.py and configs/ablations/*.py, and the backticked keys
  of the README's architecture switches, are all config.model keys; each set from the command
  line's typed placeholders builds."""
  configs = [p for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) + glob.glob(
      os.path.join(ROOT, "configs", "ablations", "*.py")) if not _own_model_config(p)]
  readme = os.path.join(ROOT, "README.md")
  used = _keys_used_in(configs + [readme], r"(?<![\w/])model\.([a-z][a-z0-9_]*)\b(?!\()")  # not .update(
  with open(readme, encoding="utf-8") as f:
    text = f.read()
  switches = text[text.index("Architecture switches"):]
  switches = switches[:switches.index("\n\n")]
  used |= set(re.findall(r"`([a-z][a-z0-9_]*)[`=]", switches))
  assert len(used) > 30
  assert sorted(used - set(FLAT_KEYS)) == []
  cfg = default_model_config(d_model=16, num_heads=2)
  cfg.position = "alibi"  # --config.model.position=alibi
  cfg.window = 8          # a typed placeholder (default None)
  cfg.rope_local_base = None
  built = ModelConfig.from_config(cfg)
  assert (built.positions.kind, built.attention.window) == ("alibi", 8)


def _own_model_config(path) -> str | None:
  """The task of a config whose model is its task's own (ViT, CLIP, Whisper, Funnel: their
  config.model keys are the task's, tfjax/training/tasks/), else None."""
  with open(path, encoding="utf-8") as f:
    found = re.search(r'base_config\("(vit|clip|whisper|funnel)', f.read())
  return found and found.group(1)


def test_own_model_configs_set_only_their_tasks_model_keys():
  """configs/{vit,clip,whisper,funnel}_*.py: every `model.<key>` they set is a key of their
  task's config.model (base_config(task)), nested sections (CLIP's towers) included."""
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
  paths = [p for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) if _own_model_config(p)]
  assert len(paths) >= 4
  for path in paths:
    task = _own_model_config(path)
    task = "funnel_classification" if task == "funnel" and "classify" in path else task
    model = base_config(task).model.to_dict()
    keys = set(model) | {f"{k}.{sub}" for k, v in model.items() if isinstance(v, dict)
                         for sub in v}
    used = _keys_used_in([path], r"(?<![\w/])model\.([a-z][a-z0-9_.]*[a-z0-9_])\b(?!\()")
    assert sorted(k for k in used if k not in keys) == [], path


@pytest.mark.parametrize("name", ["default", "gpt2_small", "gpt2_owt", "bert_base", "llama2_7b",
                                  "llama2_70b", "shakespeare_char", "transformer_base"])
def test_every_config_files_model_keys_reach_their_owners(name):
  """Each configs/*.py model section builds, and every key it sets reads back unchanged."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(f"cfg_{name}",
                                                os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  model = dict(module.get_config().model)
  model["vocab_size"] = model["vocab_size"] or 1  # 0 = from the data, known only at run time
  built = ModelConfig.from_config(model)
  # dtype / attention_impl 'auto' read back as this platform's values (test_platform_defaults)
  assert {k: built.to_flat()[k] for k in model} == resolve_auto(model)


def test_optional_keys_are_typed_command_line_placeholders():
  """Each key whose default is None is a placeholder of its field's Optional[X] type (as the
  three-times-declared OPTIONAL tables gave them), so `--config.model.<key>=value` parses."""
  from ml_collections import config_dict  # pylint: disable=import-outside-toplevel
  expected = {"num_decoder_layers": int, "logits_softcap": float, "share_positions": bool,
              "num_kv_heads": int, "head_dim": int, "attention_out_bias": bool, "window": int,
              "window_pattern": int, "attention_scale": float, "attention_softcap": float,
              "position_init_std": float, "rope_original_max_len": int,
              "rope_attention_factor": float, "rope_local_base": float}
  defaults = ModelConfig().to_flat()
  assert sorted(k for k, v in defaults.items() if v is None) == sorted(expected)
  cfg = default_model_config()
  for key, kind in expected.items():
    field = cfg._fields[key]  # pylint: disable=protected-access
    assert isinstance(field, config_dict.FieldReference) and field.get_type() is kind, key
  flags = config_dict.ConfigDict({"model": default_model_config(d_model=16, num_heads=2)})
  with pytest.raises(TypeError):
    flags.model.window = "wide"  # a typed placeholder rejects a value of the wrong type
  flags.model.window = 8
  assert ModelConfig.from_config(flags.model).attention.window == 8
