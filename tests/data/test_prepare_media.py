"""tfjax-prepare of image and audio folders (tfjax/data/prepare_media.py): the log-mel features
against transformers' WhisperFeatureExtractor, images pixel-exact, the shard format's checks and
resume, and the one-line errors. Every input is generated here (Pillow images, NumPy tones)."""

import itertools
import os
import wave

import numpy as np
import pytest

from tfjax.data import log_mel, media_shards, prepare_main, prepared_media
from tfjax.data import manifest as mf

Image = pytest.importorskip("PIL.Image")


def _write_wav(path, samples, rate=16000, width=2, channels=1):
  with wave.open(str(path), "wb") as f:
    f.setnchannels(channels)
    f.setsampwidth(width)
    f.setframerate(rate)
    f.writeframes(np.asarray(samples).tobytes())


def _clip(seconds, freq, seed):
  """int16 tone with a glide, an envelope and a little noise: speech-like in dynamic range."""
  rng = np.random.default_rng(seed)
  t = np.arange(int(seconds * 16000)) / 16000
  x = 0.4 * np.sin(2 * np.pi * (freq + 150 * t) * t) * np.exp(-t) + 0.01 * rng.standard_normal(
      len(t))
  return np.round(x * 32767).astype("<i2")


def _audio_folder(root, lengths=(0.4, 1.3, 2.9, 3.0, 3.7)):
  os.makedirs(root, exist_ok=True)
  for i, seconds in enumerate(lengths):
    _write_wav(root / f"c{i}.wav", _clip(seconds, 200 + 90 * i, i))
    (root / f"c{i}.txt").write_text(f" clip  {i}\nends \n", encoding="utf-8")
  return [_clip(s, 200 + 90 * i, i).astype(np.float32) / 32768 for i, s in enumerate(lengths)]


def _run(argv, capsys):
  """(exit code, stdout, stderr) of tfjax-prepare."""
  try:
    prepare_main.main([str(a) for a in argv] + ["--progress=false"])
    code = 0
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  return code, out, err


def _whisper_features(n_mels, chunk_seconds, monkeypatch):
  """(features by the extractor's NumPy path, by its torch path) -> [frames, n_mels] functions.
  The NumPy path (float64, taken where torch is not installed) is the math tfjax.data.log_mel
  writes; the torch path (float32 STFT) is what it runs by default here."""
  transformers = pytest.importorskip("transformers")
  from transformers.models.whisper import feature_extraction_whisper as fe_module
  extractor = transformers.WhisperFeatureExtractor(feature_size=n_mels, chunk_length=chunk_seconds)

  def run(audio, torch_installed):
    with monkeypatch.context() as m:
      if not torch_installed:
        m.setattr(fe_module, "is_torch_available", lambda: False)
      return extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0].T

  return lambda audio: run(audio, False), lambda audio: run(audio, True)


# --- log-mel math -------------------------------------------------------------------------------

@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_transformers(n_mels):
  audio_utils = pytest.importorskip("transformers.audio_utils")
  reference = audio_utils.mel_filter_bank(
      num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0, max_frequency=8000.0,
      sampling_rate=16000, norm="slaney", mel_scale="slaney")
  np.testing.assert_allclose(log_mel.mel_filters(n_mels), reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_mels,chunk_seconds", [(80, 30), (128, 3)])
def test_prepared_features_equal_whisper_feature_extractor(tmp_path, capsys, monkeypatch, n_mels,
                                                           chunk_seconds):
  """WAV files -> tfjax-prepare -> shards -> the reader's features, against
  WhisperFeatureExtractor on the same samples: within 1e-5 of its NumPy path for clips shorter
  than and as long as the chunk; and no further from its torch path (float32) than its own NumPy
  path is (measured: up to 4e-5, in the lowest mel bins of quiet frames)."""
  lengths = (0.4, 1.3, 2.9, 3.0) if chunk_seconds == 3 else (0.4, 1.3, 2.9, 3.0, 3.7)
  audio = _audio_folder(tmp_path / "clips", lengths)
  code, out, err = _run(["--input=audio:" + str(tmp_path / "clips"), "--tokenizer=byte",
                         f"--output={tmp_path / 'out'}", "--val_fraction=0.4", "--workers=1",
                         f"--n_mels={n_mels}", f"--chunk_seconds={chunk_seconds}"], capsys)
  assert code == 0, err
  assert "audio train" in out
  numpy_path, torch_path = _whisper_features(n_mels, chunk_seconds, monkeypatch)
  manifest = mf.read_manifest(str(tmp_path / "out"), "audio")
  seen = []
  for split in mf.SPLITS:
    data = prepared_media.open_split(str(tmp_path / "out"), split, kind="audio")
    for i in range(len(data)):
      index = int(data.text(i).split()[1])  # "clip N ends"
      seen.append(index)
      ours_TxM = data.features([i])[0]
      reference_TxM, torch_TxM = numpy_path(audio[index]), torch_path(audio[index])
      assert ours_TxM.shape == (chunk_seconds * 100, n_mels) == reference_TxM.shape
      np.testing.assert_allclose(ours_TxM, reference_TxM, rtol=0, atol=1e-5)
      assert (np.abs(ours_TxM - torch_TxM).max()
              <= np.abs(reference_TxM - torch_TxM).max() + 1e-6)
      assert data.text(i) == f"clip {index} ends"
      assert data.tokens(i).astype(np.uint8).tobytes() == f"clip {index} ends".encode()  # bytes
  assert sorted(seen) == list(range(len(lengths)))
  # The padding frames are not stored: a 0.4 s clip keeps ~40 + 2 of the frames.
  stored = sum(np.load(tmp_path / "out" / s["files"]["features"]).shape[0]
               for split in mf.SPLITS for s in manifest["splits"][split]["shards"])
  assert stored < 100 * sum(lengths) + 5 * len(lengths)


def test_silence_and_full_chunk_round_trip():
  """trim_padding + the reader's refill are exact: silence (every frame the floor), a clip that
  fills the chunk (nothing trimmed)."""
  for audio in (np.zeros(8000, np.float32), 0.1 * np.ones(16000 * 2, np.float32),
                np.random.default_rng(0).standard_normal(16000 * 2).astype(np.float32) * 0.1):
    full = log_mel.log_mel(audio, 80, chunk_seconds=2)
    kept, floor = media_shards.trim_padding(full)
    rebuilt = np.concatenate([kept, np.full((len(full) - len(kept), 80), floor, np.float32)])
    np.testing.assert_array_equal(rebuilt, full)


# --- images -------------------------------------------------------------------------------------

def _image_folder(root, sizes=((16, 16),) * 3, classes=("cat", "dog", "ant"), fmt="png",
                  mode="RGB"):
  rng = np.random.default_rng(0)
  pixels = {}
  for c in classes:
    os.makedirs(root / c, exist_ok=True)
    for i, (w, h) in enumerate(sizes):
      shape = (h, w, 3) if mode == "RGB" else (h, w)
      array = rng.integers(0, 256, shape, dtype=np.uint8)
      Image.fromarray(array, mode=mode).save(root / c / f"{i}.{fmt}")
      pixels[(c, i)] = array
  return pixels


def test_png_round_trip_pixel_exact_with_class_names(tmp_path, capsys):
  pixels = _image_folder(tmp_path / "train")
  _image_folder(tmp_path / "test", sizes=((16, 16),))
  (tmp_path / "train" / "cat" / "notes.md").write_text("not an image")
  code, out, err = _run([f"--input=images:{tmp_path / 'train'}",
                         f"--val_input=images:{tmp_path / 'test'}", "--image_size=16",
                         f"--output={tmp_path / 'out'}", "--workers=2", "--shard_mb=0.002"],
                        capsys)
  assert code == 0, err
  assert "3 classes, 16px RGB; skipped files: 1" in out
  manifest = mf.read_manifest(str(tmp_path / "out"), "image")
  assert manifest["class_names"] == ["ant", "cat", "dog"]  # sorted folder names -> label ids
  assert len(manifest["splits"]["train"]["shards"]) == 3  # 768 B a picture, 2 kB shards
  train = prepared_media.open_split(str(tmp_path / "out"), "train", kind="image")
  assert len(train) == 9
  # sorted classes, sorted files within each: row 3 * class + i
  for label, name in enumerate(["ant", "cat", "dog"]):
    for i in range(3):
      row = 3 * label + i
      np.testing.assert_array_equal(train.pixels([row])[0], pixels[(name, i)])
      assert train.labels([row])[0] == label
  val = prepared_media.open_split(str(tmp_path / "out"), "val", kind="image")
  assert len(val) == 3 and list(val.labels([0, 1, 2])) == [0, 1, 2]


def test_grayscale_crop_and_jpeg(tmp_path, capsys):
  """A 24 x 16 image at --image_size=16 is center-cropped without resampling (columns 4..20); a
  JPEG is decoded as Pillow decodes it; an 8 x 8 image is upsampled bicubically."""
  pixels = _image_folder(tmp_path / "gray", sizes=((24, 16), (16, 16)), classes=("a", "b"),
                         mode="L")
  code, _, err = _run([f"--input=images:{tmp_path / 'gray'}", "--image_size=16",
                       "--image_mode=L", f"--output={tmp_path / 'out'}", "--val_fraction=0.3",
                       "--workers=1"], capsys)
  assert code == 0, err
  got = {}
  for split in mf.SPLITS:
    data = prepared_media.open_split(str(tmp_path / "out"), split, kind="image")
    for i in range(len(data)):
      got.setdefault(int(data.labels([i])[0]), []).append(data.pixels([i])[0, :, :, 0])
  wide = pixels[("a", 0)]
  assert any(np.array_equal(p, wide[:, 4:20]) for p in got[0])
  assert any(np.array_equal(p, pixels[("a", 1)]) for p in got[0])

  _image_folder(tmp_path / "jpeg", sizes=((16, 16),), classes=("x", "y"), fmt="jpg")
  _image_folder(tmp_path / "jpeg_val", sizes=((8, 8),), classes=("x", "y"))
  code, _, err = _run([f"--input=images:{tmp_path / 'jpeg'}",
                       f"--val_input=images:{tmp_path / 'jpeg_val'}", "--image_size=16",
                       f"--output={tmp_path / 'out_jpeg'}", "--workers=1"], capsys)
  assert code == 0, err
  train = prepared_media.open_split(str(tmp_path / "out_jpeg"), "train", kind="image")
  with Image.open(tmp_path / "jpeg" / "y" / "0.jpg") as image:
    np.testing.assert_array_equal(train.pixels([1])[0], np.asarray(image.convert("RGB")))
  val = prepared_media.open_split(str(tmp_path / "out_jpeg"), "val", kind="image")
  with Image.open(tmp_path / "jpeg_val" / "x" / "0.png") as image:
    np.testing.assert_array_equal(val.pixels([0])[0], np.asarray(
        image.convert("RGB").resize((16, 16), Image.Resampling.BICUBIC)))


# --- the shard format: resume, checks, refusals ---------------------------------------------------

def test_killed_prepare_resumes_byte_identical(tmp_path, capsys, monkeypatch):
  _audio_folder(tmp_path / "clips")
  flags = [f"--input=audio:{tmp_path / 'clips'}", "--tokenizer=char", "--val_fraction=0.3",
           "--workers=1", "--shard_mb=0.05"]
  assert _run(flags + [f"--output={tmp_path / 'whole'}"], capsys)[0] == 0
  real, calls = media_shards.write_shard, []

  def dies_on_third(*args):
    calls.append(args)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return real(*args)

  monkeypatch.setattr(media_shards, "write_shard", dies_on_third)
  with pytest.raises(KeyboardInterrupt):
    _run(flags + [f"--output={tmp_path / 'killed'}"], capsys)
  assert not (tmp_path / "killed" / mf.MANIFEST).exists()
  monkeypatch.setattr(media_shards, "write_shard", real)
  assert _run(flags + [f"--output={tmp_path / 'killed'}"], capsys)[0] == 0
  whole, killed = sorted(os.listdir(tmp_path / "whole")), sorted(os.listdir(tmp_path / "killed"))
  assert whole == killed and len([n for n in whole if n.endswith(".features.npy")]) >= 3
  for name in whole:
    assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes()

  # A finished directory is never replaced without --overwrite; a text reader is told the kind.
  code, _, err = _run(flags + [f"--output={tmp_path / 'whole'}"], capsys)
  assert code == 2 and "already holds a finished prepare" in err
  with pytest.raises(ValueError, match="holds prepared audio examples, not text"):
    mf.read_manifest(str(tmp_path / "whole"))
  # A corrupted shard is named.
  manifest = mf.read_manifest(str(tmp_path / "whole"), "audio")
  victim = tmp_path / "whole" / manifest["splits"]["train"]["shards"][0]["files"]["features"]
  array = np.load(victim)
  array[0, 0] += 1
  np.save(victim, array)
  with pytest.raises(ValueError, match="checksum differs"):
    prepared_media.open_split(str(tmp_path / "whole"), "train", kind="audio")


def _outputs(tmp_path):
  """A fresh --output per call: a prepare refused while writing leaves its (resumable) start."""
  return (f"--output={tmp_path / f'out{i}'}" for i in itertools.count())


def _one_line_error(code, err, *needles):
  assert code == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), err
  for needle in needles:
    assert needle in lines[0], lines[0]


def test_image_folder_errors(tmp_path, capsys):
  outs = _outputs(tmp_path)
  (tmp_path / "empty").mkdir()
  _one_line_error(*_run([f"--input=images:{tmp_path / 'empty'}", next(outs)], capsys)[::2],
                  "holds no class subfolder", "one subfolder per class")
  _image_folder(tmp_path / "some")
  (tmp_path / "some" / "zebra").mkdir()
  (tmp_path / "some" / "zebra" / "readme.txt").write_text("x")
  _one_line_error(*_run([f"--input=images:{tmp_path / 'some'}", next(outs)], capsys)[::2],
                  "zebra: class folder holds no PNG/JPEG image")
  _image_folder(tmp_path / "bad")
  (tmp_path / "bad" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
  _one_line_error(*_run([f"--input=images:{tmp_path / 'bad'}", next(outs), "--val_fraction=0.3"],
                        capsys)[::2], "broken.png: not a readable image")
  _image_folder(tmp_path / "loose")
  Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "loose" / "stray.png")
  _one_line_error(*_run([f"--input=images:{tmp_path / 'loose'}", next(outs)], capsys)[::2],
                  "stray.png is not in a class folder")
  _image_folder(tmp_path / "other", classes=("cat", "emu"))
  _one_line_error(*_run([f"--input=images:{tmp_path / 'some_ok'}", next(outs)], capsys)[::2],
                  "no such directory")
  _image_folder(tmp_path / "ok")
  _one_line_error(*_run([f"--input=images:{tmp_path / 'ok'}",
                         f"--val_input=images:{tmp_path / 'other'}", next(outs)], capsys)[::2],
                  "differ from --input's", "same class subfolders")
  _one_line_error(*_run([f"--input=images:{tmp_path / 'ok'}", next(outs)], capsys)[::2],
                  "the val split got no example", "--val_input")
  # Refused before anything was written, except the unreadable image (found while writing).
  assert sorted(os.listdir(tmp_path)) == ["bad", "empty", "loose", "ok", "other", "out2", "some"]


def test_audio_folder_errors(tmp_path, capsys):
  outs = _outputs(tmp_path)
  flags = ["--tokenizer=byte", "--val_fraction=0.5"]
  (tmp_path / "empty").mkdir()
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'empty'}", next(outs)] + flags, capsys)[::2],
                  "holds no .wav file", "NAME.txt")
  _audio_folder(tmp_path / "a")
  os.remove(tmp_path / "a" / "c2.txt")
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'a'}", next(outs)] + flags, capsys)[::2],
                  "c2.wav: no transcript", "c2.txt")
  cases = {"width": dict(samples=np.zeros(800, np.uint8) + 128, width=1),
           "stereo": dict(samples=np.zeros(1600, "<i2"), channels=2),
           "rate": dict(samples=np.zeros(4410, "<i2"), rate=44100)}
  needles = {"width": "8-bit samples; tfjax-prepare reads 16-bit PCM",
             "stereo": "2 channels; tfjax-prepare reads mono",
             "rate": "sampled at 44100 Hz"}
  for name, case in cases.items():
    folder = tmp_path / name
    _audio_folder(folder)
    _write_wav(folder / "c1.wav", **case)
    _one_line_error(*_run([f"--input=audio:{folder}", "--workers=1", next(outs)] + flags, capsys)[::2],
                    "c1.wav: " + needles[name], "ffmpeg -i", "-ar 16000")
  _audio_folder(tmp_path / "long")
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'long'}", "--chunk_seconds=3",
                         "--workers=1", next(outs)] + flags, capsys)[::2],
                  "c4.wav: 3.70 s, longer than --chunk_seconds=3")
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'long'}", next(outs)], capsys)[::2],
                  "needs --tokenizer=")
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'long'}", "--n_mels=64", next(outs)] + flags,
                        capsys)[::2], "--n_mels=64", "80 or 128")
  _one_line_error(*_run([f"--input=audio:{tmp_path / 'long'}",
                         f"--val_input=images:{tmp_path / 'long'}", next(outs)] + flags, capsys)[::2],
                  "give the audio folder as audio:DIR")
  # text inputs still need a tokenizer, said in one line
  _one_line_error(*_run([f"--input={tmp_path / 'x.txt'}", next(outs)], capsys)[::2],
                  "required: --tokenizer")
