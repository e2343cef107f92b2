"""tfjax/nn/choices.py: every "choose one of" error names the key, the value and the choices."""

import subprocess
import sys

import pytest

from tfjax.nn.choices import one_of
from tfjax.data import datasets, synthetic, tokenizers


def _data_config(**overrides):
  config = datasets.default_data_config()
  config.update(overrides)
  return config


def test_one_of_returns_the_value_or_names_key_value_and_choices():
  assert one_of("model.norm", "rmsnorm", ("layernorm", "rmsnorm")) == "rmsnorm"
  with pytest.raises(ValueError, match=r"^model\.norm='batch' is invalid; choose one of "
                                       r"\('layernorm', 'rmsnorm'\)$"):
    one_of("model.norm", "batch", ("layernorm", "rmsnorm"))


@pytest.mark.parametrize("call,pattern", [
    (lambda: synthetic.vocab_size("copyy", 8), r"synthetic task='copyy' is invalid; choose one of"),
    (lambda: tokenizers.make_tokenizer("wordpiece", "some text", None),
     r"tokenizer='wordpiece' is invalid"),
    (lambda: datasets.make_dataset(_data_config(name="wikitext"), "lm"),
     r"data\.name='wikitext' is invalid; choose one of"),
])
def test_data_side_choices_use_the_same_check(call, pattern):
  with pytest.raises(ValueError, match=pattern):
    call()


def test_the_check_imports_no_jax():
  code = "import sys; import tfjax.nn.choices, tfjax.data.synthetic; print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"
