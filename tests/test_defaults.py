"""tfjax/training/defaults.py: the default run and the base config every config starts from."""

import importlib.util
import os

from tfjax.nn.config import ModelConfig
from tfjax.training import defaults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_configs_default_is_the_packaged_default_run():
  spec = importlib.util.spec_from_file_location("default_cfg", os.path.join(REPO, "configs",
                                                                            "default.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.get_config().to_json() == defaults.get_config().to_json()


def test_base_config_has_every_section_and_a_valid_model():
  config = defaults.base_config()
  assert {"model", "data", "optimizer", "train", "mesh", "task", "seed"} <= set(config)
  ModelConfig.from_config(config.model)  # every model field, with valid defaults
  run = defaults.get_config()
  assert run.task == "lm" and run.data.name == "reverse"
