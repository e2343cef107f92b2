"""Prepared image and audio folders as task data (issue 58 item 3): data.name='image_folder' for
vit and clip, 'audio_folder' for whisper (tfjax/training/tasks/prepared_rows.py, captions.py).
Small generated folders; the tests check the wiring (the data contract, the held-out split fully
and only once, masking of padding rows, zero-shot and caption ids against NumPy, the error
lines, a few steps through experiments/train.py), not accuracy."""

import importlib.util
import json
import os
import wave

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tfjax.data import prepare_main
from tfjax.nn.clip import CLIP
from tfjax.training import tasks
from tfjax.training.tasks import captions, clip as clip_task, whisper as whisper_task
from run_helpers import REPO, read_metrics, run_cli

Image = pytest.importorskip("PIL.Image")
CLASSES = ("ant", "bee", "cat")
WORDS = ("one", "two", "three")


def _config_file(name, path):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("test")
  config.data.path = str(path)
  if name == "vit_digits":
    config.model.num_classes = len(CLASSES)
  return config


def _prepare(argv):
  prepare_main.main([str(a) for a in argv] + ["--progress=false"])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
  """A prepared 8x8 grayscale folder: 3 classes x 5 train, x 3 held-out images, each class a
  different mean brightness."""
  root = tmp_path_factory.mktemp("images")
  rng = np.random.default_rng(0)
  for split, count in (("train", 5), ("test", 3)):
    for label, name in enumerate(CLASSES):
      os.makedirs(root / split / name)
      for i in range(count):
        pixels = np.clip(rng.normal(60 + 70 * label, 20, (8, 8)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(root / split / name / f"{i}.png")
  _prepare([f"--input=images:{root / 'train'}", f"--val_input=images:{root / 'test'}",
            "--image_size=8", "--image_mode=L", f"--output={root / 'prepared'}"])
  return root / "prepared"


def _write_wav(path, samples):
  with wave.open(str(path), "wb") as f:
    f.setnchannels(1)
    f.setsampwidth(2)
    f.setframerate(16000)
    f.writeframes(np.asarray(samples, "<i2").tobytes())


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
  """A prepared audio folder (2 s windows, 80 mels, char tokens): 6 train and 3 held-out clips of
  'one' / 'two three' / ... as tones, one pitch per word."""
  root = tmp_path_factory.mktemp("audio")
  t = np.arange(4000) / 16000
  for split, count in (("train", 6), ("test", 3)):
    os.makedirs(root / split)
    for i in range(count):
      words = [WORDS[(i + k) % 3] for k in range(1 + i % 2)]
      tone = np.concatenate([0.3 * np.sin(2 * np.pi * (300 + 200 * WORDS.index(w)) * t)
                             for w in words])
      _write_wav(root / split / f"c{i}.wav", np.round(tone * 32767))
      (root / split / f"c{i}.txt").write_text(" ".join(words), encoding="utf-8")
  _prepare([f"--input=audio:{root / 'train'}", f"--val_input=audio:{root / 'test'}",
            "--tokenizer=char", "--chunk_seconds=2", f"--output={root / 'prepared'}"])
  return root / "prepared"


def _whisper_config(path):
  config = _config_file("whisper_spoken_digits", path)
  config.model.update(max_source_positions=100, vocab_size=3 + 11)  # 2 s; ' enorthw' + ...
  return config


# --- the data contract -------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["vit", "clip"])
def test_image_rows_follow_the_data_contract(images, task):
  config = _config_file(f"{task}_digits", images)
  dataset = tasks.get_task(task).make_dataset(config)
  # Row r of batch i depends on (seed, i, r) only: a process's rows equal the global batch's.
  whole = dataset.train_batch(3, 6)
  part = dataset.train_batch(3, 6, row_start=2, row_count=3)
  for key in whole:
    np.testing.assert_array_equal(part[key], whole[key][2:5])
  # An epoch (15 rows here) visits every training image once.
  epoch = np.concatenate([dataset.train_batch(i, 5)["images"] for i in range(3)])
  every = dataset.train.pixels(np.arange(15)).astype(np.float32) / 127.5 - 1
  assert sorted(map(bytes, epoch)) == sorted(map(bytes, every))
  # Evaluation: the 9 held-out images once each with weight 1, the padding with weight 0.
  batches = [b for _, b in dataset.eval_batches(4, 10)]
  assert len(batches) == 3  # ceil(9 / 4): never more batches than the split fills
  weights = np.concatenate([b["weights"] for b in batches])
  np.testing.assert_array_equal(weights, [1] * 9 + [0] * 3)
  labels = np.concatenate([b["labels"] for b in batches])[:9]
  assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
  assert labels.tolist() != sorted(labels.tolist())  # a fixed shuffle, not class by class


def test_audio_rows_hold_the_transcripts_shifted_by_three(audio):
  dataset = tasks.get_task("whisper").make_dataset(_whisper_config(audio))
  batch = dataset.train_batch(0, 6)
  assert batch["features"].shape == (6, 200, 80)
  from tfjax.data.tokenizers import load_tokenizer
  tokenizer = load_tokenizer(str(audio))
  texts = whisper_task.transcripts(batch["decoder_inputs"], tokenizer)  # SOT, ids + 3, padding
  assert sorted(texts) == sorted(dataset.train.text(i) for i in range(6))
  for row in range(6):
    ids = tokenizer.encode(texts[row]) + 3
    n = len(ids)
    np.testing.assert_array_equal(batch["decoder_inputs"][row, :n + 1], [1, *ids])
    np.testing.assert_array_equal(batch["targets"][row, :n + 1], [*ids, 2])
    np.testing.assert_array_equal(batch["weights"][row], [1] * (n + 1) + [0] * (48 - n - 1))
  last = dataset.eval_batches(2, 5)[-1][1]  # 3 clips in batches of 2: one padding row
  assert last["weights"][1].sum() == 0 and last["weights"][0].sum() > 0


def test_transcripts_stop_at_the_first_end():
  class Chars:
    def decode(self, ids):
      return "".join(" abc"[i] for i in ids)
  rows = np.array([[1, 4, 5, 3, 6, 2, 4, 4], [1, 6, 6, 6, 6, 6, 6, 6], [1, 2, 2, 2, 2, 2, 2, 2]])
  assert whisper_task.transcripts(rows, Chars()) == ["ab c", "ccccccc", ""]


# --- CLIP: captions, padding rows, zero-shot ---------------------------------------------------


def test_caption_ids_are_the_template_words():
  vocab = captions.CaptionVocabulary(["a photo of {name}", "{name} seen"], ["ant", "bee"], 5)
  # sorted words: a ant bee of photo seen -> ids 2..7; EOS 1, padding 0
  np.testing.assert_array_equal(vocab.captions_CxTxL[0], [[2, 6, 5, 3, 1], [3, 7, 1, 0, 0]])
  np.testing.assert_array_equal(vocab.caption_ids([1, 0], [1, 0]), [[4, 7, 1, 0, 0],
                                                                    [2, 6, 5, 3, 1]])
  assert vocab.decode([2, 6, 5, 4, 1, 0]) == "a photo of bee"
  with pytest.raises(ValueError, match="exactly one {name} slot"):
    captions.CaptionVocabulary(["a photo"], ["ant"], 5)
  with pytest.raises(ValueError, match="model.text.max_len=3"):
    captions.CaptionVocabulary(["a photo of {name}"], ["ant"], 3)


def test_clip_padding_rows_change_nothing_and_zero_shot_is_the_nearest_class(images):
  config = _config_file("clip_digits", images)
  task = tasks.get_task("clip")
  cfg = task.model_config(config)
  dataset = task.make_dataset(config)
  model = task.build_model(cfg)
  batch = dataset.eval_batches(12, 1)[0][1]  # 9 real rows, 3 of padding
  params = jax.tree.map(lambda x: getattr(x, "value", x), model.init(
      jax.random.PRNGKey(1), batch["images"], batch["token_ids"])["params"],
      is_leaf=lambda x: hasattr(x, "value"))
  padded = task.forward(model, params, {k: jnp.asarray(v) for k, v in batch.items()})
  real = {k: jnp.asarray(v[:9]) for k, v in batch.items()}
  alone = task.forward(model, params, real)
  for key in ("loss_sum", "weight_sum", "correct_sum", "class_correct_sum",
              "zero_shot_correct_sum"):
    np.testing.assert_allclose(padded[key], alone[key], rtol=1e-5, err_msg=key)
  assert float(padded["weight_sum"]) == 9
  # Zero-shot in NumPy: the mean of each class's unit template embeddings, renormalized, nearest.
  out = model.apply({"params": params}, batch["images"][:9], batch["token_ids"][:9])
  ids = dataset.vocabulary.captions_CxTxL
  text = np.asarray(model.apply({"params": params}, ids.reshape(-1, ids.shape[-1]),
                                method=CLIP.encode_text)).reshape(ids.shape[0], ids.shape[1], -1)
  mean = text.mean(1)
  mean /= np.linalg.norm(mean, axis=-1, keepdims=True)
  expected = np.argmax(np.asarray(out["image_embeds"]) @ mean.T, -1)
  np.testing.assert_array_equal(clip_task.zero_shot_predictions(
      model, params, out["image_embeds"], jnp.asarray(ids)), expected)
  assert float(alone["zero_shot_correct_sum"]) == (expected == batch["labels"][:9]).sum()


# --- through experiments/train.py --------------------------------------------------------------


@pytest.mark.parametrize("config_file,data,metric", [
    ("vit_digits", "images", "eval/accuracy"),
    ("clip_digits", "images", "eval/zero_shot_accuracy"),
    ("whisper_spoken_digits", "audio", "eval/exact_match")])
def test_trains_through_the_main_loop(tmp_path, request, config_file, data, metric):
  path = request.getfixturevalue(data)
  extra = {"vit_digits": ["--config.model.num_classes=3"], "clip_digits": [],
           "whisper_spoken_digits": ["--config.model.max_source_positions=100",
                                     "--config.model.vocab_size=14"]}[config_file]
  result = run_cli([f"--config={os.path.join(REPO, 'configs', config_file)}.py:test",
                    f"--workdir={tmp_path / 'run'}", f"--config.data.path={path}", *extra],
                   tmp_path, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = read_metrics(tmp_path / "run")
  evals = [row for row in rows if metric in row]
  assert [row["step"] for row in evals] == [0, 4]  # at init and at the end
  assert all(0 <= row[metric] <= 1 for row in evals)
  assert os.path.isdir(tmp_path / "run" / "checkpoints")
  with open(tmp_path / "run" / "config.json") as f:
    assert json.load(f)["data"]["path"] == str(path)


# --- one-line errors ---------------------------------------------------------------------------


def _error(config, task):
  with pytest.raises(ValueError) as e:
    tasks.get_task(task).make_dataset(config)
  message = str(e.value)
  assert "\n" not in message
  return message


def test_wrong_or_missing_folders_are_one_clear_line(images, audio, tmp_path):
  config = _config_file("vit_digits", images)
  config.data.path = ""
  assert "set data.path=DIR" in _error(config, "vit")
  config.data.path = str(tmp_path / "nowhere")
  assert "no such prepared directory" in _error(config, "vit")
  config.data.path = str(audio)
  assert "holds prepared audio examples, not image" in _error(config, "vit")
  config = _whisper_config(images)
  assert "holds prepared image examples, not audio" in _error(config, "whisper")
  config = _config_file("vit_digits", images)
  config.model.num_classes = 10
  assert "set model.num_classes=3" in _error(config, "vit")
  config.model.update(num_classes=3, image_size=16, patch_size=4)
  assert "set config.model.image_size=8 and channels=1" in _error(config, "vit")
  config = _config_file("clip_digits", images)
  config.model.text.vocab_size = 8
  assert "raise it" in _error(config, "clip")
  config = _whisper_config(audio)
  config.model.max_source_positions = 10
  assert "max_source_positions=10 hears 20: set it to at least" in _error(config, "whisper")
  config.model.max_source_positions = 160
  assert "the prepared clips have 200" in _error(config, "whisper")
  config = _whisper_config(audio)
  config.model.vocab_size = 5
  assert "set model.vocab_size=11" in _error(config, "whisper")
  config = _whisper_config(audio)
  config.model.max_target_positions = 4
  assert "max_target_positions >= " in _error(config, "whisper")


def test_train_cli_on_a_folder_of_the_other_kind_is_one_error_line(audio, tmp_path):
  result = run_cli([f"--config={os.path.join(REPO, 'configs', 'vit_digits.py')}",
                    f"--workdir={tmp_path / 'run'}", f"--config.data.path={audio}"], tmp_path)
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "holds prepared audio examples, not image" in errors[0], result.stderr
  assert "Traceback" not in result.stderr
  assert not os.path.exists(tmp_path / "run")  # nothing written
