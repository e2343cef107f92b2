"""Spoken digit strings, synthesized offline with espeak-ng, as an audio folder for tfjax-prepare.

    apt-get install -y espeak-ng          # the Debian package (1.51 here); no network needed after
    pip install -e ".[vision]"            # scipy (through scikit-learn) for the resampling
    python experiments/make_spoken_digits.py --output=data/spoken_digits [--seed=0] \
        [--train_clips=1000] [--test_clips=200]
    tfjax-prepare --input=audio:data/spoken_digits/train --val_input=audio:data/spoken_digits/test \
        --tokenizer=char --output=data/spoken_digits_prepared

How each clip is made: a seeded NumPy generator (np.random.default_rng(seed)) draws, per clip,
1 to --max_digits digits (uniform length, uniform digits), one of the --voices (espeak-ng's own
formant voices, which ship in the package: American, British, Scottish and Caribbean English),
a speaking rate uniform in --rates words per minute and a pitch uniform in 30-70 (espeak-ng's
0-99 scale). The words ("three one four") are spoken by `espeak-ng -v VOICE -s RATE -p PITCH -w
FILE`, which writes 16-bit mono PCM at 22,050 Hz; the clip is resampled to 16 kHz (Whisper's rate)
with scipy.signal.resample_poly (320/441, its default Kaiser-windowed FIR) and written with the
`wave` module as 16-bit PCM. Its transcript, NAME.txt, holds the same words in lower case.
espeak-ng's synthesis is deterministic, so the same seed, flags and espeak-ng version give
byte-identical files; the folder's `about.json` records all of them.

Layout: OUTPUT/train/NNNNN.wav + NNNNN.txt (--train_clips), OUTPUT/test/... (--test_clips; drawn
after the training clips from the same generator, so the test strings are fresh draws, not a
subset). With the defaults: 1,000 + 200 clips of 1-7 digits, 0.5-3.6 s each (1,984 s in all, 68 MB;
espeak-ng 1.51, a minute on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import wave

import numpy as np

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-029")
ESPEAK_RATE = 22_050
TARGET_RATE = 16_000


def _espeak() -> str:
  path = shutil.which("espeak-ng")
  if path is None:
    sys.exit("error: espeak-ng is not installed; install it with `apt-get install -y espeak-ng` "
             "(Debian / Ubuntu)")
  return path


def synthesize(espeak: str, words: str, voice: str, rate: int, pitch: int) -> np.ndarray:
  """int16 samples at 16 kHz of espeak-ng speaking `words`."""
  from scipy import signal  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "clip.wav")
    subprocess.run([espeak, "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", path, words],
                   check=True, capture_output=True)
    with wave.open(path, "rb") as f:
      if (f.getframerate(), f.getsampwidth(), f.getnchannels()) != (ESPEAK_RATE, 2, 1):
        raise RuntimeError(f"espeak-ng wrote {f.getframerate()} Hz, {8 * f.getsampwidth()}-bit, "
                           f"{f.getnchannels()} channels; this script expects 22,050 Hz 16-bit "
                           "mono")
      samples = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float64)
  resampled = signal.resample_poly(samples, TARGET_RATE // 50, ESPEAK_RATE // 50)  # 320 / 441
  return np.clip(np.round(resampled), -32768, 32767).astype("<i2")


def write_wav(path: str, samples: np.ndarray) -> None:
  with wave.open(path, "wb") as f:
    f.setnchannels(1)
    f.setsampwidth(2)
    f.setframerate(TARGET_RATE)
    f.writeframes(samples.tobytes())


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--output", required=True, help="the folder to write (train/ and test/ inside)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--train_clips", type=int, default=1000)
  p.add_argument("--test_clips", type=int, default=200)
  p.add_argument("--max_digits", type=int, default=7)
  p.add_argument("--voices", default=",".join(VOICES), help="comma-separated espeak-ng voices")
  p.add_argument("--rates", default="130,190", help="words per minute: MIN,MAX")
  args = p.parse_args(argv)
  espeak = _espeak()
  if os.path.exists(args.output) and os.listdir(args.output):
    sys.exit(f"error: --output={args.output} is not empty; choose a new folder")
  voices = args.voices.split(",")
  low_rate, high_rate = (int(r) for r in args.rates.split(","))
  rng = np.random.default_rng(args.seed)
  version = subprocess.run([espeak, "--version"], check=True, capture_output=True,
                           text=True).stdout.split("  Data at")[0].strip()
  seconds = []
  for split, count in (("train", args.train_clips), ("test", args.test_clips)):
    folder = os.path.join(args.output, split)
    os.makedirs(folder, exist_ok=True)
    for index in range(count):
      digits = rng.integers(0, 10, size=int(rng.integers(1, args.max_digits + 1)))
      voice = voices[int(rng.integers(len(voices)))]
      rate, pitch = int(rng.integers(low_rate, high_rate + 1)), int(rng.integers(30, 71))
      words = " ".join(WORDS[d] for d in digits)
      samples = synthesize(espeak, words, voice, rate, pitch)
      write_wav(os.path.join(folder, f"{index:05d}.wav"), samples)
      with open(os.path.join(folder, f"{index:05d}.txt"), "w", encoding="utf-8") as f:
        f.write(words + "\n")
      seconds.append(len(samples) / TARGET_RATE)
  about = {"made_by": "experiments/make_spoken_digits.py", "espeak_ng": version,
           "seed": args.seed, "train_clips": args.train_clips, "test_clips": args.test_clips,
           "max_digits": args.max_digits, "voices": voices, "rates_wpm": [low_rate, high_rate],
           "pitch": [30, 70], "sample_rate": TARGET_RATE,
           "resampling": "scipy.signal.resample_poly 320/441 from espeak-ng's 22,050 Hz",
           "seconds": {"min": round(min(seconds), 3), "max": round(max(seconds), 3),
                       "total": round(sum(seconds), 1)}}
  with open(os.path.join(args.output, "about.json"), "w", encoding="utf-8") as f:
    json.dump(about, f, indent=1)
  print(f"{args.output}: {args.train_clips} train + {args.test_clips} test clips, "
        f"{about['seconds']['min']}-{about['seconds']['max']} s ({about['seconds']['total']} s "
        f"in all), {version}")


if __name__ == "__main__":
  main()
