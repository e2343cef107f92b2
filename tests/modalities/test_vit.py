"""ViT (tfjax/nn/vision.py, tfjax/hf/models/vit.py): logits against transformers'
ViTForImageClassification from a small random config (no download), export round trip, the patch
embedding against a NumPy convolution, and the error paths."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tfjax.hf import modalities  # noqa: E402
from tfjax.hf.mapping import UnsupportedError  # noqa: E402
from tfjax.nn.vision import ViTConfig, patchify  # noqa: E402

ATOL = 1e-5
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_module(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def perturbed(model, seed=0, scale=0.3):
  """Every parameter moved by N(0, scale^2) noise: norm gains off 1, biases off 0, so each
  tensor's mapping shows in the outputs (HF's init leaves LayerNorms at identity)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn(p.shape, generator=gen) * scale)
  return model.eval()


def hf_vit(act="gelu", classes=5):
  cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=48, image_size=16, patch_size=4,
                               num_channels=3, num_labels=classes, hidden_act=act)
  return perturbed(transformers.ViTForImageClassification(cfg))


def images(batch=3, size=16, seed=1):
  return np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype(np.float32)


def hf_logits(model, x_BxHxWxC):
  with torch.no_grad():
    return model(pixel_values=torch.from_numpy(x_BxHxWxC.transpose(0, 3, 1, 2))).logits.numpy()


def tfjax_logits(cfg, params, x_BxHxWxC):
  return np.asarray(jax.jit(modalities.model(cfg).apply)({"params": params}, x_BxHxWxC)["logits"])


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_vit_logits_match_transformers(tmp_path, act):
  hf = hf_vit(act)
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = modalities.load(str(tmp_path / "hf"))
  assert (cfg.num_classes, cfg.num_patches, cfg.ffn) == (
      5, 16, {"gelu": "gelu", "gelu_new": "gelu_tanh"}[act])
  x = images()
  want, got = hf_logits(hf, x), tfjax_logits(cfg, params, x)
  assert np.abs(want).max() > 0.1  # not a degenerate comparison
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_vit_export_round_trip(tmp_path):
  hf = hf_vit()
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = modalities.load(str(tmp_path / "hf"))
  config = modalities.export(cfg, params, str(tmp_path / "out"))
  assert config["architectures"] == ["ViTForImageClassification"]
  back = transformers.ViTForImageClassification.from_pretrained(str(tmp_path / "out")).eval()
  x = images(seed=4)
  np.testing.assert_array_equal(hf_logits(back, x), hf_logits(hf, x))
  want, got = hf.state_dict(), back.state_dict()
  for name in want:
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)
  with pytest.raises(ValueError, match="already holds weights"):
    modalities.export(cfg, params, str(tmp_path / "out"))


def test_patch_embedding_is_the_strided_convolution():
  """patchify + a Dense kernel [P*P*C, D] equals NumPy's stride-P convolution with the weight
  [D, C, P, P] the HF rule maps it from."""
  rng = np.random.default_rng(0)
  p, c, d = 4, 3, 5
  x = rng.normal(size=(2, 8, 12, c))
  w_DxCxPxP = rng.normal(size=(d, c, p, p))
  conv = np.zeros((2, 2, 3, d))
  for i in range(2):
    for j in range(3):
      window = x[:, i * p:(i + 1) * p, j * p:(j + 1) * p, :]  # [B, P, P, C]
      conv[:, i, j] = np.einsum("bhwc,dchw->bd", window, w_DxCxPxP)
  from tfjax.hf.models.vit import patch_rules  # pylint: disable=import-outside-toplevel
  rule = patch_rules("w", ("k",), ViTConfig(patch_size=p, channels=c))
  kernel = rule.to_tfjax([w_DxCxPxP])[0]
  got = np.asarray(patchify(x, p)) @ kernel
  np.testing.assert_allclose(got, conv.reshape(2, 6, d), atol=1e-10)
  np.testing.assert_array_equal(rule.to_hf([kernel])[0], w_DxCxPxP)


@pytest.mark.slow  # tens of seconds; tests/training/test_task_plugins.py is the quick sibling
def test_vit_trains_on_config(tmp_path):
  from run_helpers import read_metrics  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  result = train.train_and_evaluate(config_module("vit_synthetic").get_config("test"),
                                    str(tmp_path / "run"))
  evals = [r["eval/loss"] for r in read_metrics(tmp_path / "run") if "eval/loss" in r]
  # 4 classes: chance is 0.25 and ln 4 = 1.386.
  assert evals[0] > 1.2
  assert evals[-1] < 0.75 * evals[0]
  assert result["eval/accuracy"] > 0.6


def test_vit_errors_name_the_problem(tmp_path):
  from tfjax.hf import registry  # pylint: disable=import-outside-toplevel
  with pytest.raises(UnsupportedError, match="run of its own task"):
    registry.architecture("vit")  # the text families' path (vit: tfjax/hf/task_runs.py)
  with pytest.raises(ValueError, match="not a multiple of patch_size"):
    ViTConfig(image_size=10, patch_size=4).validated()
  cfg = ViTConfig(image_size=16, patch_size=4, d_model=16, num_heads=2, d_ff=8, num_layers=1)
  module = modalities.model(cfg)
  with pytest.raises(ValueError, match="channels last"):
    module.init(jax.random.PRNGKey(0), np.zeros((1, 3, 16, 16), np.float32))
  hf_vit().save_pretrained(tmp_path / "hf")
  path = os.path.join(tmp_path, "hf", "config.json")
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  config["interpolate_things"] = True
  with open(path, "w", encoding="utf-8") as f:
    json.dump(config, f)
  with pytest.raises(UnsupportedError, match="interpolate_things"):
    modalities.load(str(tmp_path / "hf"))
