"""Released config.json field sets of the modality front-ends import and export unchanged
(tfjax/hf/models/vit.py, clip.py, whisper.py), as tests/hf/test_hf_released.py does for the text
families: each entry below is the full set of fields of a published checkpoint's config.json
(values as released), with only the widths, depths and Whisper's input length cut to a tiny
model (vocabularies, image, patch and mel sizes, token ids and generation fields stay as
released). transformers builds a random model from those fields; its directory gets the
released config.json back (save_pretrained would rewrite it); tfjax reads it and must give
transformers' outputs within 1e-5, Whisper's greedy tokens equal to transformers' generate;
export writes a directory that transformers loads to the same weights and outputs. Fields that change the math are refused by
name. No download: the field values were checked against the copies named beside each set."""

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

import test_clip as clip_tests  # noqa: E402  (the CLIP helpers of tests/modalities/)
import test_vit as vit_tests  # noqa: E402
import test_whisper as whisper_tests  # noqa: E402
from tfjax.hf import modalities  # noqa: E402
from tfjax.hf.mapping import Fields, UnsupportedError  # noqa: E402
from tfjax.nn import audio  # noqa: E402

T = transformers
ATOL = 1e-5
VIT, CLIP, WHISPER = "google/vit-base-patch16-224", "openai/clip-vit-base-patch32", \
    "openai/whisper-tiny"

# google/vit-base-patch16-224 config.json. Checked: the architecture (no pooler, 1000-way
# classifier, eps 1e-12) against whaler404/Hf-Learn
# transformers_learn/api/models/vision_models/vit/vit.md (a print of the loaded model); the field
# set against the same-era google/vit-base-patch16-224-in21k config.json copied in public
# READMEs (same fields, transformers_version 4.13.0.dev0). Not confirmed: whether this file has
# "_name_or_path" (the in21k one does) and that it lacks "encoder_stride" (newer ViTConfig
# dumps have it; tfjax ignores both either way). The released id2label holds the 1000 ImageNet-1k
# class names ("0": "tench, Tinca tinca", ...); only their number reaches the model (the
# classifier's rows), so they are numbered placeholders here.
_LABELS = {str(i): f"imagenet-1k class {i}" for i in range(1000)}
VIT_FIELDS = {
    "_name_or_path": "google/vit-base-patch16-224",
    "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 768, "id2label": _LABELS,
    "image_size": 224, "initializer_range": 0.02, "intermediate_size": 3072,
    "label2id": {v: int(k) for k, v in _LABELS.items()}, "layer_norm_eps": 1e-12,
    "model_type": "vit", "num_attention_heads": 12, "num_channels": 3, "num_hidden_layers": 12,
    "patch_size": 16, "qkv_bias": True, "transformers_version": "4.13.0.dev0"}


def _tower(fields):
  """A CLIP tower as written by transformers 4.16: every PretrainedConfig field dumped."""
  return {
      "_name_or_path": "", "add_cross_attention": False, "architectures": None,
      "attention_dropout": 0.0, "bad_words_ids": None, "chunk_size_feed_forward": 0,
      "cross_attention_hidden_size": None, "decoder_start_token_id": None,
      "diversity_penalty": 0.0, "do_sample": False, "dropout": 0.0, "early_stopping": False,
      "encoder_no_repeat_ngram_size": 0, "finetuning_task": None, "forced_bos_token_id": None,
      "forced_eos_token_id": None, "hidden_act": "quick_gelu",
      "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_factor": 1.0,
      "initializer_range": 0.02, "is_decoder": False, "is_encoder_decoder": False,
      "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "layer_norm_eps": 1e-05, "length_penalty": 1.0,
      "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 0, "num_beam_groups": 1,
      "num_beams": 1, "num_return_sequences": 1, "output_attentions": False,
      "output_hidden_states": False, "output_scores": False, "prefix": None,
      "projection_dim": 512, "problem_type": None, "pruned_heads": {},
      "remove_invalid_values": False, "repetition_penalty": 1.0, "return_dict": True,
      "return_dict_in_generate": False, "sep_token_id": None, "task_specific_params": None,
      "temperature": 1.0, "tie_encoder_decoder": False, "tie_word_embeddings": True,
      "tokenizer_class": None, "top_k": 50, "top_p": 1.0, "torch_dtype": None,
      "torchscript": False, "transformers_version": "4.16.0.dev0", "use_bfloat16": False,
      **fields}


# openai/clip-vit-base-patch32 config.json, checked field by field against the copy in
# whaler404/Hf-Learn transformers_learn/api/models/multimodal_models/clip/clip.md (it agrees).
# eos_token_id 2 is the pre-#24773 value: transformers pools the text at the largest token id.
CLIP_FIELDS = {
    "_name_or_path": "openai/clip-vit-base-patch32", "architectures": ["CLIPModel"],
    "initializer_factor": 1.0, "logit_scale_init_value": 2.6592, "model_type": "clip",
    "projection_dim": 512,
    "text_config": _tower({
        "bos_token_id": 0, "eos_token_id": 2, "hidden_size": 512, "intermediate_size": 2048,
        "max_position_embeddings": 77, "model_type": "clip_text_model", "num_attention_heads": 8,
        "num_hidden_layers": 12, "pad_token_id": 1, "vocab_size": 49408}),
    "text_config_dict": None, "transformers_version": None,
    "vision_config": _tower({
        "bos_token_id": None, "eos_token_id": None, "hidden_size": 768, "image_size": 224,
        "intermediate_size": 3072, "model_type": "clip_vision_model", "num_attention_heads": 12,
        "num_hidden_layers": 12, "pad_token_id": None, "patch_size": 32}),
    "vision_config_dict": None}

# openai/whisper-tiny config.json (transformers 4.27.0.dev0). Checked: the sizes and token ids
# against several trimmed copies in public code and a note that read the hub's files (sizes,
# forced_decoder_ids, begin_suppress_tokens [220, 50257], a 1,983-byte config.json); the field
# set against openai/whisper-small's config.json of the same version (the same keys); this set
# written as save_pretrained does (indent 2, sorted) is 1,983 bytes. That note counts 87
# suppress_tokens; the list below (88, as in whisper's generation_config.json and as whisper-small's
# config.json without 50358/50359) is the one that gives the 1,983 bytes. Unconfirmed: the list's
# exact tail.
SUPPRESS = [
    1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 359,
    503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246, 3253, 3268,
    3536, 3846, 3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929, 11938, 12033,
    12331, 12562, 13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362, 18956, 20075, 21675,
    22520, 26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470, 36865, 42863, 47425, 49870,
    50254, 50258, 50358, 50359, 50360, 50361, 50362]
WHISPER_FIELDS = {
    "_name_or_path": "openai/whisper-tiny", "activation_dropout": 0.0,
    "activation_function": "gelu", "architectures": ["WhisperForConditionalGeneration"],
    "attention_dropout": 0.0, "begin_suppress_tokens": [220, 50257], "bos_token_id": 50257,
    "d_model": 384, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536,
    "decoder_layerdrop": 0.0, "decoder_layers": 4, "decoder_start_token_id": 50258,
    "dropout": 0.0, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
    "encoder_layerdrop": 0.0, "encoder_layers": 4, "eos_token_id": 50257,
    "forced_decoder_ids": [[1, 50259], [2, 50359], [3, 50363]], "init_std": 0.02,
    "is_encoder_decoder": True, "max_length": 448, "max_source_positions": 1500,
    "max_target_positions": 448, "model_type": "whisper", "num_hidden_layers": 4,
    "num_mel_bins": 80, "pad_token_id": 50257, "scale_embedding": False,
    "suppress_tokens": SUPPRESS, "torch_dtype": "float32",
    "transformers_version": "4.27.0.dev0", "use_cache": True, "vocab_size": 51865}

# name -> (released fields, size cuts (nested dicts update the tower), transformers class)
_TOWER = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2,
              projection_dim=16)
RELEASED = {
    VIT: (VIT_FIELDS, dict(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                           num_hidden_layers=2), T.ViTForImageClassification),
    CLIP: (CLIP_FIELDS, dict(projection_dim=16, text_config=_TOWER,
                             vision_config=dict(_TOWER, hidden_size=24, intermediate_size=40)),
           T.CLIPModel),
    # max_source_positions 16: 32 input frames instead of Whisper's 3000 (30 s of audio).
    WHISPER: (WHISPER_FIELDS, dict(d_model=32, encoder_layers=2, decoder_layers=2,
                                   num_hidden_layers=2, encoder_attention_heads=4,
                                   decoder_attention_heads=2, encoder_ffn_dim=48,
                                   decoder_ffn_dim=40, max_source_positions=16),
              T.WhisperForConditionalGeneration),
}
# Not moved by the perturbation: CLIP's temperature (exp of it scales every logit) and Whisper's
# sinusoid table (import checks it is the formula's).
FIXED = ("logit_scale", "model.encoder.embed_positions.weight")
# The output layers (ViT's classifier, Whisper's token embedding, tied to its output layer) move
# by N(0, 0.1^2): float32's error is relative, and at 0.3 the largest of Whisper's 2 x 9 x 51865
# logits is about 10 (ViT's 2 x 1000: about 6), where summation-order differences between the two
# float32 programs reach 1-1.5e-5 (10-15 ulp); at 0.1 the largest logits are about 3.
SCALE = {"model.decoder.embed_tokens.weight": 0.1, "classifier.weight": 0.1}


def released_fields(name, **changes) -> dict:
  """The released fields with the size cuts, then `changes`; a dict value updates a tower."""
  fields, sizes, _ = RELEASED[name]
  out = copy.deepcopy(fields)
  for key, value in {**sizes, **changes}.items():
    out[key] = {**out[key], **value} if isinstance(value, dict) else value
  return out


def released_dir(path, name, edit=None, **changes):
  """(the random transformers model with every weight moved by N(0, 0.3^2) (SCALE), its directory
  holding the released config.json); `edit(model)` changes weights before saving."""
  fields = released_fields(name, **changes)
  config = T.AutoConfig.for_model(**copy.deepcopy(fields))  # it edits nested dicts in place
  torch.manual_seed(0)
  model = RELEASED[name][2](config)
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():  # HF's init leaves LayerNorms at identity and biases at zero
    for param_name, p in model.named_parameters():
      if param_name not in FIXED:
        p.add_(torch.randn(p.shape, generator=gen) * SCALE.get(param_name, 0.3))
    if edit is not None:
      edit(model)
  model.eval()
  model.save_pretrained(str(path))
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(fields, f)
  return model, str(path)


@pytest.fixture(scope="module", params=[VIT, CLIP, WHISPER])
def imported(request, tmp_path_factory):
  name = request.param
  model, path = released_dir(tmp_path_factory.mktemp("released") / "hf", name)
  cfg, params = modalities.load(path)
  return name, model, cfg, params


def clip_inputs():
  """Images and token rows as CLIP's tokenizer writes them: <|startoftext|> 49406, BPE ids,
  <|endoftext|> 49407 (the largest id, where the released eos_token_id=2 pools), then the
  released pad_token_id 1."""
  rng = np.random.default_rng(1)
  images = rng.normal(size=(4, 224, 224, 3)).astype(np.float32)
  ids = rng.integers(256, 49406, size=(4, 12))
  ids[:, 0] = 49406
  for b, end in enumerate((3, 11, 6, 8)):
    ids[b, end], ids[b, end + 1:] = 49407, 1
  return images, ids


def whisper_prompt(fields, batch):
  """decoder_start_token_id then forced_decoder_ids' tokens: the prompt generate starts from."""
  ids = [fields["decoder_start_token_id"]] + [t for _, t in fields["forced_decoder_ids"]]
  return np.array([ids] * batch, np.int32)


def _inputs(name) -> tuple:
  if name == VIT:
    return (vit_tests.images(batch=2, size=224),)
  if name == CLIP:
    return clip_inputs()
  x = np.random.default_rng(1).normal(size=(2, 32, 80)).astype(np.float32)
  return x, np.concatenate([whisper_prompt(WHISPER_FIELDS, 2),
                            np.random.default_rng(2).integers(0, 50257, size=(2, 5))], axis=1)


CLIP_KEYS = ("image_embeds", "text_embeds", "logits_per_image")


def hf_outputs(name, model) -> dict:
  inputs = _inputs(name)
  if name == VIT:
    return {"logits": vit_tests.hf_logits(model, *inputs)}
  if name == CLIP:
    want = clip_tests.hf_outputs(model, *inputs)
    return {k: getattr(want, k).numpy() for k in CLIP_KEYS}
  x, ids = inputs
  with torch.no_grad():
    return {"logits": model(input_features=whisper_tests.hf_features(x),
                            decoder_input_ids=torch.from_numpy(ids)).logits.numpy()}


def tfjax_outputs(name, cfg, params) -> dict:
  inputs = [a.astype(np.int32) if a.dtype.kind == "i" else a for a in _inputs(name)]
  got = jax.jit(modalities.model(cfg).apply)({"params": params}, *inputs)
  if name == CLIP:
    return {k: np.asarray(got[k]) for k in CLIP_KEYS}
  return {"logits": np.asarray(got["logits"] if name == VIT else got)}


def test_released_config_outputs_match_transformers(imported):
  name, model, cfg, params = imported
  want, got = hf_outputs(name, model), tfjax_outputs(name, cfg, params)
  for key in want:
    assert np.abs(want[key]).max() > 0.1, key  # not a degenerate comparison
    np.testing.assert_allclose(got[key], want[key], atol=ATOL, rtol=0, err_msg=f"{name} {key}")


def test_released_config_export_round_trip(imported, tmp_path):
  """export -> transformers' from_pretrained: the same tensors and the same outputs."""
  name, model, cfg, params = imported
  config = modalities.export(cfg, params, str(tmp_path / "out"))
  assert config["architectures"] == [RELEASED[name][2].__name__]
  back = RELEASED[name][2].from_pretrained(str(tmp_path / "out")).eval()
  want, got = model.state_dict(), back.state_dict()
  assert set(want) == set(got)
  for key in want:  # Whisper's sinusoids are recomputed in float32 on export
    np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), atol=1e-6, rtol=0,
                               err_msg=key)
  want, got = hf_outputs(name, model), hf_outputs(name, back)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], atol=ATOL, rtol=0, err_msg=f"{name} {key}")


def test_every_released_config_is_read():
  """At the released sizes: every field mapped, checked or ignored, none refused, and the
  model tfjax builds has the released dimensions."""
  vit = modalities.family("vit").config_from_hf(
      Fields(VIT_FIELDS, "vit", modalities.family("vit").IGNORED), {"classifier.weight"})
  assert (vit.d_model, vit.num_layers, vit.num_heads, vit.num_patches, vit.num_classes,
          vit.norm_eps) == (768, 12, 12, 196, 1000, 1e-12)
  clip = modalities.family("clip").config_from_hf(
      Fields(CLIP_FIELDS, "clip", modalities.family("clip").IGNORED), set())
  assert (clip.text.d_model, clip.text.num_heads, clip.text.eos_id, clip.text.vocab_size,
          clip.vision.d_model, clip.vision.patch_size, clip.projection_dim) == (
              512, 8, 2, 49408, 768, 32, 512)
  whisper = modalities.family("whisper").config_from_hf(
      Fields(WHISPER_FIELDS, "whisper", modalities.family("whisper").IGNORED), set())
  assert (whisper.d_model, whisper.encoder_layers, whisper.decoder_heads, whisper.num_frames,
          whisper.vocab_size, whisper.decoder_start_id, whisper.eos_id) == (
              384, 4, 6, 3000, 51865, 50258, 50257)
  for name, (fields, _, _) in RELEASED.items():
    module = modalities.family(fields["model_type"])
    reader = Fields(fields, module.MODEL_TYPE, module.IGNORED)
    module.config_from_hf(reader, set())
    reader.finish()  # raises naming any field left unread
    assert name


# (released field set, a change to the math) -> refused by that field's name.
MATH_FIELDS = [(VIT, {"hidden_act": "silu"}), (VIT, {"image_size": [224, 160]}),
               (VIT, {"some_future_switch": True}),
               (CLIP, {"text_config": {"is_decoder": True}}),
               (CLIP, {"text_config": {"add_cross_attention": True}}),
               (CLIP, {"vision_config": {"hidden_act": "gelu_fast"}}),
               (CLIP, {"vision_config": {"patch_size": [32, 16]}}),
               (CLIP, {"text_config": {"some_future_switch": True}}),
               (WHISPER, {"scale_embedding": True}), (WHISPER, {"tie_word_embeddings": False}),
               (WHISPER, {"activation_function": "silu"})]


@pytest.mark.parametrize("name,change", MATH_FIELDS)
def test_math_changing_field_is_refused_by_name(name, change):
  fields = copy.deepcopy(RELEASED[name][0])
  (key, value), = change.items()
  if isinstance(value, dict):
    fields[key].update(value)
    (key,) = value
  else:
    fields[key] = value
  module = modalities.family(fields["model_type"])
  reader = Fields(fields, module.MODEL_TYPE, module.IGNORED)
  with pytest.raises(UnsupportedError, match=key):
    module.config_from_hf(reader, {"classifier.weight"})
    reader.finish()


def test_square_sizes_as_lists_read():
  """transformers takes image_size and patch_size as an int or [h, w]; square lists read as the
  int (non-square ones are refused, MATH_FIELDS)."""
  for name, tower in ((VIT, None), (CLIP, "vision_config")):
    fields = copy.deepcopy(RELEASED[name][0])
    sizes = fields[tower] if tower else fields
    patch = sizes["patch_size"]
    sizes.update(image_size=[224, 224], patch_size=[patch, patch])
    module = modalities.family(fields["model_type"])
    cfg = module.config_from_hf(Fields(fields, module.MODEL_TYPE, module.IGNORED), set())
    vision = cfg.vision if tower else cfg
    assert (vision.image_size, vision.patch_size) == (224, patch)


def test_absent_token_ids_take_transformers_defaults():
  """A config without the token ids (hand-written ones) gets transformers' defaults: CLIP's text
  eos_token_id decides the pooling rule (2: the largest id, else the first EOS)."""
  fields = copy.deepcopy(CLIP_FIELDS)
  del fields["text_config"]["eos_token_id"]
  clip = modalities.family("clip").config_from_hf(Fields(fields, "clip"), set())
  assert clip.text.eos_id == T.CLIPTextConfig().eos_token_id == 49407
  fields = {k: v for k, v in WHISPER_FIELDS.items()
            if k not in ("eos_token_id", "pad_token_id", "decoder_start_token_id")}
  whisper = modalities.family("whisper").config_from_hf(
      Fields(fields, "whisper", modalities.family("whisper").IGNORED), set())
  want = T.WhisperConfig()
  assert (whisper.eos_id, whisper.pad_id, whisper.decoder_start_id) == (
      want.eos_token_id, want.pad_token_id, want.decoder_start_token_id)


def _masked_greedy(cfg, params, x, prompt, steps):
  """Greedy decoding over tfjax's logits with the released suppress_tokens masked at every step
  and begin_suppress_tokens at the first generated one (transformers' SuppressTokens and
  SuppressTokensAtBegin processors); finished rows continue with pad_token_id. The decoder runs
  over a fixed-length buffer (one compiled program; the causal mask hides the placeholders)."""
  model = audio.Whisper(cfg)
  encoded = model.apply({"params": params}, x, method=audio.Whisper.encode)
  decode = jax.jit(lambda tokens: model.apply({"params": params}, encoded, tokens,
                                              method=audio.Whisper.decode))
  start = prompt.shape[1]
  tokens = np.concatenate([prompt, np.zeros((len(x), steps), np.int32)], axis=1)
  done = np.zeros(len(x), bool)
  for t in range(start, start + steps):
    logits = np.array(decode(tokens)[:, t - 1])
    logits[:, WHISPER_FIELDS["suppress_tokens"]] = -np.inf
    if t == start:
      logits[:, WHISPER_FIELDS["begin_suppress_tokens"]] = -np.inf
    tokens[:, t] = np.where(done, WHISPER_FIELDS["pad_token_id"], logits.argmax(-1))
    done |= tokens[:, t] == WHISPER_FIELDS["eos_token_id"]
  return tokens


def test_whisper_greedy_decoding_equals_transformers_generate(tmp_path):
  """From the released prompt (decoder_start_token_id then forced_decoder_ids, which generate
  reads from the config): tfjax's greedy_decode gives generate's tokens with the suppress lists
  off, and with the released lists passed (suppress_tokens, begin_suppress_tokens) generate's
  tokens with every released generation field, as does a NumPy-masked greedy loop over tfjax's
  logits written in this test. The suppressed tokens' embedding rows (tied to the output layer) are scaled
  by 4 so that without the masks the argmax picks some of them: the masks change the tokens."""
  masked = sorted(set(SUPPRESS) | set(WHISPER_FIELDS["begin_suppress_tokens"]))

  def boost(model):
    model.model.decoder.embed_tokens.weight[masked] *= 4.0
  model, path = released_dir(tmp_path / "hf", WHISPER, edit=boost)
  cfg, params = modalities.load(path)
  x = np.random.default_rng(7).normal(size=(3, 32, 80)).astype(np.float32)
  prompt, steps = whisper_prompt(WHISPER_FIELDS, 3), 6
  off = dict(suppress_tokens=None, begin_suppress_tokens=None)
  with torch.no_grad():
    want = {gen: model.generate(input_features=whisper_tests.hf_features(x),
                                max_new_tokens=steps, do_sample=False, num_beams=1,
                                **kwargs).numpy()
            for gen, kwargs in (("released", {}), ("unmasked", off))}
  got = np.asarray(audio.greedy_decode(cfg, params, x, steps, prompt))
  np.testing.assert_array_equal(got[:, :4], prompt)  # generate returns the new tokens only
  assert len(set(map(tuple, want["unmasked"]))) > 1  # rows differ: the encoder output is read
  np.testing.assert_array_equal(got[:, 4:4 + want["unmasked"].shape[1]], want["unmasked"])
  assert np.isin(got[:, 4:], SUPPRESS).any()  # without the masks a suppressed token wins
  reference = _masked_greedy(cfg, params, x, prompt, steps)
  assert not np.isin(reference[:, 4:], SUPPRESS).any()
  assert not np.isin(reference[:, 4], WHISPER_FIELDS["begin_suppress_tokens"]).any()
  np.testing.assert_array_equal(reference[:, 4:4 + want["released"].shape[1]], want["released"])
  # greedy_decode given the released lists: generate's tokens with every released field.
  got = np.asarray(audio.greedy_decode(
      cfg, params, x, steps, prompt, suppress_tokens=SUPPRESS,
      begin_suppress_tokens=WHISPER_FIELDS["begin_suppress_tokens"]))
  np.testing.assert_array_equal(got[:, 4:4 + want["released"].shape[1]], want["released"])
  with pytest.raises(ValueError, match="suppress_tokens .* are not token ids"):
    audio.greedy_decode(cfg, params, x, steps, prompt, suppress_tokens=[cfg.vocab_size])
