"""An audio folder: WAV clips, each with its transcript beside it.

    DIR/.../NAME.wav   16-bit PCM, mono, 16 kHz (what Whisper hears)
    DIR/.../NAME.txt   its words, UTF-8 (surrounding whitespace and line breaks become one space)

Subfolders are searched; clips are taken in sorted path order, so the example order (and the
validation split drawn from it) is the same on every run. WAVs are read with the standard
library's `wave` module: other sample widths, channel counts or rates are refused with the
ffmpeg / sox command that converts them (resampling here would silently change the audio).
"""

from __future__ import annotations

import os
import wave

import numpy as np

from tfjax.data import log_mel

WAV_SUFFIX = ".wav"
TRANSCRIPT_SUFFIX = ".txt"


def _convert_hint(path: str) -> str:
  return (f"convert it: ffmpeg -i {path} -ac 1 -ar {log_mel.SAMPLING_RATE} -c:a pcm_s16le "
          f"OUT.wav (or sox {path} -b 16 -c 1 -r {log_mel.SAMPLING_RATE} OUT.wav)")


def find_clips(directory: str) -> list[tuple[str, str]]:
  """[(wav path, transcript path)] of `directory`, sorted by path; one-line errors for an empty
  folder or a clip without its transcript."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"--input=audio:{directory}: no such directory")
  clips = []
  for root, dirs, files in os.walk(directory):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(files):
      if name.lower().endswith(WAV_SUFFIX) and not name.startswith("."):
        wav = os.path.join(root, name)
        clips.append((wav, os.path.splitext(wav)[0] + TRANSCRIPT_SUFFIX))
  clips.sort()
  if not clips:
    raise ValueError(f"--input=audio:{directory} holds no .wav file (an audio folder holds "
                     f"NAME.wav clips, each with its transcript NAME.txt beside it)")
  for wav, transcript in clips:
    if not os.path.isfile(transcript):
      raise ValueError(f"{wav}: no transcript {transcript} beside it (each clip needs NAME.txt "
                       "holding its words)")
  return clips


def read_transcript(path: str) -> str:
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: the transcript is not UTF-8 ({e.reason} at byte {e.start}); "
                     "save it as UTF-8") from None
  return " ".join(text.split())


def read_wav(path: str) -> np.ndarray:
  """float32 samples in [-1, 1) (int16 / 32768, as soundfile and librosa read them) of a 16-bit
  PCM mono 16 kHz WAV; one-line errors naming the conversion for anything else."""
  try:
    with wave.open(path, "rb") as f:
      width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
      raw = f.readframes(f.getnframes())
  except (wave.Error, EOFError) as e:
    raise ValueError(f"{path}: not a PCM WAV file the `wave` module reads ({e}); "
                     f"{_convert_hint(path)}") from None
  if width != 2:
    raise ValueError(f"{path}: {8 * width}-bit samples; tfjax-prepare reads 16-bit PCM: "
                     f"{_convert_hint(path)}")
  if channels != 1:
    raise ValueError(f"{path}: {channels} channels; tfjax-prepare reads mono: "
                     f"{_convert_hint(path)}")
  if rate != log_mel.SAMPLING_RATE:
    raise ValueError(f"{path}: sampled at {rate} Hz; Whisper's features are made at "
                     f"{log_mel.SAMPLING_RATE} Hz: {_convert_hint(path)}")
  return (np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0)
