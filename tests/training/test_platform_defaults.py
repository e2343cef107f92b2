"""model.dtype / model.attention_impl 'auto' (the config defaults) resolve for the platform the
program runs on, or is compiled for: bfloat16 compute with float32 state and the Pallas kernels
on GPU/TPU, float32 and xla on CPU (tfjax.nn.config.resolve_auto)."""

import json
import os

import jax
import numpy as np
import pytest

from run_helpers import tiny_config
from tfjax.nn.config import resolve_auto
from tfjax.training.loop import experiment, train
from tfjax.training.config.defaults import base_config


@pytest.mark.parametrize("platform, dtype, impl", [
    ("cpu", "float32", "xla"), ("gpu", "bfloat16", "pallas"), ("cuda", "bfloat16", "pallas"),
    ("tpu", "bfloat16", "pallas")])
def test_auto_resolves_per_platform(platform, dtype, impl):
  model = dict(base_config().model)
  assert model["dtype"] == "auto" and model["attention_impl"] == "auto"  # the defaults
  resolved = resolve_auto(model, platform)
  assert (resolved["dtype"], resolved["attention_impl"]) == (dtype, impl)
  assert resolve_auto(model, platform, num_devices=1) == resolved  # a platform: one device


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("context", [1, 4])
def test_several_devices_and_a_context_axis_keep_the_kernels(platform, context):
  """The kernels run per device inside shard_map on any mesh (tfjax/nn/sharded_attention.py)."""
  resolved = resolve_auto(dict(base_config().model), platform, num_devices=8, context=context)
  assert (resolved["dtype"], resolved["attention_impl"]) == ("bfloat16", "pallas")


def test_a_context_axis_on_cpu_takes_chunked():
  """On CPU xla would form each device's (T / C) x T weights; chunked is the O(T) kernel."""
  assert resolve_auto(dict(base_config().model), "cpu", context=4)["attention_impl"] == "chunked"
  t5 = dict(base_config().model, position="t5_bias")  # a dense bias stays xla's
  assert resolve_auto(t5, "cpu", context=4)["attention_impl"] == "xla"


def test_explicit_values_and_xla_only_features_are_kept():
  model = dict(base_config().model, dtype="float16", attention_impl="chunked")
  assert resolve_auto(model, "gpu")["dtype"] == "float16"
  assert resolve_auto(model, "gpu")["attention_impl"] == "chunked"
  # a dense T5 bias (xla only): tfjax.nn.ops' auto rule chooses per call on GPU (today xla)
  t5 = dict(base_config().model, position="t5_bias")
  assert resolve_auto(t5, "gpu")["attention_impl"] == "auto"
  assert resolve_auto(t5, "cpu")["attention_impl"] == "xla"
  # soft-capping is computed by every Pallas kernel: the platform's kernel
  softcap = dict(base_config().model, attention_softcap=30.0)
  assert resolve_auto(softcap, "gpu", num_devices=1)["attention_impl"] == "pallas"
  assert resolve_auto(softcap, "tpu", num_devices=1)["attention_impl"] == "pallas"
  # attention dropout is applied inside the kernels: the platform's kernel
  dropout = dict(base_config().model, attention_dropout=0.2)
  assert resolve_auto(dropout, "gpu", num_devices=1)["attention_impl"] == "pallas"


def test_gpu_target_computes_in_bfloat16_with_float32_params_and_optimizer_state():
  """What tfjax.aot does for an absent GPU: prepare(platform=...) resolves for it."""
  exp = experiment.prepare(tiny_config(), platform="cuda")
  assert exp.config.model.dtype == "bfloat16" and exp.config.model.attention_impl == "pallas"
  assert exp.model_config.dtype == "bfloat16"
  from run_helpers import one_device_placement  # pylint: disable=import-outside-toplevel
  exp_cpu_attention = experiment.Experiment(
      exp.config, exp.model_config.replace(attention_impl="xla"), exp.dataset, exp.optimizer,
      exp.schedule)  # xla attention: this CPU host traces the bf16 math without a GPU kernel
  layout = experiment.state_layout(exp_cpu_attention, one_device_placement(exp.config))
  dtypes = {np.dtype(x.dtype) for x in jax.tree.leaves((layout.abstract.params,
                                                        layout.abstract.opt_state))
            if np.issubdtype(x.dtype, np.floating)}  # (Adam's step count is int32)
  assert dtypes == {np.dtype("float32")}
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  model = build_model(exp_cpu_attention.model_config)
  tokens = np.zeros((2, 8), np.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))
  jaxpr = str(jax.make_jaxpr(lambda p: model.apply(p, tokens))(params))
  assert "bf16[2,8,32]" in jaxpr  # the [batch, length, d_model] activations are bfloat16


def test_config_json_and_the_start_line_record_the_resolved_values(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  with caplog.at_level("INFO", logger="tfjax"):
    train.train_and_evaluate(tiny_config(num_steps=1), workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    model = json.load(f)["model"]
  assert (model["dtype"], model["attention_impl"]) == ("float32", "xla")  # CPU: unchanged
  assert "compute float32, params and optimizer state float32; attention: xla" in caplog.text


def test_the_start_line_says_why_attention_is_not_the_kernel():
  config = tiny_config()
  config.model.position = "t5_bias"
  exp = experiment.prepare(config, platform="gpu")
  assert exp.config.model.attention_impl == "auto"
  line = experiment.execution_summary(exp, platform="gpu")
  assert "compute bfloat16" in line
  assert "attention: xla (position='t5_bias' (a dense bias))" in line


def test_attention_dropout_stays_on_the_kernels():
  # The Pallas kernels apply dropout themselves (tfjax/nn/dropout_hash.py): no xla detour.
  config = tiny_config()
  config.model.attention_dropout = 0.1
  exp = experiment.prepare(config, platform="gpu", num_devices=1)
  assert exp.config.model.attention_impl == "pallas"


def test_cpu_variant_of_the_shakespeare_recipe_stays_float32_everywhere():
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel,unused-import
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "shakespeare_char.py")
  spec = importlib.util.spec_from_file_location("shakespeare_char", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cpu = resolve_auto(dict(module.get_config("cpu").model), "gpu")
  assert (cpu["dtype"], cpu["attention_impl"]) == ("float32", "xla")
  gpu = resolve_auto(dict(module.get_config().model), "gpu")
  assert gpu["dtype"] == "bfloat16"
