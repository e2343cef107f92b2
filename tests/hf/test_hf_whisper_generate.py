"""`tfjax-generate` transcribes with an imported Whisper run (tfjax/inference/transcribe.py,
whisper_decode.py): the same token ids as transformers' `generate` (greedy and num_beams=N) of a
small random WhisperForConditionalGeneration built from a config (no download), with a
generation_config.json carrying a released model's kinds of settings: suppress_tokens,
begin_suppress_tokens, forced_decoder_ids (language to detect, task), lang_to_id / task_to_id and
no_timestamps_token_id; with --language given and detected."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tfjax.hf import __main__ as hf_cli  # noqa: E402
from tfjax.inference import whisper_decode  # noqa: E402
from tfjax.nn.audio import WhisperConfig  # noqa: E402
from tfjax.training.entry import generate_main  # noqa: E402

FRAMES, MELS, NEW = 32, 8, 8
GENERATION = dict(
    decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, bos_token_id=1,
    lang_to_id={"<|en|>": 30, "<|de|>": 31}, task_to_id={"transcribe": 33, "translate": 32},
    no_timestamps_token_id=35, forced_decoder_ids=[[1, None], [2, 33]],
    suppress_tokens=[4, 7, 11], begin_suppress_tokens=[2, 5], is_multilingual=True)


def _imported(tmp_path_factory, eos_bias):
  base = tmp_path_factory.mktemp("whisper_generate")
  config = transformers.WhisperConfig(
      vocab_size=40, num_mel_bins=MELS, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=48,
      decoder_ffn_dim=40, max_source_positions=FRAMES // 2, max_target_positions=20,
      decoder_start_token_id=1, eos_token_id=2, pad_token_id=0, bos_token_id=1,
      begin_suppress_tokens=None, suppress_tokens=None)
  torch.manual_seed(0)
  model = transformers.WhisperForConditionalGeneration(config)
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name != "model.encoder.embed_positions.weight":
        p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    # eos_bias: EOS likely enough that greedy rows end early
    eos = model.model.decoder.embed_tokens.weight[2]
    model.model.decoder.layer_norm.bias.add_(eos_bias * eos / eos.norm())
  model.generation_config = transformers.GenerationConfig(**GENERATION, max_length=20)
  model.eval().save_pretrained(base / "hf")
  run = str(base / "run")
  assert hf_cli.main(["import", f"--hf_dir={base / 'hf'}", f"--workdir={run}"]) == 0
  features = np.random.default_rng(5).normal(size=(4, FRAMES, MELS)).astype(np.float32)
  np.save(base / "features.npy", features)
  return model, run, str(base / "features.npy"), features


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  return _imported(tmp_path_factory, 6.0)


@pytest.fixture(scope="module")
def imported_no_eos(tmp_path_factory):
  """No row ends within NEW tokens. Beam search is compared here: where a beam ends with EOS,
  transformers 5.x's Whisper beam path returns hypotheses longer than max_new_tokens (13 new
  tokens for max_new_tokens=8 on `imported`), which tfjax does not reproduce (not resolved)."""
  return _imported(tmp_path_factory, 0.0)


def _hf_tokens(model, features, beams, language=None):
  kwargs = {"language": language} if language else {}
  with torch.no_grad():
    out = model.generate(input_features=torch.from_numpy(features.transpose(0, 2, 1)),
                         max_new_tokens=NEW, do_sample=False, num_beams=beams, **kwargs)
  rows = []
  for row in out.numpy().tolist():
    # transformers' Whisper returns the new tokens without their EOS, padded with pad (0)
    ends = [i for i, t in enumerate(row) if t in (0, 2)]
    rows.append(row[:ends[0]] if ends else row)
  return rows


def _without_eos(ids):
  return ids[:-1] if ids and ids[-1] == 2 else ids


@pytest.mark.parametrize("beams,ends", [(1, True), (1, False), (3, False), (4, False)])
@pytest.mark.parametrize("language", [None, "en"])
def test_transcription_equals_transformers_generate(imported, imported_no_eos, capsys, beams,
                                                    ends, language):
  model, run, path, features = imported if ends else imported_no_eos
  argv = [f"--workdir={run}", f"--features={path}", f"--max_new_tokens={NEW}",
          "--strategy=" + ("beam" if beams > 1 else "greedy"), f"--beam_size={beams}"]
  argv += [f"--language={language}"] if language else []
  results = generate_main.main(argv)
  want = _hf_tokens(model, features, beams, language)
  assert [_without_eos(r["ids"]) for r in results] == want
  ended = [r["ids"][-1] == 2 for r in results]
  assert all(ended) if ends else not any(ended)
  prompt = results[0]["prompt"]
  assert prompt[0] == 1 and prompt[2:] == [33, 35]  # start, language, transcribe, no timestamps
  assert prompt[1] == (30 if language == "en" else prompt[1]) and prompt[1] in (30, 31)
  banned = set(GENERATION["suppress_tokens"])
  assert not any(banned & set(r["ids"]) for r in results)
  assert all(r["ids"][0] not in GENERATION["begin_suppress_tokens"] for r in results)
  assert "checkpoint step 0" in capsys.readouterr().out


def test_suppress_lists_change_the_tokens(imported):
  """Without the generation config's lists the greedy tokens differ (so the test above checks
  that they are applied, not merely that nothing was suppressed)."""
  model, run, _, features = imported
  from tfjax.nn import audio  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  restored = runs.restore_run(run)
  prompt = whisper_decode.prompts(restored.model_config, restored.params, features, GENERATION)
  plain = np.asarray(audio.greedy_decode(restored.model_config, restored.params, features, NEW,
                                         prompt))[:, prompt.shape[1]:]
  suppressed = _hf_tokens(model, features, 1)
  assert [list(r[:len(s)]) for r, s in zip(plain.tolist(), suppressed)] != suppressed


def test_prompt_from_forced_decoder_ids_and_flags():
  cfg = WhisperConfig(vocab_size=40, decoder_start_id=1, eos_id=2)
  gen = dict(GENERATION, forced_decoder_ids=[[1, 31], [2, 32], [3, 35]])
  assert whisper_decode.prompt_tokens(cfg, gen) == [1, 31, 32, 35]
  assert whisper_decode.prompt_tokens(cfg, gen, language="en") == [1, 30, 33, 35]
  assert whisper_decode.prompt_tokens(cfg, gen, task="transcribe") == [1, None, 33, 35]
  assert whisper_decode.prompt_tokens(cfg, {}) == [1]  # no generation config: the start id
  with pytest.raises(ValueError, match="--language='xx' is not one of"):
    whisper_decode.prompt_tokens(cfg, gen, language="xx")


def test_generate_errors_are_one_line(imported, capsys):
  _, run, _, _ = imported
  with pytest.raises(SystemExit) as e:
    generate_main.main([f"--workdir={run}"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--audio" in err[0] and "--features" in err[0], err
