"""BigBird import/export (tfjax/hf/models/bigbird.py) against transformers' BigBirdModel and
BigBirdForMaskedLM with attention_type='block_sparse': google/bigbird-roberta-base's released
config.json (written below, no download) scaled down to a random model, at a length where
transformers takes the block-sparse path; outputs within 1e-5 in float32 in evaluation
(model.eval(): random blocks all block 0) and in training mode (dropout 0: transformers' seeded
random blocks), and export -> from_pretrained bit-identical. The random-block generator against
transformers' own functions."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from transformers.models.big_bird import modeling_big_bird  # noqa: E402

from conftest import fast_jit  # noqa: E402
from tfjax.hf import __main__ as cli  # noqa: E402
from tfjax.hf import importer, registry  # noqa: E402
from tfjax.hf.mapping import Fields, UnsupportedError  # noqa: E402
from tfjax.nn.config import ModelConfig  # noqa: E402
from tfjax.nn.kinds import bigbird  # noqa: E402
from tfjax.nn.models import build_model  # noqa: E402
from tfjax.training.checkpointing import runs  # noqa: E402

# google/bigbird-roberta-base config.json as released on the hub.
RELEASED = {
    "architectures": ["BigBirdForPreTraining"], "attention_probs_dropout_prob": 0.1,
    "attention_type": "block_sparse", "block_size": 64, "bos_token_id": 1, "eos_token_id": 2,
    "gradient_checkpointing": False, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 4096, "model_type": "big_bird",
    "num_attention_heads": 12, "num_hidden_layers": 12, "num_random_blocks": 3,
    "pad_token_id": 0, "rescale_embeddings": False, "sep_token_id": 66, "type_vocab_size": 2,
    "use_bias": True, "use_cache": True, "vocab_size": 50358}
# Scaled down (block size 64 -> 8, num_random_blocks 3 kept): block-sparse above (5 + 2*3) * 8 =
# 88 tokens, so L = 96 (12 blocks) takes it.
SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=97, max_position_embeddings=128, block_size=8)
L = 96
MLM_NAMES = {"cls.predictions.transform.dense.weight", "bert.embeddings.word_embeddings.weight"}


def _hf_model(cls, **overrides):
  values = {k: v for k, v in RELEASED.items()
            if k not in ("architectures", "model_type", "gradient_checkpointing")}
  values.update(SMALL, **overrides)
  torch.manual_seed(0)
  model = cls(transformers.BigBirdConfig(**values))
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():  # every tensor random (norm gains and biases too): a misplaced one shows
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def _inputs(seed=2, pad=0):
  ids = np.random.default_rng(seed).integers(3, 97, size=(2, L)).astype(np.int64)
  mask = np.ones((2, L), np.int64)
  if pad:
    mask[1, -pad:] = 0
    ids[1, -pad:] = 0
  return ids, mask


def _assert_close(ours, ref):
  scale, err = np.abs(ref).max(), np.abs(np.asarray(ours) - ref).max()
  assert err <= 1e-5 * scale, f"max |diff| {err:.3g} vs scale {scale:.3g}"


def _sparse_path_taken(model):
  encoder = model.encoder if hasattr(model, "encoder") else model.bert.encoder
  return all(layer.attention.attention_type == "block_sparse" for layer in encoder.layer)


def test_released_config_reads_as_bigbird_attention():
  """Every field of bigbird-roberta-base's config.json is mapped or ignored; its gelu_new is the
  tanh GELU of the FFN and of the MLM head (BigBirdPredictionHeadTransform reads hidden_act)."""
  arch = registry.architecture("big_bird")
  fields = Fields(RELEASED, "big_bird", arch.ignored)
  cfg = ModelConfig.from_flat(arch.config_from_hf("big_bird", fields, set())).validated()
  fields.finish()
  assert (cfg.attention.kind, cfg.family, cfg.feed_forward.activation) == (
      "bigbird", "encoder", "gelu_tanh")
  kind_cfg = cfg.attention.kind_config
  assert (kind_cfg.block_size, kind_cfg.num_random_blocks, kind_cfg.random, kind_cfg.seed) == (
      64, 3, "hf", 0)
  assert (cfg.max_len, cfg.type_vocab_size, cfg.d_model, cfg.num_layers) == (4096, 2, 768, 12)
  with_head = ModelConfig.from_flat(arch.config_from_hf(
      "big_bird", Fields(RELEASED, "big_bird", arch.ignored), MLM_NAMES)).validated()
  assert (with_head.mlm_head, with_head.mlm_activation) == (True, "gelu_tanh")


@pytest.mark.parametrize("case", [
    (1024, 16, 3, 2, 0, 4096), (1024, 64, 3, 3, 5, 4096),  # transformers' older plan
    (96, 8, 3, 4, 1, 128), (160, 8, 3, 2, 0, 256),  # 12 and 20 blocks
    (64, 4, 2, 2, 7, 64), (120, 8, 1, 3, 2, 128)])
def test_seeded_random_blocks_are_transformers_training_pattern(case):
  length, block, r, heads, seed, max_len = case
  attn = modeling_big_bird.BigBirdBlockSparseAttention
  fake = types.SimpleNamespace(
      training=True, _get_single_block_row_attention=attn._get_single_block_row_attention)
  np.random.seed(seed)
  if length in bigbird.LEGACY_LENGTHS:
    expected = [attn._bigbird_block_rand_mask(fake, max_len, max_len, block, block, r,
                                              last_idx=1024)[:length // block - 2]
                for _ in range(heads)]
  else:
    plan = attn._get_rand_attn_plan(length, block, r)
    expected = attn._bigbird_block_rand_mask_with_head(
        fake, length, length, block, block, heads, plan[0], plan[1])
  np.testing.assert_array_equal(bigbird.random_blocks(length, block, r, heads, seed, max_len),
                                np.stack(expected))


def test_bigbird_model_parity_in_eval_and_training_mode(tmp_path):
  """BigBirdModel as released (gelu_new, pooler): last hidden state and pooled output, with a
  padded row, in model.eval() and in training mode without dropout."""
  model = _hf_model(transformers.BigBirdModel, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
  path = str(tmp_path / "hf")
  model.save_pretrained(path)
  cfg, params = importer.load(path)
  assert cfg.attention.kind == "bigbird" and cfg.pooler and not cfg.mlm_head
  ids, mask = _inputs(pad=13)
  outs = {}
  for training in (False, True):
    model.train(training)
    with torch.no_grad():
      ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    assert _sparse_path_taken(model)
    module = build_model(cfg.replace(deterministic=not training))
    ours = fast_jit(lambda p, x, s: module.apply({"params": p}, x, segment_ids=s))(
        params, ids.astype(np.int32), mask.astype(np.int32))
    _assert_close(ours["hidden"], ref.last_hidden_state.numpy())
    _assert_close(ours["pooled"], ref.pooler_output.numpy())
    outs[training] = ref.last_hidden_state.numpy()
  assert np.abs(outs[True] - outs[False]).max() > 1e-2  # the random blocks matter


@pytest.mark.parametrize("act", ["gelu_new", "gelu"])
def test_bigbird_mlm_parity_and_export_round_trip(tmp_path, act):
  """BigBirdForMaskedLM (hidden_act as released, gelu_new, and exact gelu: the FFN's and the MLM
  head's activation) imported with the CLI: logits within 1e-5 of model.eval(); the same
  parameter count; export -> from_pretrained gives the same tensors and bit-identical logits."""
  model = _hf_model(transformers.BigBirdForMaskedLM, hidden_act=act)
  hf_dir = str(tmp_path / "hf")
  model.save_pretrained(hf_dir)
  assert cli.main(["import", f"--hf_dir={hf_dir}", f"--workdir={tmp_path / 'run'}"]) == 0
  run = runs.restore_run(str(tmp_path / "run"))
  ids, _ = _inputs(seed=4)
  with torch.no_grad():
    ref = model(torch.from_numpy(ids)).logits.numpy()
  assert _sparse_path_taken(model)
  module = build_model(run.model_config)
  ours = fast_jit(lambda p, x: module.apply({"params": p}, x))(run.params, ids.astype(np.int32))
  _assert_close(ours["mlm_logits"], ref)
  assert sum(int(np.size(p)) for p in jax.tree.leaves(run.params)) == sum(
      p.numel() for p in model.parameters())
  out_dir = str(tmp_path / "exported")
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out_dir}"]) == 0
  reloaded = transformers.AutoModelForMaskedLM.from_pretrained(out_dir).eval()
  assert type(reloaded) is type(model) and reloaded.config.attention_type == "block_sparse"
  original = model.state_dict()
  for key, value in reloaded.state_dict().items():
    assert torch.equal(value, original[key]), key
  with torch.no_grad():
    np.testing.assert_array_equal(reloaded(torch.from_numpy(ids)).logits.numpy(), ref)


def test_export_refuses_a_pattern_transformers_does_not_compute():
  """A bigbird run with seeded random blocks in evaluation is not what transformers computes."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  arch = registry.architecture("big_bird")
  values = arch.config_from_hf("big_bird", Fields(RELEASED, "big_bird", arch.ignored), set())
  cfg = ModelConfig.from_flat({**values, "bigbird_random": "seeded"}).validated()
  names = {n for r in arch.rules(cfg, None) for n in r.hf}
  exporter.hf_config(arch, cfg.replace(bigbird_random="hf"), names)  # what transformers runs
  with pytest.raises(UnsupportedError, match="{'bigbird_random': 'seeded'}"):
    exporter.hf_config(arch, cfg, names)


def test_original_full_imports_as_softmax_attention(tmp_path):
  """attention_type='original_full' is BERT's attention: model.attention_kind='softmax', with
  no bigbird_* keys set; hidden states within 1e-5 and the config round trip."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  model = _hf_model(transformers.BigBirdModel, attention_type="original_full")
  path = str(tmp_path / "hf")
  model.save_pretrained(path)
  cfg, params = importer.load(path)
  assert cfg.attention.kind == "softmax"
  ids = _inputs(seed=6)[0][:, :24]
  with torch.no_grad():
    ref = model(torch.from_numpy(ids)).last_hidden_state.numpy()
  module = build_model(cfg)
  ours = fast_jit(lambda p, x: module.apply({"params": p}, x))(params, ids.astype(np.int32))
  _assert_close(ours["hidden"], ref)
  arch = registry.architecture("big_bird")
  out = exporter.hf_config(arch, cfg, {n for r in arch.rules(cfg, None) for n in r.hf})
  assert out["attention_type"] == "original_full"
