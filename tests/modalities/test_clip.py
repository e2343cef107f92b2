"""CLIP (tfjax/nn/clip.py, tfjax/hf/models/clip.py): embeddings and logits against transformers'
CLIPModel from a small random config (no download), the contrastive loss against NumPy, EOS
pooling in both of HF's modes, export round trip, and training on synthetic pairs."""

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
from tfjax.nn.clip import CLIPConfig, contrastive_loss, eos_positions  # noqa: E402

ATOL = 1e-5
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V, L, B = 50, 10, 4


def hf_clip(eos=7, act="quick_gelu", seed=0):
  text = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=12, eos_token_id=eos,
              bos_token_id=1, pad_token_id=0, hidden_act=act)
  vision = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                image_size=16, patch_size=4, hidden_act=act)
  torch.manual_seed(seed)
  model = transformers.CLIPModel(transformers.CLIPConfig(
      text_config=text, vision_config=vision, projection_dim=16))
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():  # move every weight (LayerNorms start at identity in HF's init)
    for name, p in model.named_parameters():
      if name != "logit_scale":
        p.add_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def inputs(eos=7, seed=1):
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(B, 16, 16, 3)).astype(np.float32)
  ids = rng.integers(8, V, size=(B, L)).astype(np.int64)
  for b, end in enumerate((3, 9, 5, 6)):  # EOS at different places; padding (0) after it
    ids[b, end], ids[b, end + 1:] = eos, 0
  return images, ids


def hf_outputs(model, images, ids, **kw):
  with torch.no_grad():
    return model(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)),
                 input_ids=torch.from_numpy(ids), return_loss=True, **kw)


def np_contrastive_loss(logits):
  """CLIP's pseudocode (Radford et al. 2021, fig. 3): (CE over rows + CE over columns) / 2."""
  logits = np.asarray(logits, np.float64)

  def ce(rows):
    rows = rows - rows.max(axis=1, keepdims=True)
    logp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    return -np.mean(np.diag(logp))
  return (ce(logits) + ce(logits.T)) / 2


@pytest.mark.parametrize("eos", [7, 2])  # 2: HF's legacy pooling at the largest id
def test_clip_matches_transformers(tmp_path, eos):
  hf = hf_clip(eos)
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = modalities.load(str(tmp_path / "hf"))
  assert cfg.text.eos_id == eos and cfg.text.ffn == "quick_gelu"
  images, ids = inputs(eos)
  if eos == 2:
    ids[:, 0] = V - 1  # the legacy rule pools at the largest id, wherever EOS is
  want = hf_outputs(hf, images, ids)
  got = jax.jit(modalities.model(cfg).apply)({"params": params}, images, ids.astype(np.int32))
  for key in ("image_embeds", "text_embeds", "logits_per_image", "logits_per_text"):
    np.testing.assert_allclose(np.asarray(got[key]), getattr(want, key).numpy(), atol=ATOL,
                               rtol=0, err_msg=key)
  assert np.ptp(want.logits_per_image.numpy()) > 1.0  # the pairs are told apart
  loss = float(contrastive_loss(got["logits_per_image"]))
  np.testing.assert_allclose(loss, np_contrastive_loss(want.logits_per_image.numpy()), atol=1e-5)
  np.testing.assert_allclose(loss, float(want.loss), atol=1e-5)


def test_padding_after_eos_does_not_change_text_embeds(tmp_path):
  """The causal text tower: HF with its padding mask equals tfjax without one."""
  hf = hf_clip()
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = modalities.load(str(tmp_path / "hf"))
  images, ids = inputs()
  mask = np.cumsum(ids == 7, axis=1) - (ids == 7) == 0  # up to and including EOS
  want = hf_outputs(hf, images, ids, attention_mask=torch.from_numpy(mask.astype(np.int64)))
  got = jax.jit(modalities.model(cfg).apply)({"params": params}, images, ids.astype(np.int32))
  np.testing.assert_allclose(np.asarray(got["text_embeds"]), want.text_embeds.numpy(),
                             atol=ATOL, rtol=0)


def test_quick_gelu_is_x_sigmoid_1702x():
  """CLIP's activation, added to tfjax/nn/ffn.py's kinds, against NumPy."""
  from tfjax.nn.ffn import ACTIVATIONS  # pylint: disable=import-outside-toplevel
  x = np.linspace(-6, 6, 101).astype(np.float32)
  np.testing.assert_allclose(np.asarray(ACTIVATIONS["quick_gelu"](x)),
                             x / (1 + np.exp(-1.702 * x.astype(np.float64))), atol=1e-6)


def test_eos_positions_follow_hf_rules():
  ids = np.array([[1, 5, 9, 7, 0], [1, 7, 3, 7, 0]])
  np.testing.assert_array_equal(np.asarray(eos_positions(ids, 7)), [3, 1])  # first EOS
  np.testing.assert_array_equal(np.asarray(eos_positions(ids, 2)), [2, 1])  # largest id


def test_clip_export_round_trip(tmp_path):
  hf = hf_clip(act="gelu")
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = modalities.load(str(tmp_path / "hf"))
  modalities.export(cfg, params, str(tmp_path / "out"))
  back = transformers.CLIPModel.from_pretrained(str(tmp_path / "out")).eval()
  want, got = hf.state_dict(), back.state_dict()
  assert set(want) == set(got)
  for name in want:
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)
  images, ids = inputs()
  np.testing.assert_array_equal(hf_outputs(back, images, ids).logits_per_image.numpy(),
                                hf_outputs(hf, images, ids).logits_per_image.numpy())


def test_older_config_layouts_read(tmp_path):
  """Configs written by older transformers: every PretrainedConfig field dumped into the towers
  and the `*_config_dict` copies beside them (which take precedence, as in transformers)."""
  hf = hf_clip()
  hf.save_pretrained(tmp_path / "hf")
  path = os.path.join(tmp_path, "hf", "config.json")
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  for key in ("text_config", "vision_config"):
    config[key].update(tf_legacy_loss=False, use_bfloat16=False, is_decoder=False,
                       add_cross_attention=False, tie_word_embeddings=True,
                       cross_attention_hidden_size=None, architectures=None)
    config[f"{key}_dict"] = dict(config[key])
  config["text_config"]["layer_norm_eps"] = 0.5  # overridden by text_config_dict
  with open(path, "w", encoding="utf-8") as f:
    json.dump(config, f)
  cfg, params = modalities.load(str(tmp_path / "hf"))
  images, ids = inputs()
  want = hf_outputs(hf, images, ids)
  got = jax.jit(modalities.model(cfg).apply)({"params": params}, images, ids.astype(np.int32))
  np.testing.assert_allclose(np.asarray(got["logits_per_image"]),
                             want.logits_per_image.numpy(), atol=ATOL, rtol=0)
  config["text_config_dict"]["is_decoder"] = True
  with open(path, "w", encoding="utf-8") as f:
    json.dump(config, f)
  with pytest.raises(UnsupportedError, match="is_decoder=True"):
    modalities.load(str(tmp_path / "hf"))


def test_clip_config_errors():
  with pytest.raises(ValueError, match="eos_id=80 is not a token id"):
    CLIPConfig.from_dict({"text": {"eos_id": 80}})
  with pytest.raises(ValueError, match="pre_norm=True"):
    CLIPConfig.from_dict({"vision": {"pre_norm": False}})


@pytest.mark.slow  # tens of seconds; tests/training/test_task_plugins.py is the quick sibling
def test_clip_trains_on_config(tmp_path):
  from run_helpers import read_metrics  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "clip_synthetic", os.path.join(REPO, "configs", "clip_synthetic.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  result = train.train_and_evaluate(module.get_config("test"), str(tmp_path / "run"))
  evals = [r["eval/loss"] for r in read_metrics(tmp_path / "run") if "eval/loss" in r]
  assert evals[-1] < 0.75 * evals[0]
  # 8 classes in a batch of 32: retrieval picks a caption of the right class above chance 1/8.
  assert result["eval/class_accuracy"] > 0.5
