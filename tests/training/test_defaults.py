"""tfjax/training/config/defaults.py: the default run and the base config every config starts
from."""

import importlib.util
import os

import pytest

from tfjax.nn.config import ModelConfig
from tfjax.training.config import defaults

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def load_config_module(name):
  spec = importlib.util.spec_from_file_location(name.replace("/", "_"),
                                                os.path.join(REPO, "configs", name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("name,takes", [
    ("default.py", "no argument"), ("gpt2_small.py", "no argument"),
    ("bert_base.py", "no argument"), ("llama2_7b.py", "no argument"),
    ("transformer_base.py", "no argument"), ("shakespeare_char.py", "no argument or 'cpu'"),
    *[(f"ablations/{n}.py", "scale 'smoke', 'medium' or 'full'")
      for n in ("ffn", "heads", "norm", "position", "position_lengthgen")]])
def test_every_config_file_refuses_an_argument_it_does_not_take(name, takes):
  # `--config=FILE:whatever` must not train the file's default variant silently.
  module = load_config_module(name)
  with pytest.raises(ValueError, match=f"{os.path.basename(name)} takes {takes}, got 'whatever'"):
    module.get_config("whatever")
  assert module.get_config() is not None
