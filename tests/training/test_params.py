"""Parameter counts: published totals for the four configs, per-category counts derived by hand
from each architecture, analytic_count == module count across varied tiny configs, and training
FLOPs per token against nanoGPT's estimate and XLA's own count."""

import importlib.util
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import tiny_config, unboxed
from tfjax.training.accounting import params as tfparams
from tfjax.nn.config import ModelConfig
from tfjax.nn.models import build_model


ROOT = pathlib.Path(__file__).resolve().parents[2]


# Published totals (see each config's docstring).
PUBLISHED = {
    "gpt2_small": 124_439_808,       # Radford et al. 2019 / HF GPT2Model, tied head
    "bert_base": 109_482_240,        # Devlin et al. 2019 / HF BertModel with pooler
    "llama2_7b": 6_738_415_616,      # Touvron et al. 2023 / HF LlamaForCausalLM
    "llama2_70b": 68_976_648_192,    # Touvron et al. 2023 / HF LlamaForCausalLM (GQA 64/8)
    "transformer_base": 63_082_496,  # Vaswani et al. 2017 base, every bias, all embeddings tied
}


def _hand_counts(name):
  """Per-category counts written out from each architecture's description."""
  def attention(d, biases=True):  # W_Q, W_K, W_V, W_O (MHA) and their biases
    return 4 * d * d + (4 * d if biases else 0)

  def ffn(d, f, matrices=2, biases=True):
    return matrices * d * f + ((matrices - 1) * f + d if biases else 0)

  if name == "gpt2_small":
    d, f, n, v = 768, 3072, 12, 50257
    return dict(embeddings=v * d + 1024 * d, attention=n * attention(d), ffn=n * ffn(d, f),
                norms=(2 * n + 1) * 2 * d, **{"output head": 0})
  if name == "bert_base":
    d, f, n, v = 768, 3072, 12, 30522
    return dict(embeddings=(v + 512 + 2) * d, attention=n * attention(d), ffn=n * ffn(d, f),
                norms=(1 + 2 * n) * 2 * d, **{"output head": d * d + d})  # pooler
  if name == "llama2_7b":
    d, f, n, v = 4096, 11008, 32, 32000
    return dict(embeddings=v * d, attention=n * attention(d, biases=False),
                ffn=n * ffn(d, f, matrices=3, biases=False), norms=(2 * n + 1) * d,
                **{"output head": v * d})
  if name == "llama2_70b":
    d, f, n, v, kv = 8192, 28672, 80, 32000, 8 * 128  # 8 KV heads of head_dim 128
    return dict(embeddings=v * d, attention=n * (2 * d * d + 2 * d * kv),
                ffn=n * ffn(d, f, matrices=3, biases=False), norms=(2 * n + 1) * d,
                **{"output head": v * d})
  if name == "transformer_base":
    d, f, v = 512, 2048, 37000
    return dict(embeddings=v * d, attention=(6 + 2 * 6) * attention(d), ffn=12 * ffn(d, f),
                norms=(6 * 2 + 6 * 3) * 2 * d, **{"output head": 0})
  raise KeyError(name)


def load_config(name, arg=None, **overrides) -> ModelConfig:
  spec = importlib.util.spec_from_file_location(f"configs_{name}", ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  model_config = module.get_config(arg).model
  model_config.update(overrides)
  return ModelConfig.from_config(model_config)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_count_by_category_matches_published_and_hand_counts(name):
  counts = tfparams.count_by_category(load_config(name))
  hand = _hand_counts(name)
  assert sum(hand.values()) == PUBLISHED[name]  # the hand derivation itself adds up
  assert dict(counts) == hand
  assert sum(counts.values()) == PUBLISHED[name]


@pytest.mark.parametrize("name", ["gpt2_small", "llama2_7b"])
def test_cli_prints_the_published_total_last(name):
  result = subprocess.run(
      [sys.executable, "-m", "tfjax.params", f"--config=configs/{name}.py"], cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[-1] == f"total: {PUBLISHED[name]}"
  assert [line.split()[0] for line in lines[:-1]] == ["embeddings", "attention", "ffn", "norms",
                                                      "output"]


TINY_VARIANTS = {
    "decoder_default": dict(),
    "decoder_gqa_swiglu_untied_nobias_rms": dict(
        num_heads=4, num_kv_heads=2, ffn="swiglu", tie_embeddings=False, ffn_bias=False,
        attention_bias=False, norm="rmsnorm", position="rope"),
    "decoder_mqa_geglu_headdim_post": dict(
        num_heads=4, num_kv_heads=1, head_dim=6, ffn="geglu", norm_placement="post",
        num_layers=3),
    "decoder_layernorm_no_beta_scan": dict(norm_bias=False, num_layers=3, scan_layers=True,
                                           embed_scale=True, position="sinusoidal"),
    "decoder_embed_norm_alibi": dict(embed_norm=True, position="alibi", window=3),
    "encoder_bert_heads": dict(family="encoder", type_vocab_size=2, embed_norm=True, pooler=True,
                               num_classes=3, norm_placement="post"),
    "encoder_untied_mlm_rms": dict(family="encoder", tie_embeddings=False, norm="rmsnorm",
                                   position="rope", num_heads=4, num_kv_heads=2),
    "encoder_backbone_only": dict(family="encoder", mlm_head=False, ffn="relu", ffn_bias=False,
                                  scan_layers=True, num_layers=2),
    "encoder_decoder_untied_gqa": dict(
        family="encoder_decoder", num_layers=2, num_decoder_layers=3, num_heads=4,
        num_kv_heads=2, tie_embeddings=False, ffn="relu"),
    "encoder_decoder_post_rms_nobias": dict(
        family="encoder_decoder", norm_placement="post", norm="rmsnorm", attention_bias=False,
        ffn="swiglu", position="sinusoidal", head_dim=4),
    "encoder_decoder_scan": dict(family="encoder_decoder", scan_layers=True, num_layers=2,
                                 num_decoder_layers=2, position="none", norm_bias=False),
    # Architecture switches of issue #17 (each changes which parameters exist).
    "decoder_qwen2_qkv_bias_only": dict(attention_out_bias=False, ffn="silu", position="rope"),
    "decoder_out_bias_only_reglu": dict(attention_bias=False, attention_out_bias=True,
                                        ffn="reglu"),
    "decoder_gemma2_sandwich": dict(norm_placement="sandwich", norm="rmsnorm",
                                    norm_unit_offset=True, ffn="geglu_tanh", num_layers=3,
                                    window=2, window_pattern=2, attention_softcap=50.0,
                                    logits_softcap=30.0),
    "encoder_decoder_sandwich": dict(family="encoder_decoder", norm_placement="sandwich",
                                     qk_norm="layernorm"),
    "encoder_decoder_t5": dict(family="encoder_decoder", position="t5_bias", norm="rmsnorm",
                               attention_bias=False, ffn="geglu_tanh", ffn_bias=False,
                               scale_tied_logits=True, relative_buckets=8,
                               relative_max_distance=20, num_decoder_layers=2),
    "encoder_t5_bias_scan": dict(family="encoder", position="t5_bias", scan_layers=True,
                                 num_layers=2),
    "encoder_decoder_bart": dict(family="encoder_decoder", share_positions=False, embed_norm=True,
                                 position_offset=2, final_logits_bias=True, embed_scale=True),
    "encoder_decoder_marian_separate": dict(family="encoder_decoder", share_embeddings=False,
                                            position="sinusoidal", sinusoid_layout="halves",
                                            final_logits_bias=True, num_decoder_layers=2),
    "encoder_decoder_separate_untied_learned": dict(
        family="encoder_decoder", share_embeddings=False, tie_embeddings=False, embed_norm=True),
    "decoder_final_logits_bias_offset": dict(final_logits_bias=True, position_offset=3),
    "decoder_parallel_shared": dict(parallel_block=True, position="rope", rotary_fraction=0.25,
                                    num_layers=2),
    "encoder_parallel_two_norms": dict(family="encoder", parallel_block=True,
                                       parallel_shared_norm=False, norm="rmsnorm"),
    "encoder_decoder_deepnorm_scan": dict(family="encoder_decoder", norm_placement="deepnorm",
                                          scan_layers=True, num_layers=2, num_decoder_layers=2),
    "decoder_qk_rmsnorm_gqa": dict(qk_norm="rmsnorm", num_heads=4, num_kv_heads=2, head_dim=6),
}


def _module_count(cfg):
  model = build_model(cfg)
  x = jax.numpy.zeros((1, 4), jax.numpy.int32)
  inputs = (x, x) if cfg.family == "encoder_decoder" else (x,)
  shapes = unboxed(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *inputs)))
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes["params"]))


@pytest.mark.parametrize("name", list(TINY_VARIANTS))
def test_analytic_count_equals_module_count(name):
  cfg = tiny_config(**TINY_VARIANTS[name])
  module_total = _module_count(cfg)
  counts = tfparams.count_by_category(cfg)
  assert sum(counts.values()) == module_total  # every parameter lands in exactly one category
  assert tfparams.analytic_count(cfg) == module_total
  assert tfparams.report(cfg).splitlines()[-1] == f"total: {module_total}"


def test_untied_head_and_tied_head_categories():
  tied = tfparams.count_by_category(tiny_config())
  untied = tfparams.count_by_category(tiny_config(tie_embeddings=False))
  assert tied["output head"] == 0
  assert untied["output head"] == 31 * 16  # vocab x d_model, no bias
  assert {k: v for k, v in untied.items() if k != "output head"} == \
      {k: v for k, v in tied.items() if k != "output head"}


def test_report_refuses_a_count_that_disagrees_with_the_architecture(monkeypatch):
  cfg = tiny_config()
  monkeypatch.setattr(tfparams, "analytic_count", lambda c: _module_count(c) + 1)
  with pytest.raises(AssertionError, match="module count"):
    tfparams.report(cfg)


def test_llama2_70b_init_has_the_published_count():
  """The 70B config's module (traced with jax.eval_shape, nothing allocated) holds exactly the
  published parameter count."""
  assert _module_count(load_config("llama2_70b")) == PUBLISHED["llama2_70b"]
