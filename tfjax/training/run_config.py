"""A run's configuration: its config.json read back into the ConfigDict it was written from, and
the validated ModelConfig of a config (vocab_size=0 resolved from the data). Below both the
experiment setup and `config.init_from`, which read a source run's architecture with it."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ml_collections import config_dict

from tfjax.data import datasets
from tfjax.nn.config import ModelConfig, resolve_auto
from tfjax.runtime import files
from tfjax.training.defaults import base_config

CONFIG_FILE = "config.json"


def config_from_json(values: Mapping[str, Any]) -> config_dict.ConfigDict:
  """The ConfigDict a run's config.json was written from (JSON lists become tuples again)."""
  config = base_config()

  def update(node, new, prefix):
    for key, value in new.items():
      if key not in node:
        raise ValueError(f"config.json has key {prefix}{key}, unknown to this version of tfjax")
      if isinstance(node[key], config_dict.ConfigDict):
        update(node[key], value, f"{prefix}{key}.")
      elif isinstance(value, list):
        node[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
      else:
        node[key] = value

  update(config, values, "")
  return config


def load_config(workdir: str) -> config_dict.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ValueError(f"{workdir} has no config.json: not a tfjax training run directory")
  return config_from_json(files.read_json(path))


def model_config(config, dataset=None, *, workdir: str | None = None,
                 platform: str | None = None) -> ModelConfig:
  """The validated ModelConfig of an experiment config, vocab_size=0 resolved from the data
  (datasets.resolve_vocab_size: from `dataset` if built, else without building it), dtype /
  attention_impl 'auto' for `platform` (tfjax.nn.config.resolve_auto; None: this process's)."""
  model = dict(config.model)
  model["vocab_size"] = datasets.resolve_vocab_size(config, dataset, workdir=workdir)
  return ModelConfig.from_config(model, platform)


def resolve_platform_defaults(config, platform: str | None = None,
                              num_devices: int | None = None):
  """`config` with model.dtype / model.attention_impl 'auto' made concrete for `platform` and
  `num_devices` (tfjax.nn.config.resolve_auto; a copy when any was 'auto'), so config.json
  records what the run used."""
  resolved = resolve_auto(dict(config.model), platform, num_devices)
  changed = {k: v for k, v in resolved.items() if config.model[k] != v}
  if not changed:
    return config
  config = config.copy_and_resolve_references()
  config.model.update(changed)
  return config
