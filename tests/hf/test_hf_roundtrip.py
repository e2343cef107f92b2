"""Import -> export -> import round trips (tfjax/hf/) of every architecture whose import sets a
sliding window, a window pattern, a local RoPE base or a soft-cap: gemma2, gemma3_text, mistral and
phi3 (the others refuse those fields or have none). Each starts from a released config.json field
set (tests/hf/test_hf_released.py) with a random transformers model at tiny sizes, and checks:
the exported directory loads in transformers as the same class with the same layer layout and
bit-identical logits, and importing it again gives the first import's model config and params
exactly. The layer layouts are also checked against transformers' own Gemma3TextConfig."""

# pylint: disable=protected-access  (the shared helpers of tests/hf/test_hf.py)
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import test_hf as parity  # noqa: E402  (the shared parity helpers)
import test_hf_released as released  # noqa: E402  (the released config.json field sets)
from tfjax.hf import __main__ as cli  # noqa: E402
from tfjax.hf import importer, mapping, registry  # noqa: E402

T = transformers
S, F = "sliding_attention", "full_attention"

# case -> (released field set, field changes, transformers' layer_types of the model, or None
# where the class has no layer_types). Gemma 3's layouts are written out by hand: global iff
# (i + 1) % pattern == 0.
CASES = {
    # 2 layers, pattern 6: no global layer, the pattern only in sliding_window_pattern (issue 47)
    "gemma3-2-layers": ("gemma-3-1b-pt", dict(num_hidden_layers=2), [S, S]),
    # 7 layers: the pattern repeats (one global layer, then sliding again)
    "gemma3-7-layers": ("gemma-3-1b-pt", {}, [S, S, S, S, S, F, S]),
    # layer_types (which transformers runs instead of the released pattern 6), a scaled global
    # RoPE with its own base, both soft-caps
    "gemma3-layer-types-softcap": ("gemma-3-1b-pt", dict(
        num_hidden_layers=3, layer_types=[S, F, S], attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0, rope_theta=5000.0, rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0}), [S, F, S]),
    "gemma2": ("gemma-2-2b", {}, [S, F, S]),
    "mistral": ("Mistral-7B-v0.1", dict(sliding_window=5), None),
    "phi3": ("Phi-3-mini-4k-instruct", {}, None),
}


def _round_trip(tmp_path, case):
  name, changes, layer_types = CASES[case]
  model, hf_dir, _ = released.released_dir(tmp_path, name, **changes)
  if layer_types is not None:
    assert list(model.config.layer_types) == layer_types
  run = parity._import(hf_dir, str(tmp_path / "run"))
  out_dir = str(tmp_path / "exported")
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out_dir}"]) == 0

  reloaded = T.AutoModelForCausalLM.from_pretrained(out_dir).eval()
  assert type(reloaded) is type(model)
  if layer_types is not None:
    assert list(reloaded.config.layer_types) == layer_types
  original = model.state_dict()
  for key, value in reloaded.state_dict().items():
    assert torch.equal(value, original[key]), key
  ids = parity._ids()
  np.testing.assert_array_equal(parity._hf_logits(reloaded, ids), parity._hf_logits(model, ids))

  again, params = importer.load(out_dir)
  assert again == run.model_config
  flat, first = jax.tree.leaves_with_path(params), dict(jax.tree.leaves_with_path(run.params))
  assert len(flat) == len(first)
  for path, value in flat:
    np.testing.assert_array_equal(np.asarray(value), np.asarray(first[path]), str(path))
  return run, model, out_dir


def test_gemma3_exports_its_window_pattern(tmp_path):
  """Issue 47: Gemma 3 at 2 layers (pattern 6, so no global layer) exports as it imports; the
  exported config.json carries the pattern and the layer types transformers reads."""
  run, model, out_dir = _round_trip(tmp_path, "gemma3-2-layers")
  ids = parity._ids()  # the imported run computes transformers' logits too
  parity._assert_close(parity._tfjax_logits(run, ids), parity._hf_logits(model, ids))
  assert run.model_config.attention.window_pattern == 6 and run.model_config.attention.window == 4
  config = json.load(open(os.path.join(out_dir, "config.json"), encoding="utf-8"))
  assert config["sliding_window_pattern"] == 6 and config["layer_types"] == [S, S]


@pytest.mark.parametrize("case", [c for c in CASES if c != "gemma3-2-layers"])
def test_round_trip(tmp_path, case):
  _round_trip(tmp_path, case)


def test_round_trip_cases_cover_every_windowed_or_capped_import():
  """Every registered architecture whose import of its released field set (or of a case here)
  sets a window, a window pattern, a local RoPE base or a soft-cap has a round-trip case."""
  keys = ("window", "window_pattern", "rope_local_base", "attention_softcap", "logits_softcap")
  covered = {released.RELEASED[name][0]["model_type"] for name, _, _ in CASES.values()}
  for name, (fields, sizes, _) in released.RELEASED.items():
    arch = registry.architecture(fields["model_type"])
    reader = mapping.Fields({**fields, **sizes}, arch.model_type, arch.ignored)
    names = {"cls.predictions.transform.dense.weight", "lm_head.dense.weight"}  # MLM heads
    values = arch.config_from_hf(arch.model_type, reader, names)
    if any(values.get(k) is not None for k in keys):
      assert arch.model_type in covered, name


# Fields of Gemma 3's layer layout -> transformers' Gemma3TextConfig gives the reference layout.
LAYOUTS = [dict(sliding_window_pattern=2), dict(),  # the default pattern, 6
           dict(_sliding_window_pattern=2),  # only transformers' saved copy: inert, pattern 6
           dict(sliding_window_pattern=2, layer_types=[S, S, F, S, S, F, S]),  # layer_types wins
           dict(layer_types=[S] * 7), dict(layer_types=[F] * 7),
           dict(_sliding_window_pattern=6, layer_types=[S] * 7)]


@pytest.mark.parametrize("fields", LAYOUTS)
def test_gemma3_layout_is_the_one_transformers_runs(fields):
  values = dict(released.RELEASED["gemma-3-1b-pt"][0], num_hidden_layers=7)
  del values["sliding_window_pattern"]
  values.update(fields)
  arch = registry.architecture("gemma3_text")
  reader = mapping.Fields(values, arch.model_type, arch.ignored)
  pattern = arch.config_from_hf(arch.model_type, reader, set())["window_pattern"]
  reader.finish()
  expected = T.Gemma3TextConfig(**{k: v for k, v in values.items()
                                   if k not in ("architectures", "model_type")}).layer_types
  assert [F if pattern and (i + 1) % pattern == 0 else S for i in range(7)] == list(expected)


def test_gemma3_without_window_is_refused_by_name():
  """A model without a sliding window has no gemma3_text spelling: export names model.window
  (not a TypeError), and a config.json with sliding_window=None is refused by that name."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  arch = registry.architecture("gemma3_text")
  values = dict(released.RELEASED["gemma-3-1b-pt"][0], num_hidden_layers=2)
  cfg = arch.config_from_hf(arch.model_type, mapping.Fields(values, arch.model_type), set())
  windowless = ModelConfig.from_flat(
      {**cfg, "window": None, "window_pattern": None, "rope_local_base": None}).validated()
  with pytest.raises(mapping.UnsupportedError, match="model.window"):
    exporter.hf_config(arch, windowless, set())
  with pytest.raises(mapping.UnsupportedError, match="sliding_window=None"):
    arch.config_from_hf(arch.model_type, mapping.Fields(
        {**values, "sliding_window": None}, arch.model_type), set())
