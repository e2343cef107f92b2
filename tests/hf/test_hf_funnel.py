"""Funnel Transformer import/export (tfjax/hf/models/funnel.py, tfjax/nn/funnel.py) against
transformers' FunnelModel, FunnelBaseModel and FunnelForMaskedLM: funnel-transformer/small's
released config scaled down to a small random model (no download), float32 outputs within 1e-5 with
token types and padding, every pooling option, and the export round trip."""

from __future__ import annotations

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
from tfjax.nn.funnel import FunnelConfig  # noqa: E402

ATOL = 1e-5

# funnel-transformer/small's config.json as released on the hub (transcribed, not downloaded:
# no network here). Its legacy rel_attn_type is not read by transformers (attention_type is);
# type_vocab_size and max_position_embeddings name tables the model does not have.
RELEASED_SMALL = {
    "activation_dropout": 0.0, "architectures": ["FunnelModel"], "attention_dropout": 0.1,
    "attention_type": "relative_shift", "block_repeats": [1, 1, 1], "block_sizes": [4, 4, 4],
    "d_head": 64, "d_inner": 3072, "d_model": 768, "hidden_act": "gelu_new",
    "hidden_dropout": 0.1, "initializer_range": 0.1, "initializer_std": None,
    "layer_norm_eps": 1e-9, "max_position_embeddings": 512, "model_type": "funnel",
    "n_head": 12, "num_decoder_layers": 2, "pool_q_only": True, "pooling_type": "mean",
    "rel_attn_type": "factorized", "separate_cls": True, "truncate_seq": True,
    "type_vocab_size": 3, "vocab_size": 30522}
# The same architecture at test size: d_model 768 -> 32 with d_inner 4x it as released, 4 heads
# of 8, three blocks of two layers (of four), a 99-token vocabulary.
SCALED = dict(vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=128, block_sizes=[2, 2, 2])


def hf_config(**overrides):
  values = {k: v for k, v in RELEASED_SMALL.items() if k not in ("architectures", "model_type")}
  values.update(SCALED, **overrides)
  if "block_repeats" not in overrides:
    values["block_repeats"] = [1] * len(values["block_sizes"])
  return transformers.FunnelConfig(**values)


def hf_model(cls_name="FunnelModel", seed=0, **overrides):
  """A random model (3 labels for the classifier), every parameter moved by N(0, 0.3^2) (HF's init leaves LayerNorms at
  identity and biases at 0, which would hide their mapping)."""
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(hf_config(num_labels=3, **overrides))
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def inputs(length=13, batch=3, seed=1):
  """ids, attention_mask (row 1 padded after 9 tokens, row 2 after 5), token types as the
  Funnel tokenizer writes them: 2 for [CLS], 0 for segment A, 1 for segment B."""
  ids = np.random.default_rng(seed).integers(0, SCALED["vocab_size"], size=(batch, length))
  mask = np.ones((batch, length), np.float32)
  mask[1, 9:] = 0
  mask[2, 5:] = 0
  types = np.zeros((batch, length), np.int64)
  types[:, 0] = 2
  types[:, length // 2:] = 1
  return ids, mask, types


def hf_outputs(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types))
  return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def tfjax_outputs(cfg, params, ids, mask, types):
  out = jax.jit(modalities.model(cfg).apply)({"params": params}, ids, mask, types)
  return {k: np.asarray(v) for k, v in out.items()}


def load(tmp_path, model):
  model.save_pretrained(tmp_path / "hf")
  return modalities.load(str(tmp_path / "hf"))


@pytest.mark.parametrize("cls_name,attention_type,length", [
    ("FunnelModel", "relative_shift", 13), ("FunnelBaseModel", "relative_shift", 16),
    ("FunnelForMaskedLM", "factorized", 16),
    ("FunnelForSequenceClassification", "relative_shift", 13)])
def test_funnel_matches_transformers(tmp_path, cls_name, attention_type, length):
  hf = hf_model(cls_name, attention_type=attention_type)
  cfg, params = load(tmp_path, hf)
  base = cls_name in ("FunnelBaseModel", "FunnelForSequenceClassification")
  assert (cfg.decoder, cfg.mlm_head, cfg.num_classes, cfg.attention_type, cfg.block_sizes,
          cfg.ffn) == (not base, cls_name == "FunnelForMaskedLM",
                       3 if cls_name == "FunnelForSequenceClassification" else 0,
                       attention_type, (2, 2, 2), "gelu_tanh")
  x = inputs(length)
  got = tfjax_outputs(cfg, params, *x)
  if cfg.mlm_head:
    # The logits (|logit| ~ 10: h E^T over 32 dims of a perturbed table) within 1e-5 of their
    # scale, the hidden state they project within 1e-5.
    want_logits = hf_outputs(hf, *x)
    np.testing.assert_allclose(got["mlm_logits"], want_logits, rtol=0,
                               atol=ATOL * np.abs(want_logits).max())
    hf = hf.funnel
  if cfg.num_classes:
    np.testing.assert_allclose(got["logits"], hf_outputs(hf, *x), atol=ATOL, rtol=0)
    hf = hf.funnel
  want = hf_outputs(hf, *x)
  got = got["hidden"]
  # The base model's output is the twice-pooled sequence: 16 -> 8 -> 4, 13 -> 7 -> 4 tokens.
  assert want.shape[1] == (length if cfg.decoder else 4)
  assert np.abs(want).max() > 0.5  # not a degenerate comparison
  np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    dict(pooling_type="max", truncate_seq=False, block_sizes=[2, 1, 1], block_repeats=[1, 2, 2]),
    dict(separate_cls=False), dict(pool_q_only=False),
    dict(pool_q_only=False, attention_type="factorized")],
    ids=["max_no_truncate_repeats", "no_separate_cls", "pool_qkv", "pool_qkv_factorized"])
def test_funnel_options_match_transformers(tmp_path, overrides):
  """Each pooling option (several per model: each compile costs seconds), at blocks [1, 2, 1]
  (a pooled block's second layer reads the keys pooled after its first) and one decoder layer."""
  hf = hf_model(**{"block_sizes": [1, 2, 1], "num_decoder_layers": 1, **overrides})
  cfg, params = load(tmp_path, hf)
  x = inputs(14)
  # transformers' own float32 output is up to 1.2e-5 from its float64 one here (torch 2.13,
  # transformers 5.25: pool_qkv_factorized), more than ATOL: compare with the float64 math.
  np.testing.assert_allclose(tfjax_outputs(cfg, params, *x)["hidden"],
                             hf_outputs(hf.double(), *x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("cls_name", ["FunnelModel", "FunnelBaseModel", "FunnelForMaskedLM",
                                      "FunnelForSequenceClassification"])
def test_funnel_export_round_trip(tmp_path, cls_name):
  hf = hf_model(cls_name, seed=3)
  cfg, params = load(tmp_path, hf)
  config = modalities.export(cfg, params, str(tmp_path / "out"))
  assert config["architectures"] == [cls_name]
  back = getattr(transformers, cls_name).from_pretrained(str(tmp_path / "out")).eval()
  want, got = hf.state_dict(), back.state_dict()
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)
  x = inputs(11, seed=5)
  np.testing.assert_array_equal(hf_outputs(back, *x), hf_outputs(hf, *x))


def test_funnel_errors_name_the_problem(tmp_path):
  from tfjax.hf import registry  # pylint: disable=import-outside-toplevel
  with pytest.raises(UnsupportedError, match="run of its own task"):
    registry.architecture("funnel")
  cfg = FunnelConfig(block_sizes=(1, 1, 1)).validated()
  with pytest.raises(ValueError, match="2 tokens is too short for 3 funnel blocks.*at least 5"):
    modalities.model(cfg).init(jax.random.PRNGKey(0), np.zeros((1, 2), np.int32))
  with pytest.raises(ValueError, match="give \\[batch, length\\]"):
    modalities.model(cfg).init(jax.random.PRNGKey(0), np.zeros((8,), np.int32))
  with pytest.raises(ValueError, match="attention_mask of shape \\(1, 7\\) differs"):
    modalities.model(cfg).init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32),
                               np.ones((1, 7), np.float32))
  with pytest.raises(UnsupportedError, match="set decoder=False"):
    modalities.export(FunnelConfig(num_classes=2), {}, str(tmp_path / "x"))
  with pytest.raises(ValueError, match="mlm_head=True .* set decoder=True"):
    FunnelConfig(mlm_head=True, decoder=False).validated()
  hf_model(block_sizes=[1, 1]).save_pretrained(tmp_path / "hf")
  path = os.path.join(tmp_path, "hf", "config.json")
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  for key, value, message in (("pooling_type", "min", "pooling_type='min'"),
                              ("blocks_shared", True, "blocks_shared")):
    with open(path, "w", encoding="utf-8") as f:
      json.dump({**config, key: value}, f)
    with pytest.raises(UnsupportedError, match=message):
      modalities.load(str(tmp_path / "hf"))
