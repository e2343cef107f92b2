"""ViT, CLIP, Whisper and Funnel checkpoints as run directories (tfjax/hf/task_runs.py, issue 58
item 2), from small random transformers models built from configs (no download):

  * `python -m tfjax.hf import` then `export` reproduces every tensor bit for bit, for each
    class (ViTForImageClassification, ViTModel with and without its pooler, CLIPModel,
    CLIPVisionModel, WhisperForConditionalGeneration, WhisperModel, the four Funnel classes),
    and transformers loads the export as the class it came from;
  * the plain models' outputs (ViTModel's pooler, CLIPVisionModel's pooled output, WhisperModel's
    decoder states) equal transformers' within 1e-5;
  * an import fine-tunes a few steps through experiments/train.py (`--config=configs/
    from_run.py:RUN --config.init_from=RUN`), evaluates, and its export computes what tfjax
    computes within 1e-5;
  * heads tfjax does not have are refused with one error line naming the class.

Whisper transcription parity against transformers' generate is tests/hf/test_hf_whisper_generate.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.numpy import load_file  # noqa: E402

from tfjax.hf import __main__ as hf_cli  # noqa: E402
from tfjax.hf import registry, task_runs  # noqa: E402
from tfjax.nn.audio import Whisper  # noqa: E402
from tfjax.nn.clip import CLIP  # noqa: E402
from tfjax.nn.funnel import Funnel  # noqa: E402
from tfjax.nn.vision import ViTClassifier  # noqa: E402
from tfjax.training.checkpointing import runs  # noqa: E402

T = transformers
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-5
VISION = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              image_size=8, patch_size=4)
CLIP_TEXT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=10, eos_token_id=3,
                 bos_token_id=1, pad_token_id=0)


def whisper_config(**kw):
  return T.WhisperConfig(**{**dict(
      vocab_size=40, num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
      decoder_ffn_dim=16, max_source_positions=16, max_target_positions=20,
      decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, bos_token_id=1,
      begin_suppress_tokens=None, suppress_tokens=None), **kw})


def funnel_config(**kw):
  return T.FunnelConfig(vocab_size=30, block_sizes=[1, 1], d_model=16, n_head=2, d_head=8,
                        d_inner=32, num_decoder_layers=1, **kw)


# name -> (model builder, task of the run)
CASES = {
    "vit_classifier": (lambda: T.ViTForImageClassification(T.ViTConfig(num_labels=3, **VISION)),
                       "vit"),
    "vit_model": (lambda: T.ViTModel(T.ViTConfig(**VISION)), "vit"),
    "vit_model_no_pooler": (lambda: T.ViTModel(T.ViTConfig(**VISION), add_pooling_layer=False),
                            "vit"),
    "clip": (lambda: T.CLIPModel(T.CLIPConfig(text_config=CLIP_TEXT, vision_config=VISION,
                                              projection_dim=8)), "clip"),
    "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**VISION)), "vit"),
    "whisper": (lambda: T.WhisperForConditionalGeneration(whisper_config()), "whisper"),
    "whisper_model": (lambda: T.WhisperModel(whisper_config()), "whisper"),
    "funnel_mlm": (lambda: T.FunnelForMaskedLM(funnel_config()), "funnel"),
    "funnel_classification": (lambda: T.FunnelForSequenceClassification(
        funnel_config(num_labels=3)), "funnel_classification"),
    "funnel_base": (lambda: T.FunnelBaseModel(funnel_config()), "funnel"),
    "funnel_model": (lambda: T.FunnelModel(funnel_config()), "funnel"),
}


def perturbed(model, seed=0):
  """Every trained weight moved (HF's LayerNorms start at identity, biases at zero); Whisper's
  stored sinusoids are not a trained weight and stay."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if not name.endswith("encoder.embed_positions.weight"):
        p.add_(torch.randn(p.shape, generator=gen) * 0.1)
  return model.eval()


def saved(tmp_path, name):
  torch.manual_seed(0)
  model = perturbed(CASES[name][0]())
  path = str(tmp_path / "src")
  model.save_pretrained(path)
  return model, path


def cli(*argv):
  return hf_cli.main(list(argv))


def tensors(path):
  return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_export_bit_exact(tmp_path, name):
  model, src = saved(tmp_path, name)
  run, out = str(tmp_path / "run"), str(tmp_path / "out")
  assert cli("import", f"--hf_dir={src}", f"--workdir={run}") == 0
  config = runs.load_config(run)
  assert config.task == CASES[name][1]
  origin = task_runs.origin(run)
  assert origin["hf_class"] == type(model).__name__
  assert os.path.exists(os.path.join(run, "checkpoints"))
  assert cli("export", f"--workdir={run}", f"--hf_dir={out}") == 0
  want, got = tensors(src), tensors(out)
  assert sorted(got) == sorted(want)
  for key in want:
    assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
    assert got[key].tobytes() == want[key].tobytes(), key  # bit for bit
  exported = json.load(open(os.path.join(out, "config.json"), encoding="utf-8"))
  assert exported["architectures"] == [type(model).__name__]
  # transformers reads it as the class it came from (a ViTModel saved without its pooler is
  # loaded the way it was built: add_pooling_layer is a constructor argument, not a config field)
  extra = {"add_pooling_layer": False} if name == "vit_model_no_pooler" else {}
  back = type(model).from_pretrained(out, **extra)
  assert sorted(back.state_dict()) == sorted(model.state_dict())


def _images(batch=2, seed=1):
  return np.random.default_rng(seed).normal(size=(batch, 8, 8, 3)).astype(np.float32)


def _restored(tmp_path, name):
  model, src = saved(tmp_path, name)
  run = str(tmp_path / "run")
  assert cli("import", f"--hf_dir={src}", f"--workdir={run}") == 0
  return model, runs.restore_run(run)


def test_vit_model_pooler_matches_transformers(tmp_path):
  model, run = _restored(tmp_path, "vit_model")
  x = _images()
  out = ViTClassifier(run.model_config).apply({"params": run.params}, x)
  with torch.no_grad():
    want = model(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2)))
  np.testing.assert_allclose(out["pooler_output"], want.pooler_output.numpy(), atol=ATOL)
  np.testing.assert_allclose(out["hidden"], want.last_hidden_state.numpy(), atol=ATOL)


def test_clip_vision_model_matches_transformers(tmp_path):
  model, run = _restored(tmp_path, "clip_vision")
  x = _images()
  out = ViTClassifier(run.model_config).apply({"params": run.params}, x)
  with torch.no_grad():
    want = model(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2)))
  np.testing.assert_allclose(out["pooled"], want.pooler_output.numpy(), atol=ATOL)


def test_whisper_model_matches_transformers(tmp_path):
  """WhisperModel's decoder states, through tfjax's tied output layer: logits = h E^T."""
  model, run = _restored(tmp_path, "whisper_model")
  x = np.random.default_rng(2).normal(size=(2, 32, 8)).astype(np.float32)
  ids = np.array([[1, 5, 9, 4], [1, 3, 3, 7]], np.int32)
  got = Whisper(run.model_config).apply({"params": run.params}, x, ids)
  with torch.no_grad():
    h = model(input_features=torch.from_numpy(x.transpose(0, 2, 1)),
              decoder_input_ids=torch.from_numpy(ids).long()).last_hidden_state
    want = (h @ model.decoder.embed_tokens.weight.T).numpy()
  np.testing.assert_allclose(got, want, atol=ATOL * np.abs(want).max())


# --- fine-tune through the main loop ----------------------------------------------------------

def _train(workdir, run, *extra, steps=3):
  cmd = [sys.executable, os.path.join(REPO, "experiments", "train.py"),
         f"--config={os.path.join(REPO, 'configs', 'from_run.py')}:{run}",
         f"--config.init_from={run}", f"--workdir={workdir}",
         f"--config.train.num_steps={steps}", "--config.train.batch_size=8",
         "--config.train.eval_batch_size=8", "--config.train.eval_batches=1",
         f"--config.train.eval_every={max(steps, 1)}", "--config.train.log_every=1",
         f"--config.train.checkpoint_every={max(steps, 1)}", "--config.optimizer.warmup_steps=1",
         "--config.optimizer.lr=1e-2", *extra]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"),
                                            encoding="utf-8")]


def _fine_tune_inputs(name, cfg):
  rng = np.random.default_rng(3)
  if name == "vit_classifier":
    return (_images(),), {}
  if name == "clip":
    ids = np.array([[1, 5, 9, 3, 0, 0, 0, 0, 0, 0], [1, 7, 3, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    return (_images(), ids), {}
  if name == "whisper":
    return (rng.normal(size=(2, 32, 8)).astype(np.float32),
            np.array([[1, 5, 9, 4], [1, 3, 3, 7]], np.int32)), {}
  ids = rng.integers(3, cfg.vocab_size, size=(2, 8)).astype(np.int32)
  return (ids,), {}


def _torch_outputs(name, model, args):
  with torch.no_grad():
    if name == "vit_classifier":
      return model(pixel_values=torch.from_numpy(args[0].transpose(0, 3, 1, 2))).logits.numpy()
    if name == "clip":
      out = model(pixel_values=torch.from_numpy(args[0].transpose(0, 3, 1, 2)),
                  input_ids=torch.from_numpy(args[1]).long())
      return out.logits_per_image.numpy()
    if name == "whisper":
      return model(input_features=torch.from_numpy(args[0].transpose(0, 2, 1)),
                   decoder_input_ids=torch.from_numpy(args[1]).long()).logits.numpy()
    return model(input_ids=torch.from_numpy(args[0]).long()).logits.numpy()


def _tfjax_outputs(name, run, args):
  cfg, params = run.model_config, {"params": run.params}
  if name == "vit_classifier":
    return np.asarray(ViTClassifier(cfg).apply(params, *args)["logits"])
  if name == "clip":
    return np.asarray(CLIP(cfg).apply(params, *args)["logits_per_image"])
  if name == "whisper":
    return np.asarray(Whisper(cfg).apply(params, *args))
  return np.asarray(Funnel(cfg).apply(params, *args)["mlm_logits"])


# Synthetic data keys that fit each small model (the task's own synthetic source).
FINE_TUNE = {
    "vit_classifier": ("--config.data.noise=0.5",),
    "clip": (),
    "whisper": ("--config.data.num_symbols=8",),
    "funnel_mlm": ("--config.data.seq_len=16", "--config.data.num_symbols=8"),
}


@pytest.mark.parametrize("name", sorted(FINE_TUNE))
def test_fine_tune_from_import_then_export(tmp_path, name):
  model, src = saved(tmp_path, name)
  run, ft, out = (str(tmp_path / d) for d in ("run", "ft", "out"))
  assert cli("import", f"--hf_dir={src}", f"--workdir={run}") == 0
  rows = _train(ft, run, *FINE_TUNE[name])
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert len(losses) == 3 and all(np.isfinite(losses))
  assert any("eval/loss" in r for r in rows)
  assert os.path.exists(os.path.join(ft, "hf", "import.json"))  # carried: export knows the class
  assert cli("export", f"--workdir={ft}", f"--hf_dir={out}") == 0
  tuned = runs.restore_run(ft)
  assert tuned.step == 3
  args, _ = _fine_tune_inputs(name, tuned.model_config)
  back = type(model).from_pretrained(out).eval()
  want, got = _torch_outputs(name, back, args), _tfjax_outputs(name, tuned, args)
  np.testing.assert_allclose(got, want, atol=ATOL * max(1.0, np.abs(want).max()))
  before = _torch_outputs(name, model, args)
  assert np.abs(before - want).max() > 1e-3  # the fine-tune moved the model


def test_evaluate_import_through_the_main_loop(tmp_path):
  """The main loop's step-0 evaluation (train.eval_at_start, before any update) of the imported
  model is transformers' cross entropy of the same eval rows."""
  model, src = saved(tmp_path, "vit_classifier")
  run, ev = str(tmp_path / "run"), str(tmp_path / "eval")
  assert cli("import", f"--hf_dir={src}", f"--workdir={run}") == 0
  rows = _train(ev, run, steps=1)
  evals = [r for r in rows if "eval/loss" in r and r["step"] == 0]
  assert len(evals) == 1
  restored = runs.restore_run(ev)
  [(_, batch)] = restored.dataset.eval_batches(8, 1)
  with torch.no_grad():
    logits = model(pixel_values=torch.from_numpy(batch["images"].transpose(0, 3, 1, 2))).logits
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(batch["labels"]).long())
  np.testing.assert_allclose(evals[0]["eval/loss"], float(loss), rtol=1e-5)


# --- errors -----------------------------------------------------------------------------------

REFUSED = {
    "ViTForMaskedImageModeling": (lambda: T.ViTForMaskedImageModeling(T.ViTConfig(**VISION)),
                                  "ViTForMaskedImageModeling"),
    "CLIPVisionModelWithProjection": (lambda: T.CLIPVisionModelWithProjection(
        T.CLIPVisionConfig(projection_dim=8, **VISION)), "CLIPVisionModelWithProjection"),
    "WhisperForAudioClassification": (lambda: T.WhisperForAudioClassification(whisper_config()),
                                      "WhisperForAudioClassification"),
    "FunnelForPreTraining": (lambda: T.FunnelForPreTraining(funnel_config()),
                             "FunnelForPreTraining"),
    "FunnelForTokenClassification": (lambda: T.FunnelForTokenClassification(funnel_config()),
                                     "FunnelForTokenClassification"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_heads_are_one_error_line(tmp_path, capsys, name):
  build, named = REFUSED[name]
  build().save_pretrained(str(tmp_path / "src"))
  capsys.readouterr()  # save_pretrained's progress bar
  run = tmp_path / "run"
  assert cli("import", f"--hf_dir={tmp_path / 'src'}", f"--workdir={run}") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error:") and named in err[0], err
  assert "lacks tensor" not in err[0]
  assert not run.exists()  # nothing written


def test_plain_vit_model_is_not_refused_as_lacking_prefixed_tensors(tmp_path, capsys):
  """The misleading message of issue 58: a ViTModel read with ViTForImageClassification's names."""
  _, src = saved(tmp_path, "vit_model")
  assert cli("import", f"--hf_dir={src}", f"--workdir={tmp_path / 'run'}") == 0
  assert "lacks tensor" not in capsys.readouterr().err


def test_bfloat16_import_of_a_task_model_is_refused(tmp_path, capsys):
  _, src = saved(tmp_path, "vit_classifier")
  capsys.readouterr()
  assert cli("import", f"--hf_dir={src}", f"--workdir={tmp_path / 'run'}",
             "--dtype=bfloat16") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --dtype=bfloat16") and "float32" in err


def test_task_model_types_are_listed_in_the_registry():
  assert set(registry.MODALITIES) == {"vit", "clip", "clip_vision_model", "whisper", "funnel"}
  from tfjax.hf import modalities  # pylint: disable=import-outside-toplevel
  assert set(modalities.FAMILIES) == set(registry.MODALITIES)
