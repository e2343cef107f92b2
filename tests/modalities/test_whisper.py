"""Whisper (tfjax/nn/audio.py, tfjax/hf/models/whisper.py): logits and greedy decoding against
transformers' WhisperForConditionalGeneration from a small random config (no download), the
sinusoids against transformers', the dropped K bias, export round trip, and training."""

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
from tfjax.nn import audio  # noqa: E402
from tfjax.nn.positions import sinusoidal_table  # noqa: E402

ATOL = 1e-5
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMES, MELS, V = 32, 8, 40


def hf_whisper(scale_embedding=False, seed=0):
  config = transformers.WhisperConfig(
      vocab_size=V, num_mel_bins=MELS, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=48,
      decoder_ffn_dim=40, max_source_positions=FRAMES // 2, max_target_positions=20,
      decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, bos_token_id=1,
      begin_suppress_tokens=None, suppress_tokens=None, scale_embedding=scale_embedding)
  torch.manual_seed(seed)
  model = transformers.WhisperForConditionalGeneration(config)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():  # move every trained weight (HF's LayerNorms start at identity)
    for name, p in model.named_parameters():
      if name != "model.encoder.embed_positions.weight":
        p.add_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def features(batch=2, seed=1):
  return np.random.default_rng(seed).normal(size=(batch, FRAMES, MELS)).astype(np.float32)


def hf_features(x):
  return torch.from_numpy(x.transpose(0, 2, 1))  # HF reads [B, mels, frames]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  path = tmp_path_factory.mktemp("whisper") / "hf"
  hf = hf_whisper()
  hf.save_pretrained(path)
  cfg, params = modalities.load(str(path))
  return hf, cfg, params, path


def test_whisper_logits_match_transformers(imported):
  hf, cfg, params, _ = imported
  assert (cfg.decoder_heads, cfg.encoder_heads, cfg.num_frames) == (2, 4, FRAMES)
  x = features()
  ids = np.random.default_rng(2).integers(3, V, size=(2, 7))
  with torch.no_grad():
    want = hf(input_features=hf_features(x), decoder_input_ids=torch.from_numpy(ids)).logits
  got = jax.jit(audio.Whisper(cfg).apply)({"params": params}, x, ids.astype(np.int32))
  assert np.abs(want.numpy()).max() > 1.0
  np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=ATOL, rtol=0)


def test_greedy_decoding_equals_transformers_generate(imported):
  hf, cfg, params, _ = imported
  x = features(batch=3, seed=5)
  with torch.no_grad():
    want = hf.generate(input_features=hf_features(x), max_new_tokens=8, do_sample=False,
                       num_beams=1).numpy()
  got = np.asarray(audio.greedy_decode(cfg, params, x, 8))
  assert got[:, 0].tolist() == [cfg.decoder_start_id] * 3  # HF's generate leaves it out
  assert len(set(map(tuple, want))) > 1  # rows differ: the encoder output is read
  np.testing.assert_array_equal(got[:, 1:want.shape[1] + 1], want)


def test_sinusoids_are_whispers_not_vaswanis():
  # pylint: disable-next=import-outside-toplevel
  from transformers.models.whisper.modeling_whisper import sinusoids
  np.testing.assert_allclose(audio.whisper_sinusoids(50, 32), sinusoids(50, 32).numpy(),
                             atol=5e-6)  # float32 sin/cos of angles up to 49
  halves = np.asarray(sinusoidal_table(np.arange(50)[None], 32, "halves"))[0]
  assert np.abs(halves - audio.whisper_sinusoids(50, 32)).max() > 0.1


def test_key_bias_does_not_change_the_output(imported):
  """Why export may drop tfjax's K biases (Whisper has none): softmax cancels q.b_K."""
  _, cfg, params, _ = imported
  x, ids = features(), np.array([[1, 5, 9, 4], [1, 3, 3, 7]], np.int32)
  apply = jax.jit(audio.Whisper(cfg).apply)  # one program for both calls
  base = np.asarray(apply({"params": params}, x, ids))
  moved = jax.tree_util.tree_map_with_path(
      lambda path, a: a + 3.0 if [k.key for k in path[-2:]] == ["key", "bias"] else a, params)
  assert not np.array_equal(moved["encoder"]["layers_0"]["self_attention"]["key"]["bias"],
                            params["encoder"]["layers_0"]["self_attention"]["key"]["bias"])
  np.testing.assert_allclose(np.asarray(apply({"params": moved}, x, ids)), base, atol=ATOL)


def test_whisper_export_round_trip(imported, tmp_path):
  hf, cfg, params, _ = imported
  modalities.export(cfg, params, str(tmp_path / "out"))
  back = transformers.WhisperForConditionalGeneration.from_pretrained(str(tmp_path / "out"))
  want, got = hf.state_dict(), back.eval().state_dict()
  assert set(want) == set(got)
  for name in want:
    np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), atol=1e-6, err_msg=name)


def test_older_whisper_config_fields_read(imported, tmp_path):
  """Fields older Whisper configs carry (num_hidden_layers as a copy of encoder_layers, the
  generation defaults) read without changing the model."""
  _, _, params, path = imported
  with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  config.update(num_hidden_layers=2, max_length=20, forced_decoder_ids=[[1, 3], [2, 4]],
                init_std=0.02, begin_suppress_tokens=[5], suppress_tokens=[6])
  os.makedirs(tmp_path / "old")
  for name in os.listdir(path):
    if name.endswith(".safetensors"):
      os.symlink(os.path.join(path, name), tmp_path / "old" / name)
  with open(tmp_path / "old" / "config.json", "w", encoding="utf-8") as f:
    json.dump(config, f)
  _, got = modalities.load(str(tmp_path / "old"))
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, got, params))


def test_whisper_import_errors(imported, tmp_path):
  hf_whisper(scale_embedding=True).save_pretrained(tmp_path / "scaled")
  with pytest.raises(UnsupportedError, match="scale_embedding=True"):
    modalities.load(str(tmp_path / "scaled"))
  _, cfg, params, _ = imported
  with pytest.raises(ValueError, match=r"reads \[batch, 32, 8\]"):
    audio.Whisper(cfg).apply({"params": params}, np.zeros((1, 30, MELS), np.float32),
                             np.ones((1, 2), np.int32))
  hf = hf_whisper()
  with torch.no_grad():
    hf.model.encoder.embed_positions.weight.mul_(2.0)
  hf.save_pretrained(tmp_path / "bad")
  with pytest.raises(UnsupportedError, match="not Whisper's sinusoid table"):
    modalities.load(str(tmp_path / "bad"))


@pytest.mark.slow  # tens of seconds; tests/training/test_task_plugins.py is the quick sibling
def test_whisper_trains_on_config(tmp_path):
  from run_helpers import read_metrics  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "whisper_synthetic", os.path.join(REPO, "configs", "whisper_synthetic.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  result = train.train_and_evaluate(module.get_config("test"), str(tmp_path / "run"))
  evals = [r["eval/loss"] for r in read_metrics(tmp_path / "run") if "eval/loss" in r]
  # 8 symbols + EOT: a model ignoring the audio stays near ln(9) = 2.2 per token and, guessing
  # from position alone, right on about a quarter of the tokens.
  assert evals[-1] < 0.75 * evals[0]
  assert result["eval/accuracy"] > 0.4
