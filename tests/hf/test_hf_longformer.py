"""Longformer import/export (tfjax/hf/models/longformer.py, tfjax/nn/kinds/longformer.py) against
transformers: allenai/longformer-base-4096's released config.json fields at tiny sizes, random
weights (no download); the imported model gives transformers' outputs within 1e-5 in float32
with and without global tokens, with right padding and lengths that transformers pads to a
multiple of the window; export -> from_pretrained is bit-identical."""

# pylint: disable=protected-access  (the shared helpers of tests/hf/test_hf.py)
from __future__ import annotations

import copy
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import test_hf as parity  # noqa: E402  (the shared parity helpers)
from conftest import fast_jit  # noqa: E402
from tfjax.hf import __main__ as cli  # noqa: E402
from tfjax.hf import exporter, importer, mapping, registry  # noqa: E402
from tfjax.nn.models import build_model  # noqa: E402

T = transformers
V = parity.V
# allenai/longformer-base-4096's config.json as transformers reads it from the hub.
RELEASED = {
    "architectures": ["LongformerForMaskedLM"], "attention_mode": "longformer",
    "attention_probs_dropout_prob": 0.1, "attention_window": [512] * 12, "bos_token_id": 0,
    "eos_token_id": 2, "gradient_checkpointing": False, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 768, "ignore_attention_mask": False,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 4098, "model_type": "longformer", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "sep_token_id": 2, "type_vocab_size": 1,
    "vocab_size": 50265}
# Tiny sizes: a window of 4 (2 keys each side) over sequences of 10-12 tokens.
SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, attention_window=[4, 4], max_position_embeddings=34)
PAD = RELEASED["pad_token_id"]


def _released_dir(tmp_path, cls=T.LongformerForMaskedLM, **changes):
  fields = {**RELEASED, **SIZES, **changes}
  config = T.AutoConfig.for_model(**copy.deepcopy(fields))
  torch.manual_seed(0)
  model = parity._randomize(cls(config))
  path = str(tmp_path / "hf_longformer")
  model.save_pretrained(path)
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(fields, f)  # the released fields, not save_pretrained's rewrite
  return model, path


def _inputs(length, padded):
  ids = parity._ids(seed=1, length=length)
  ids[ids == PAD] = 0  # transformers numbers positions over non-pad tokens only
  mask = np.ones_like(ids)
  if padded:
    mask[0, length - 3:] = 0
    ids[0, length - 3:] = PAD
  return ids, mask


def _hf_out(model, ids, mask, g, key="logits"):
  glob = np.zeros_like(ids)
  glob[:, :g] = 1
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                global_attention_mask=torch.from_numpy(glob) if g else None)
  return out[key].numpy()


def _ours(cfg, params, ids, mask, g, keys=("mlm_logits",)):
  model = build_model(cfg.replace(longformer_global_tokens=g))
  run = fast_jit(lambda p, a, s: [model.apply({"params": p}, a, segment_ids=s)[k] for k in keys])
  outs = run(params, ids.astype(np.int32), mask.astype(np.int32))
  return [np.asarray(o) for o in outs] if len(keys) > 1 else np.asarray(outs[0])


@pytest.mark.parametrize("length,padded", [(12, False), (10, True)])
def test_masked_lm_parity_with_and_without_global_tokens(tmp_path, length, padded):
  model, path = _released_dir(tmp_path)
  cfg, params = importer.load(path)
  assert (cfg.attention.kind, cfg.attention.kind_config.window) == ("longformer", 4)
  assert cfg.attention.kind_config.global_tokens == 0  # transformers' call without the mask
  assert sum(int(np.size(p)) for p in jax.tree.leaves(params)) == sum(
      p.numel() for p in model.parameters())
  ids, mask = _inputs(length, padded)
  real = mask.astype(bool)
  for g in (0, 3):
    ours, ref = _ours(cfg, params, ids, mask, g), _hf_out(model, ids, mask, g)
    parity._assert_close(ours[real], ref[real])


def test_base_model_hidden_states_and_pooler(tmp_path):
  """LongformerModel (no MLM head, a pooler): the last hidden states and the pooled [CLS]
  match with that token global."""
  model, path = _released_dir(tmp_path, T.LongformerModel, architectures=["LongformerModel"])
  cfg, params = importer.load(path)
  assert cfg.pooler and not cfg.mlm_head
  ids, mask = _inputs(12, False)
  hidden, pooled = _ours(cfg, params, ids, mask, 1, keys=("hidden", "pooled"))
  parity._assert_close(hidden, _hf_out(model, ids, mask, 1, "last_hidden_state"))
  parity._assert_close(pooled, _hf_out(model, ids, mask, 1, "pooler_output"))


def test_export_round_trip(tmp_path):
  model, path = _released_dir(tmp_path)
  run = parity._import(path, str(tmp_path / "run"))
  out_dir = str(tmp_path / "exported")
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out_dir}"]) == 0
  reloaded = T.AutoModelForMaskedLM.from_pretrained(out_dir).eval()
  assert type(reloaded) is type(model)
  assert list(reloaded.config.attention_window) == [4, 4]
  original = model.state_dict()
  for key, value in reloaded.state_dict().items():
    assert torch.equal(value, original[key]), key
  ids, mask = _inputs(12, False)
  np.testing.assert_array_equal(_hf_out(reloaded, ids, mask, 2), _hf_out(model, ids, mask, 2))


def test_what_transformers_cannot_express_is_refused_by_name(tmp_path):
  arch = registry.architecture("longformer")
  fields = {**RELEASED, **SIZES, "attention_window": [4, 8]}
  with pytest.raises(mapping.UnsupportedError, match=r"attention_window=\[4, 8\]"):
    arch.config_from_hf("longformer", mapping.Fields(fields, "longformer", arch.ignored), set())
  for field, value in (("attention_mode", "tvm"), ("ignore_attention_mask", True)):
    with pytest.raises(mapping.UnsupportedError, match=field):
      arch.config_from_hf("longformer", mapping.Fields({**RELEASED, **SIZES, field: value},
                                                       "longformer", arch.ignored), set())
  _, path = _released_dir(tmp_path)
  cfg, _ = importer.load(path)
  names = {n for r in arch.rules(cfg, None) for n in r.hf}
  with pytest.raises(mapping.UnsupportedError, match="longformer_global_tokens=1"):
    exporter.hf_config(arch, cfg.replace(longformer_global_tokens=1), names)
