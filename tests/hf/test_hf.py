"""Hugging Face import/export parity (tfjax/hf/): small random-initialized transformers models,
saved with save_pretrained, imported with the CLI; logits against torch, greedy KV-cache decoding
against a greedy loop over the HF model, export -> from_pretrained bit-identical."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tfjax.hf import __main__ as cli  # noqa: E402
from tfjax.hf import mapping, registry  # noqa: E402
from tfjax.nn.models import build_model  # noqa: E402
from tfjax.inference import decode  # noqa: E402
from tfjax.training.checkpointing import runs
from tfjax.data import tokenizers

T = transformers
V, L = 97, 12  # vocab, test sequence length


def _small(**kw):
  base = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4)
  base.update(kw)
  return base


def _rope_llama3():
  return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8, "rope_theta": 500000.0}


# name -> (HF model factory, kind). Every factory builds a fresh random model (no download).
FACTORIES = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**_small(num_key_value_heads=2))),
    "llama3": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        **_small(num_key_value_heads=1), rope_parameters=_rope_llama3(), attention_bias=True,
        mlp_bias=True, tie_word_embeddings=True)),
    "llama_linear_rope": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        **_small(), rope_parameters={"rope_type": "linear", "factor": 4.0,
                                     "rope_theta": 10000.0})),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(
        **_small(num_key_value_heads=2), sliding_window=5)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_small(num_key_value_heads=2))),
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
        **_small(num_key_value_heads=2, head_dim=16), tie_word_embeddings=False)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(
        **_small(num_key_value_heads=1, head_dim=16))),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
        **_small(num_key_value_heads=2, head_dim=8, num_hidden_layers=3), sliding_window=4,
        query_pre_attn_scalar=12, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0,
        eos_token_id=0)),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **_small(num_key_value_heads=2, head_dim=8, num_hidden_layers=3), sliding_window=4,
        sliding_window_pattern=2, query_pre_attn_scalar=12, rope_theta=5000.0,
        rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        **_small(hidden_size=64), rotary_pct=0.25, rotary_emb_base=500.0)),
    "gpt_neox_sequential": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        **_small(hidden_size=64), rotary_pct=0.5, use_parallel_residual=False,
        tie_word_embeddings=True, hidden_act="gelu_new")),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(
        **_small(hidden_size=40, num_key_value_heads=2), partial_rotary_factor=0.4)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        **_small(num_key_value_heads=2), sliding_window=5, partial_rotary_factor=0.5,
        pad_token_id=0)),
    "falcon7b": lambda: T.FalconForCausalLM(T.FalconConfig(  # multi-query, one shared norm
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ffn_hidden_size=48)),
    "falcon40b": lambda: T.FalconForCausalLM(T.FalconConfig(  # grouped kv, ln_attn + ln_mlp
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, bias=True, tie_word_embeddings=False)),
    "falcon_sequential": lambda: T.FalconForCausalLM(T.FalconConfig(  # multi-head, sequential
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        multi_query=False, parallel_attn=False, bias=True)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(
        vocab_size=V, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32)),
    "opt_post_ln": lambda: T.OPTForCausalLM(T.OPTConfig(
        vocab_size=V, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, do_layer_norm_before=False, activation_function="gelu")),
    "bert": lambda: T.BertForMaskedLM(T.BertConfig(**_small(max_position_embeddings=32))),
    "roberta": lambda: T.RobertaForMaskedLM(T.RobertaConfig(
        **_small(max_position_embeddings=34), type_vocab_size=1, pad_token_id=1)),
    # hidden_act is the FFN's and BERT's MLM head's activation; RoBERTa's head is exact GELU.
    "bert_gelu_new": lambda: T.BertForMaskedLM(T.BertConfig(
        **_small(max_position_embeddings=32), hidden_act="gelu_new")),
    "roberta_relu": lambda: T.RobertaForMaskedLM(T.RobertaConfig(
        **_small(max_position_embeddings=34), type_vocab_size=1, pad_token_id=1,
        hidden_act="relu")),
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16)),
    "t5v11": lambda: T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_decoder_layers=2,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
}
_BART = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=1,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
             decoder_ffn_dim=48, max_position_embeddings=32)
FACTORIES["bart"] = lambda: T.BartForConditionalGeneration(T.BartConfig(**_BART))
FACTORIES["marian"] = lambda: T.MarianMTModel(T.MarianConfig(
    **_BART, pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0,
    scale_embedding=True, activation_function="swish"))
FACTORIES["mbart"] = lambda: T.MBartForConditionalGeneration(T.MBartConfig(
    **_BART, scale_embedding=True))
SEQ2SEQ = ("t5", "t5v11", "bart", "mbart", "marian")
DECODERS = ("llama", "llama3", "llama_linear_rope", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
            "gemma3", "gpt2", "gpt_neox", "gpt_neox_sequential", "phi", "phi3", "opt",
            "opt_post_ln", "falcon7b", "falcon40b", "falcon_sequential")
# qwen3's QK-norm is in the default run through tests/hf/test_hf_released.py (Qwen3-0.6B's fields).
FAST = ("llama3", "qwen2", "gemma2", "gpt2", "gpt_neox", "phi", "bert", "t5v11", "bart", "marian",
        "bert_gelu_new")


def _randomize(model, seed=0):
  """Every parameter (norm gains and biases too) and the final-logits bias random, so a
  misplaced tensor shows; fixed sinusoid tables (Marian) stay as they are."""
  gen = torch.Generator().manual_seed(seed)
  targets = {n: p for n, p in model.named_parameters()
             if "Sinusoid" not in type(model.get_submodule(n.rpartition(".")[0])).__name__}
  targets.update({n: b for n, b in model.named_buffers() if n.endswith("final_logits_bias")})
  with torch.no_grad():
    for p in targets.values():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def _hf_dir(tmp_path, name):
  torch.manual_seed(0)
  model = _randomize(FACTORIES[name]())
  path = str(tmp_path / f"hf_{name}")
  model.save_pretrained(path)
  return model, path


def _import(hf_dir, workdir):
  assert cli.main(["import", f"--hf_dir={hf_dir}", f"--workdir={workdir}"]) == 0
  return runs.restore_run(workdir)


def _ids(seed=1, batch=2, length=L):
  return np.random.default_rng(seed).integers(0, V, size=(batch, length)).astype(np.int64)


def _hf_logits(model, ids, decoder_ids=None):
  with torch.no_grad():
    if decoder_ids is None:
      return model(torch.from_numpy(ids)).logits.numpy()
    return model(input_ids=torch.from_numpy(ids),
                 decoder_input_ids=torch.from_numpy(decoder_ids)).logits.numpy()


def _tfjax_logits(run, ids, decoder_ids=None):
  args = (ids,) if decoder_ids is None else (ids, decoder_ids)
  out = build_model(run.model_config).apply({"params": run.params},
                                            *[a.astype(np.int32) for a in args])
  return np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)


def _assert_close(ours, ref):
  scale = np.abs(ref).max()
  err = np.abs(ours - ref).max()
  assert err <= 1e-5 * scale, f"max |diff| {err:.3g} vs scale {scale:.3g}"


def _hf_greedy(model, prompt, steps, encoder_ids=None):
  """Greedy decoding by full forward passes (no cache) over the HF model."""
  ids = torch.from_numpy(np.asarray([prompt]))
  with torch.no_grad():
    for _ in range(steps):
      if encoder_ids is None:
        logits = model(ids).logits
      else:
        logits = model(input_ids=torch.from_numpy(np.asarray([encoder_ids])),
                       decoder_input_ids=ids).logits
      ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
  return ids[0, len(prompt):].tolist()


def _parity(tmp_path, name):
  model, hf_dir = _hf_dir(tmp_path, name)
  run = _import(hf_dir, str(tmp_path / "run"))
  ids = _ids()
  if name.startswith("roberta"):  # positions count non-pad tokens only; tfjax's agree without padding
    ids[ids == model.config.pad_token_id] = 0
  decoder_ids = _ids(seed=3, length=7) if name in SEQ2SEQ else None
  _assert_close(_tfjax_logits(run, ids, decoder_ids), _hf_logits(model, ids, decoder_ids))
  prompt = [int(t) for t in _ids(seed=2, batch=1, length=5)[0]]
  if name not in SEQ2SEQ:  # the same parameters, counted as transformers counts them (tied once)
    ours = sum(int(np.size(p)) for p in jax.tree.leaves(run.params))
    assert ours == sum(p.numel() for p in model.parameters())
  if name in DECODERS:
    out = decode.generate(run.model_config, run.params, [prompt], max_new_tokens=7)
    assert [int(t) for t in np.asarray(out.tokens[0])] == _hf_greedy(model, prompt, 7)
  if name in SEQ2SEQ:
    start = [model.generation_config.decoder_start_token_id or model.config.pad_token_id]
    out = decode.generate(run.model_config, run.params, [start], max_new_tokens=7,
                          encoder_inputs=[prompt])
    assert [int(t) for t in np.asarray(out.tokens[0])] == _hf_greedy(model, start, 7, prompt)
  # Export -> from_pretrained: the same tensors, so bit-identical logits.
  out_dir = str(tmp_path / "exported")
  assert cli.main(["export", f"--workdir={run.workdir}", f"--hf_dir={out_dir}"]) == 0
  auto = T.AutoModelForMaskedLM if name.startswith(("bert", "roberta")) else {}.get(
      name, T.AutoModelForSeq2SeqLM if name in SEQ2SEQ else T.AutoModelForCausalLM)
  reloaded = auto.from_pretrained(out_dir).eval()
  assert type(reloaded) is type(model)
  original = model.state_dict()
  for key, value in reloaded.state_dict().items():
    assert torch.equal(value, original[key]), key
  np.testing.assert_array_equal(_hf_logits(reloaded, ids, decoder_ids),
                                _hf_logits(model, ids, decoder_ids))


@pytest.mark.parametrize("name", FAST)
def test_parity(tmp_path, name):
  _parity(tmp_path, name)


def test_mlm_head_activation_follows_each_architectures_rule(tmp_path):
  """BERT's hidden_act sets the MLM head's activation too; RoBERTa's head is exact GELU whatever
  hidden_act says. A run whose head and FFN disagree has no BERT config.json: refused by name."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  _, bert_dir = _hf_dir(tmp_path, "bert_gelu_new")
  _, roberta_dir = _hf_dir(tmp_path, "roberta_relu")
  bert_cfg = _import(bert_dir, str(tmp_path / "bert")).model_config
  roberta_cfg = _import(roberta_dir, str(tmp_path / "roberta")).model_config
  assert (bert_cfg.feed_forward.activation, bert_cfg.mlm_activation) == ("gelu_tanh", "gelu_tanh")
  assert (roberta_cfg.feed_forward.activation, roberta_cfg.mlm_activation) == ("relu", "gelu")
  with pytest.raises(mapping.UnsupportedError, match="model.mlm_activation='gelu_tanh'"):
    exporter.hf_config(registry.architecture("bert"), bert_cfg.replace(mlm_activation="gelu_tanh",
                                                                        ffn="gelu"), set())
  with pytest.raises(mapping.UnsupportedError, match="model.mlm_activation='relu'"):
    exporter.hf_config(registry.architecture("roberta"), roberta_cfg.replace(
        mlm_activation="relu"), set())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(FACTORIES) - set(FAST)))
def test_parity_more(tmp_path, name):
  _parity(tmp_path, name)


def _word_tokenizer(path):
  """A tokenizer.json over the words w0..w{V-1} (whitespace split), as a HF model dir has."""
  import tokenizers as hf_tok  # pylint: disable=import-outside-toplevel
  vocab = {f"w{i}": i for i in range(V)}
  tok = hf_tok.Tokenizer(hf_tok.models.WordLevel(vocab, unk_token="w0"))
  tok.pre_tokenizer = hf_tok.pre_tokenizers.WhitespaceSplit()
  tok.save(path)


def test_generate_and_finetune_from_import(tmp_path):
  """An imported run generates with its HF tokenizer (experiments/generate.py) and starts a
  fine-tune (config.init_from): step-0 params are the imported ones, the tokenizer carries over."""
  from experiments import generate  # pylint: disable=import-outside-toplevel
  from tfjax.training.config import defaults  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  model, hf_dir = _hf_dir(tmp_path, "qwen2")
  _word_tokenizer(os.path.join(hf_dir, "tokenizer.json"))
  run = _import(hf_dir, str(tmp_path / "run"))
  prompt = [3, 14, 15, 92]
  results = generate.main([f"--workdir={run.workdir}", "--prompt=" + " ".join(
      f"w{i}" for i in prompt), "--max_new_tokens=5", "--eos_id=-1"])
  assert results[0]["ids"] == _hf_greedy(model, prompt, 5)
  assert results[0]["text"].endswith(" ".join(f"w{i}" for i in results[0]["ids"]))

  corpus = tmp_path / "corpus.txt"
  corpus.write_text(" ".join(f"w{i % V}" for i in range(400)))
  config = defaults.base_config()
  config.init_from = run.workdir
  config.data.update(name="text", path=str(corpus), tokenizer="hf", seq_len=8)
  config.optimizer.update(lr=1e-20, min_lr=0.0, warmup_steps=0, weight_decay=0.0)  # no-op step
  config.train.update(num_steps=1, batch_size=2, eval_batch_size=2, eval_batches=1,
                      eval_every=1, checkpoint_every=1, eval_at_start=False)
  new = str(tmp_path / "finetune")
  train.train_and_evaluate(config, new)
  tuned = runs.restore_run(new)
  assert tuned.model_config == run.model_config
  assert isinstance(tokenizers.load_tokenizer(new), tokenizers.HFTokenizer)
  same = jax_tree_equal(tuned.params, run.params)
  assert same, "a no-op fine-tune step changed the params or did not start from the imported ones"


def test_generate_with_prompt_ids_from_an_import_without_tokenizer(tmp_path, capsys):
  """docs/hf.md: a model directory without tokenizer.json imports with the advice to generate
  with --prompt_ids; `experiments/generate.py --workdir=RUN --prompt_ids=...` then continues the
  ids (greedy = the HF model's) and shows ids; a text prompt names --prompt_ids."""
  from experiments import generate  # pylint: disable=import-outside-toplevel
  model, hf_dir = _hf_dir(tmp_path, "qwen2")
  assert not os.path.exists(os.path.join(hf_dir, "tokenizer.json"))
  run = _import(hf_dir, str(tmp_path / "run"))
  prompt = [3, 14, 15, 92]
  results = generate.main([f"--workdir={run.workdir}", "--prompt_ids=3 14 15 92",
                           "--max_new_tokens=5", "--eos_id=-1"])
  assert results[0]["ids"] == _hf_greedy(model, prompt, 5)
  assert results[0]["text"] == " ".join(str(i) for i in prompt + results[0]["ids"])
  with pytest.raises(SystemExit) as exit_:
    generate.main([f"--workdir={run.workdir}", "--prompt=hello", "--max_new_tokens=2"])
  assert exit_.value.code == 2 and "--prompt_ids" in capsys.readouterr().err


def test_finetune_of_an_import_exports_without_model_type(tmp_path):
  """README's path as written (sizes cut): import, `experiments/train.py --config.init_from=RUN
  --config.data.name=text --config.data.path=FILE --config.data.tokenizer=hf` (2 steps), then
  `python -m tfjax.hf export --workdir=FT --hf_dir=OUT` with no --model_type: the fine-tune
  carries its source's Hugging Face origin. transformers loads OUT as the source's class, its
  tensors are the fine-tuned params (not the imported ones) and its logits the fine-tuned run's."""
  import run_helpers  # pylint: disable=import-outside-toplevel
  model, hf_dir = _hf_dir(tmp_path, "qwen2")
  _word_tokenizer(os.path.join(hf_dir, "tokenizer.json"))
  run = _import(hf_dir, str(tmp_path / "run"))
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(" ".join(f"w{(7 * i) % V}" for i in range(400)))
  ft = str(tmp_path / "ft")
  result = run_helpers.run_cli(
      [f"--workdir={ft}", f"--config.init_from={run.workdir}", "--config.data.name=text",
       f"--config.data.path={corpus}", "--config.data.tokenizer=hf", "--config.data.seq_len=8",
       "--config.train.num_steps=2", "--config.train.batch_size=2",
       "--config.train.eval_batch_size=2", "--config.train.eval_batches=1",
       "--config.train.eval_at_start=False", "--config.train.checkpoint_every=2",
       "--config.train.eval_every=2", "--config.optimizer.warmup_steps=0"],
      cwd=tmp_path, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  tuned = runs.restore_run(ft)
  assert tuned.step == 2 and not jax_tree_equal(tuned.params, run.params)
  out_dir = str(tmp_path / "out")
  assert cli.main(["export", f"--workdir={ft}", f"--hf_dir={out_dir}"]) == 0
  reloaded = T.AutoModelForCausalLM.from_pretrained(out_dir).eval()
  assert type(reloaded) is type(model)
  assert os.path.exists(os.path.join(out_dir, "tokenizer.json"))
  ids = _ids()
  _assert_close(_tfjax_logits(tuned, ids), _hf_logits(reloaded, ids))
  assert not np.allclose(_hf_logits(reloaded, ids), _hf_logits(model, ids))


def jax_tree_equal(a, b) -> bool:
  import jax  # pylint: disable=import-outside-toplevel
  return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_unsupported_architecture_and_fields(tmp_path):
  """Anything tfjax cannot express is an error naming it, before anything is written."""
  _, hf_dir = _hf_dir(tmp_path, "llama")
  path = os.path.join(hf_dir, "config.json")
  original = json.load(open(path))
  cases = [({"model_type": "falcon_mamba"}, "model_type 'falcon_mamba' is not supported"),
           ({"some_new_option": 3}, "some_new_option=3"),
           ({"hidden_act": "relu"}, "hidden_act='relu'"),
           ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "'longrope'"),
           ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mscale": 1.0,
                                 "rope_theta": 1e4}}, "['mscale']")]
  for change, message in cases:
    with open(path, "w") as f:
      json.dump({**original, **change}, f)
    workdir = str(tmp_path / "run")
    with pytest.raises(mapping.UnsupportedError, match=message.replace("[", r"\[").replace(
        "(", r"\(")):
      from tfjax.hf import importer  # pylint: disable=import-outside-toplevel
      importer.import_model(hf_dir, workdir)
    assert not os.path.exists(workdir)
  # A tensor without a place in the model (e.g. an extra head) stops the import too.
  with open(path, "w") as f:
    json.dump(original, f)
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  weights = os.path.join(hf_dir, "model.safetensors")
  tensors = load_file(weights)
  save_file({**tensors, "score.weight": np.zeros((2, 32), np.float32)}, weights)
  assert cli.main(["import", f"--hf_dir={hf_dir}", f"--workdir={tmp_path / 'run2'}"]) == 2


def test_export_rejects_inexpressible_config(tmp_path):
  """A LLaMA run whose model uses ALiBi cannot become a LLaMA checkpoint."""
  from tfjax.hf import exporter  # pylint: disable=import-outside-toplevel
  from tfjax.nn.config import ModelConfig  # pylint: disable=import-outside-toplevel
  arch = registry.architecture("llama")
  cfg = ModelConfig.from_config(dict(
      family="decoder", vocab_size=V, d_model=32, num_heads=4, d_ff=48, ffn="swiglu",
      ffn_bias=False, attention_bias=False, norm="rmsnorm", position="alibi",
      tie_embeddings=False))
  with pytest.raises(mapping.UnsupportedError, match="position"):
    exporter.hf_config(arch, cfg, set())
