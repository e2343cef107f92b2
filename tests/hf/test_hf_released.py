"""Released config.json field sets import unchanged (tfjax/hf/): each entry below is the full set
of fields of a published checkpoint's config.json (values as released), with only the sizes cut
to a tiny model. transformers builds a random model from those fields; its directory gets the
released config.json back (save_pretrained would rewrite it); tfjax reads it and must give
transformers' logits within 1e-5. Fields that change the math are still refused by name."""

# pylint: disable=protected-access  (the shared helpers of tests/hf/test_hf.py)
from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import test_hf as parity  # noqa: E402  (the shared parity helpers)
from tfjax.hf import importer, mapping, registry  # noqa: E402
from tfjax.nn.models import build_model  # noqa: E402

T = transformers
V = parity.V
_DECODER = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4)
_SEQ2SEQ = dict(vocab_size=V, d_model=32, encoder_layers=1, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                decoder_ffn_dim=48, num_hidden_layers=1)

# name -> (released config.json fields, size overrides, transformers Auto class)
RELEASED = {
    "gpt2": ({
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257},
        dict(n_embd=32, n_head=4, n_layer=2, n_ctx=32, n_positions=32, vocab_size=V,
             bos_token_id=0, eos_token_id=0), "causal"),
    "bert-base-uncased": ({
        "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
        "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
        "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522},
        dict(_DECODER, max_position_embeddings=32), "mlm"),
    "Qwen2.5-0.5B": ({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
        dict(_DECODER, num_key_value_heads=2, bos_token_id=0, eos_token_id=0), "causal"),
    "Llama-3.2-1B": ({
        "architectures": ["LlamaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
        dict(_DECODER, num_key_value_heads=2, head_dim=8, bos_token_id=0, eos_token_id=1),
        "causal"),
    "Mistral-7B-v0.1": ({
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000},
        dict(_DECODER, num_key_value_heads=2), "causal"),
    "Qwen3-0.6B": ({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936},
        dict(_DECODER, num_key_value_heads=2, head_dim=16, bos_token_id=0, eos_token_id=1),
        "causal"),
    "gemma-2b": ({  # Gemma 1: the legacy hidden_act="gelu", which transformers runs as tanh GELU
        "architectures": ["GemmaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256,
        "hidden_act": "gelu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 16384, "max_position_embeddings": 8192, "model_type": "gemma",
        "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1,
        "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0", "use_cache": True,
        "vocab_size": 256000},
        dict(_DECODER, num_key_value_heads=1, head_dim=16), "causal"),
    "gemma-2-2b": ({
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2,
        "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": 30.0,
        "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
        "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
        "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26,
        "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True,
        "vocab_size": 256000},
        dict(_DECODER, num_key_value_heads=2, head_dim=8, num_hidden_layers=3,
             attn_logit_softcapping=5.0, final_logit_softcapping=3.0, sliding_window=4),
        "causal"),
    "t5-small": ({
        "architectures": ["T5WithLMHeadModel"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
        "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
        "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06,
        "model_type": "t5", "n_positions": 512, "num_heads": 8, "num_layers": 6,
        "output_past": True, "pad_token_id": 0, "relative_attention_num_buckets": 32,
        "task_specific_params": {"summarization": {"early_stopping": True, "length_penalty": 2.0,
                                                   "max_length": 200, "min_length": 30,
                                                   "no_repeat_ngram_size": 3, "num_beams": 4,
                                                   "prefix": "summarize: "}},
        "vocab_size": 32128},
        dict(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
             relative_attention_num_buckets=8), "seq2seq"),
    "t5-v1_1-small": ({
        "architectures": ["T5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64,
        "d_model": 512, "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
        "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5",
        "num_decoder_layers": 8, "num_heads": 6, "num_layers": 8, "output_past": True,
        "pad_token_id": 0, "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
        "vocab_size": 32128},
        dict(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_decoder_layers=2,
             num_heads=4, relative_attention_num_buckets=8), "seq2seq"),
    "bart-base": ({
        "activation_dropout": 0.1, "activation_function": "gelu", "add_bias_logits": False,
        "add_final_layer_norm": False, "architectures": ["BartModel"], "attention_dropout": 0.1,
        "bos_token_id": 0, "classif_dropout": 0.1, "classifier_dropout": 0.0, "d_model": 768,
        "decoder_attention_heads": 12, "decoder_ffn_dim": 3072, "decoder_layerdrop": 0.0,
        "decoder_layers": 6, "decoder_start_token_id": 2, "dropout": 0.1, "early_stopping": True,
        "encoder_attention_heads": 12, "encoder_ffn_dim": 3072, "encoder_layerdrop": 0.0,
        "encoder_layers": 6, "eos_token_id": 2, "forced_eos_token_id": 2,
        "gradient_checkpointing": False, "id2label": {"0": "LABEL_0", "1": "LABEL_1",
                                                      "2": "LABEL_2"},
        "init_std": 0.02, "is_encoder_decoder": True,
        "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}, "max_position_embeddings": 1024,
        "model_type": "bart", "no_repeat_ngram_size": 3, "normalize_before": False,
        "normalize_embedding": True, "num_beams": 4, "num_hidden_layers": 6, "pad_token_id": 1,
        "scale_embedding": False, "torch_dtype": "float32",
        "transformers_version": "4.12.0.dev0", "use_cache": True, "vocab_size": 50265},
        dict(_SEQ2SEQ, max_position_embeddings=32), "seq2seq"),
    "opus-mt-en-de": ({
        "_num_labels": 3, "activation_dropout": 0.0, "activation_function": "swish",
        "add_bias_logits": False, "add_final_layer_norm": False,
        "architectures": ["MarianMTModel"], "attention_dropout": 0.0,
        "bad_words_ids": [[58100]], "bos_token_id": 0, "classif_dropout": 0.0,
        "classifier_dropout": 0.0, "d_model": 512, "decoder_attention_heads": 8,
        "decoder_ffn_dim": 2048, "decoder_layerdrop": 0.0, "decoder_layers": 6,
        "decoder_start_token_id": 58100, "decoder_vocab_size": 58101, "dropout": 0.1,
        "encoder_attention_heads": 8, "encoder_ffn_dim": 2048, "encoder_layerdrop": 0.0,
        "encoder_layers": 6, "eos_token_id": 0, "forced_eos_token_id": 0,
        "gradient_checkpointing": False, "id2label": {"0": "LABEL_0", "1": "LABEL_1",
                                                      "2": "LABEL_2"},
        "init_std": 0.02, "is_encoder_decoder": True,
        "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}, "max_length": 512,
        "max_position_embeddings": 512, "model_type": "marian", "normalize_before": False,
        "normalize_embedding": False, "num_beams": 4, "num_hidden_layers": 6,
        "pad_token_id": 58100, "scale_embedding": True,
        "share_encoder_decoder_embeddings": True, "static_position_embeddings": True,
        "transformers_version": "4.22.0.dev0", "use_cache": True, "vocab_size": 58101},
        dict(_SEQ2SEQ, max_position_embeddings=32, decoder_vocab_size=V, pad_token_id=V - 1,
             decoder_start_token_id=V - 1, bad_words_ids=[[V - 1]]), "seq2seq"),
    "gemma-3-1b-pt": ({
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
        "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": None,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
        "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True,
        "vocab_size": 262144},
        dict(_DECODER, num_key_value_heads=1, head_dim=8, num_hidden_layers=7, sliding_window=4),
        "causal"),
    "pythia-70m": ({
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02,
        "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6,
        "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
        "use_parallel_residual": True, "vocab_size": 50304},
        dict(_DECODER, hidden_size=64), "causal"),
    "phi-2": ({
        "_name_or_path": "microsoft/phi-2", "architectures": ["PhiForCausalLM"],
        "attention_dropout": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0,
        "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
        "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.37.0",
        "use_cache": True, "vocab_size": 51200},
        dict(_DECODER, hidden_size=40, num_key_value_heads=4, bos_token_id=0, eos_token_id=0),
        "causal"),
    "Phi-3-mini-4k-instruct": ({
        "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "sliding_window": 2047, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.2", "use_cache": True, "attention_bias": False,
        "vocab_size": 32064},
        dict(_DECODER, num_key_value_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             sliding_window=5), "causal"),
    "falcon-7b": ({
        "alibi": False, "apply_residual_connection_post_layernorm": False,
        "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_falcon.FalconConfig",
                     "AutoModel": "modeling_falcon.FalconModel",
                     "AutoModelForCausalLM": "modeling_falcon.FalconForCausalLM"},
        "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
        "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
        "model_type": "falcon", "multi_query": True, "new_decoder_architecture": False,
        "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True,
        "vocab_size": 65024},
        dict(vocab_size=V, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
             bos_token_id=0, eos_token_id=0), "causal"),
    "opt-125m": ({
        "_name_or_path": "facebook/opt-125m", "_remove_final_layer_norm": False,
        "activation_dropout": 0.0, "activation_function": "relu",
        "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
        "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 3072,
        "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048,
        "model_type": "opt", "num_attention_heads": 12, "num_hidden_layers": 12,
        "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
        "transformers_version": "4.21.0.dev0", "use_cache": True, "vocab_size": 50272,
        "word_embed_proj_dim": 768},
        dict(vocab_size=V, hidden_size=32, word_embed_proj_dim=32, ffn_dim=48,
             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32), "causal"),
    "roberta-base": ({
        "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "type_vocab_size": 1, "vocab_size": 50265},
        dict(_DECODER, max_position_embeddings=34), "mlm"),
    "mbart-large-cc25": ({
        "_num_labels": 3, "activation_dropout": 0.0, "activation_function": "gelu",
        "add_bias_logits": False, "add_final_layer_norm": True,
        "architectures": ["MBartForConditionalGeneration"], "attention_dropout": 0.1,
        "bos_token_id": 0, "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": 1024,
        "decoder_attention_heads": 16, "decoder_ffn_dim": 4096, "decoder_layerdrop": 0.0,
        "decoder_layers": 12, "dropout": 0.1, "encoder_attention_heads": 16,
        "encoder_ffn_dim": 4096, "encoder_layerdrop": 0.0, "encoder_layers": 12,
        "eos_token_id": 2, "forced_eos_token_id": 2,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}, "init_std": 0.02,
        "is_encoder_decoder": True, "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
        "max_length": 1024, "max_position_embeddings": 1024, "model_type": "mbart",
        "normalize_before": True, "normalize_embedding": True, "num_beams": 5,
        "num_hidden_layers": 12, "output_past": True, "pad_token_id": 1, "scale_embedding": True,
        "static_position_embeddings": False,
        "task_specific_params": {"translation_en_to_ro": {"decoder_start_token_id": 250020}},
        "transformers_version": "4.2.0.dev0", "use_cache": True, "vocab_size": 250027},
        dict(_SEQ2SEQ, max_position_embeddings=32), "seq2seq"),
}
# Four in the default run (the Gemma activation rules, the Marian legacy fields, Qwen3's QK-norm;
# every set is read in full by test_every_released_config_is_read); the rest are slow.
FAST = ("gemma-2b", "gemma-2-2b", "opus-mt-en-de", "Qwen3-0.6B")
AUTO = {"causal": T.AutoModelForCausalLM, "mlm": T.AutoModelForMaskedLM,
        "seq2seq": T.AutoModelForSeq2SeqLM}


def released_dir(tmp_path, name, **changes) -> tuple:
  """(the random transformers model, its directory holding the released config.json); `changes`
  override fields after the size cuts (another depth, a layer layout)."""
  fields, sizes, kind = RELEASED[name]
  released = {**fields, **sizes, **changes}
  config = T.AutoConfig.for_model(**copy.deepcopy(released))  # it edits nested dicts in place
  torch.manual_seed(0)
  model = parity._randomize(AUTO[kind].from_config(config, dtype=torch.float32))
  path = str(tmp_path / name)
  model.save_pretrained(path)
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(released, f)
  return model, path, kind


def _check(tmp_path, name):
  model, path, kind = released_dir(tmp_path, name)
  cfg, params = importer.load(path)
  ids = parity._ids()
  decoder_ids = parity._ids(seed=3, length=7) if kind == "seq2seq" else None
  args = (ids,) if decoder_ids is None else (ids, decoder_ids)
  out = build_model(cfg).apply({"params": params}, *[a.astype(np.int32) for a in args])
  ours = np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)
  parity._assert_close(ours, parity._hf_logits(model, ids, decoder_ids))


def test_every_released_config_is_read():
  """Every released field set (at its released sizes) is read in full: each field mapped,
  checked or listed as ignorable, none refused."""
  for name, (fields, _, _) in RELEASED.items():
    arch = registry.architecture(fields["model_type"])
    reader = mapping.Fields(fields, arch.model_type, arch.ignored)
    names = {"cls.predictions.transform.dense.weight", "lm_head.dense.weight"}
    arch.config_from_hf(arch.model_type, reader, names)
    reader.finish()  # raises naming any field left unread
    assert name


# (model_type's released field set, a field that changes the math) -> refused by that name.
MATH_FIELDS = [("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
               ("Qwen2.5-0.5B", {"use_sliding_window": True}),
               ("bart-base", {"normalize_before": True}),
               ("bart-base", {"add_final_layer_norm": True}),
               ("t5-small", {"feed_forward_proj": "gated-swish"}),
               ("gemma-2b", {"hidden_activation": "gelu"}),
               ("Mistral-7B-v0.1", {"hidden_act": "relu"}),
               ("bert-base-uncased", {"position_embedding_type": "relative_key"}),
               ("gpt2", {"some_future_switch": 1}),
               ("phi-2", {"qk_layernorm": True}),
               ("opt-125m", {"word_embed_proj_dim": 512}),
               ("opt-125m", {"layer_norm_elementwise_affine": False}),
               ("mbart-large-cc25", {"normalize_before": False}),
               ("Llama-3.2-1B", {"partial_rotary_factor": 0.5}),
               ("gemma-3-1b-pt", {"use_bidirectional_attention": True}),
               ("falcon-7b", {"alibi": True}),
               ("falcon-7b", {"apply_residual_connection_post_layernorm": True}),
               ("Phi-3-mini-4k-instruct", {"rope_scaling": {"type": "longrope",
                                                            "short_factor": [1.0],
                                                            "long_factor": [1.0]}}),
               ("gemma-3-1b-pt", {"layer_types": ["full_attention"] + ["sliding_attention"] * 25})]


@pytest.mark.parametrize("name,change", MATH_FIELDS)
def test_math_changing_field_is_refused_by_name(name, change):
  fields = {**RELEASED[name][0], **change}
  arch = registry.architecture(fields["model_type"])
  reader = mapping.Fields(fields, arch.model_type, arch.ignored)
  (key,) = change
  with pytest.raises(mapping.UnsupportedError, match=key):
    arch.config_from_hf(arch.model_type, reader, set())
    reader.finish()


def test_gemma_legacy_gelu_is_tanh_and_exact_geglu_is_not_exported():
  """transformers' GemmaConfig runs hidden_act='gelu' as tanh GELU, so tfjax imports it as
  geglu_tanh; a tfjax model with exact-erf GeGLU cannot be written as gemma (transformers would
  run it with tanh GELU) and export says so."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  arch = registry.architecture("gemma")
  fields = dict(RELEASED["gemma-2b"][0])
  reader = mapping.Fields(fields, "gemma", arch.ignored)
  values = arch.config_from_hf("gemma", reader, set())
  assert values["ffn"] == "geglu_tanh"
  assert T.GemmaConfig(hidden_act="gelu").hidden_act == "gelu_pytorch_tanh"  # the rule we follow
  exact = ModelConfig.from_flat({**values, "ffn": "geglu"}).validated()
  with pytest.raises(mapping.UnsupportedError, match="geglu"):
    exporter.hf_config(arch, exact, set())
  tanh = ModelConfig.from_flat(values).validated()
  assert exporter.hf_config(arch, tanh, set())["hidden_act"] == "gelu_pytorch_tanh"


@pytest.mark.parametrize("name", FAST)
def test_released_config_imports(tmp_path, name):
  _check(tmp_path, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(RELEASED) - set(FAST)))
def test_released_config_imports_more(tmp_path, name):
  _check(tmp_path, name)
