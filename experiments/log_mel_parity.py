"""How far tfjax-prepare's Whisper log-mel features are from transformers' WhisperFeatureExtractor
on real clips: the three max differences of docs/data.md's table.

    python experiments/log_mel_parity.py --folder=data/spoken_digits/test \
        --prepared=data/spoken_digits_prepared [--split=val] [--clips=40]

--folder is the audio folder that became --split of the --prepared directory (--val_input's
folder for val). For its first --clips clips, in the prepare's (sorted) order, it prints the max
absolute difference between: the prepared features and the extractor's NumPy path (float64, what
it runs where torch is not installed); the prepared features and its torch path (float32 STFT,
its default where torch is installed); and the extractor's two paths.
"""

from __future__ import annotations

import argparse

import numpy as np

from tfjax.data import audio_folder, prepared_media


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--folder", required=True)
  p.add_argument("--prepared", required=True)
  p.add_argument("--split", default="val")
  p.add_argument("--clips", type=int, default=40)
  args = p.parse_args(argv)
  import transformers  # pylint: disable=import-outside-toplevel
  from transformers.models.whisper import feature_extraction_whisper as fe_module  # pylint: disable=import-outside-toplevel
  data = prepared_media.open_split(args.prepared, args.split, kind="audio")
  extractor = transformers.WhisperFeatureExtractor(feature_size=data.settings["n_mels"],
                                                   chunk_length=data.settings["chunk_seconds"])
  torch_available = fe_module.is_torch_available

  def extract(audio, torch_path):
    fe_module.is_torch_available = torch_available if torch_path else (lambda: False)
    try:
      return extractor(audio, sampling_rate=16000, return_tensors="np").input_features[0].T
    finally:
      fe_module.is_torch_available = torch_available

  worst = np.zeros(3)
  clips = audio_folder.find_clips(args.folder)[:args.clips]
  for i, (wav, transcript) in enumerate(clips):
    if audio_folder.read_transcript(transcript) != data.text(i):
      raise SystemExit(f"error: {wav} is not example {i} of the {args.split} split; give the "
                       "folder that was prepared into it")
    audio = audio_folder.read_wav(wav)
    ours, numpy_path, torch_path = data.features([i])[0], extract(audio, False), extract(audio,
                                                                                         True)
    worst = np.maximum(worst, [np.abs(ours - numpy_path).max(), np.abs(ours - torch_path).max(),
                               np.abs(numpy_path - torch_path).max()])
  print(f"{len(clips)} clips, transformers {transformers.__version__}: tfjax vs NumPy path "
        f"{worst[0]:.3g}, tfjax vs torch path {worst[1]:.3g}, NumPy vs torch path {worst[2]:.3g}")


if __name__ == "__main__":
  main()
