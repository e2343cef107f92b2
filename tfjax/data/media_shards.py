"""Image and audio shards: the prepared-directory format (tfjax.data.manifest) for examples that
are not running text. Each shard k of a split is a few .npy arrays, `{split}_{k:05d}.{field}.npy`,
written to a temporary name and renamed, then a sidecar JSON that marks the shard finished (what a
resumed prepare trusts); `manifest.json` is written after every shard, as for token shards.

Image shards (manifest "kind": "image"):
  pixels  uint8 [n, size, size, channels]    labels  int32 [n] (indices into "class_names")
Audio shards (manifest "kind": "audio"):
  features    float32 [frames in the shard, n_mels]: each clip's Whisper log-mel frames
              (tfjax.data.log_mel) back to back, time first, without the trailing frames of pure
              padding (all equal to the clip's floor value; a 2 s clip keeps ~200 of 3,000)
  frame_ends  uint64 [n]: the end offset of each clip's frames
  floors      float32 [n]: the value of its dropped frames (readers append them again, so a
              clip's features are exactly the full chunk_seconds x 100 frames)
  tokens      uint16/uint32 [tokens in the shard]: the transcripts' token ids back to back
  docs        uint64 [n]: the end offset of each transcript's tokens
  text        uint8 [bytes]: the transcripts' UTF-8 bytes back to back (the references a word
              error rate is measured against)    text_ends  uint64 [n]
A shard entry in the manifest: {"files": {field: file name}, "num_examples", "sha256"} (sha256 of
the files' sha256s in sorted field order).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from tfjax.data import audio_folder, image_folder, log_mel
from tfjax.data import manifest as mf
from tfjax.data.tokenizer_spec import Encoder

KINDS = ("image", "audio")
FIELDS = {"image": ("pixels", "labels"),
          "audio": ("features", "frame_ends", "floors", "tokens", "docs", "text", "text_ends")}

_worker = {}  # this process's settings and tokenizer (init_worker; once per worker process)


def init_worker(settings: dict, tokenizer_state=None, single_thread: bool = True) -> None:
  if single_thread:  # a pool's worker: parallelism comes from the processes
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _worker.clear()
  _worker.update(settings=settings, encoder=Encoder(tokenizer_state) if tokenizer_state else None,
                 filters=(log_mel.mel_filters(settings["n_mels"]) if "n_mels" in settings
                          else None))


def file_name(split: str, index: int, field: str) -> str:
  return f"{mf.shard_stem(split, index)}.{field}.npy"


def sidecar_file(split: str, index: int) -> str:
  return mf.shard_stem(split, index) + ".done.json"


def shard_sha256(directory: str, shard: dict) -> str:
  digest = hashlib.sha256()
  for field in sorted(shard["files"]):
    digest.update(mf.file_sha256(os.path.join(directory, shard["files"][field])).encode())
  return digest.hexdigest()


def finished(directory: str, split: str, index: int):
  """The sidecar of a finished shard, or None (never written, or its files went missing)."""
  path = os.path.join(directory, sidecar_file(split, index))
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    shard = json.load(f)
  if all(os.path.exists(os.path.join(directory, n)) for n in shard["files"].values()):
    return shard
  return None


def _save(directory: str, name: str, array: np.ndarray) -> None:
  path = os.path.join(directory, name)
  tmp = f"{path}.tmp{os.getpid()}.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


def _image_arrays(items: list) -> dict:
  settings = _worker["settings"]
  pixels = np.zeros((len(items), settings["size"], settings["size"],
                     image_folder.MODES[settings["mode"]]), np.uint8)
  for i, (path, _) in enumerate(items):
    pixels[i] = image_folder.load_image(path, settings["size"], settings["mode"])
  return {"pixels": pixels, "labels": np.asarray([label for _, label in items], np.int32)}


def trim_padding(features_TxM: np.ndarray) -> tuple[np.ndarray, np.float32]:
  """(the frames before the trailing run of constant frames equal to the last one, that value).
  A clip shorter than the chunk ends in frames of pure zero-padding, every bin at the floor."""
  last = features_TxM[-1]
  floor = last[0]
  if not np.all(last == floor):
    return features_TxM, np.float32(np.nan)  # the audio fills the chunk: nothing to drop
  constant_T = np.all(features_TxM == floor, axis=1)
  keep = len(constant_T) - int(np.argmin(constant_T[::-1])) if not constant_T.all() else 0
  return features_TxM[:keep], np.float32(floor)


def _audio_arrays(clips: list) -> dict:
  settings, encoder = _worker["settings"], _worker["encoder"]
  frames, floors, texts = [], [], []
  for wav, transcript in clips:
    audio = audio_folder.read_wav(wav)
    limit = settings["chunk_seconds"] * log_mel.SAMPLING_RATE
    if len(audio) > limit:
      raise ValueError(f"{wav}: {len(audio) / log_mel.SAMPLING_RATE:.2f} s, longer than "
                       f"--chunk_seconds={settings['chunk_seconds']} (the encoder's window; its "
                       "transcript would not match the truncated audio): split the clip or raise "
                       "--chunk_seconds")
    kept, floor = trim_padding(log_mel.log_mel(audio, settings["n_mels"],
                                               settings["chunk_seconds"], _worker["filters"]))
    frames.append(kept)
    floors.append(floor)
    texts.append(audio_folder.read_transcript(transcript))
  encoded = encoder.encode_batch(texts) if texts else []
  if settings["eos_id"] is not None:
    encoded = [np.concatenate([ids, [settings["eos_id"]]]) for ids in encoded]
  tokens = np.concatenate(encoded).astype(np.int64) if encoded else np.zeros(0, np.int64)
  if tokens.size and tokens.max() > np.iinfo(settings["dtype"]).max:
    raise ValueError(f"token id {tokens.max()} does not fit {settings['dtype']}; "
                     "use --dtype=uint32")
  raw = [t.encode("utf-8") for t in texts]
  return {
      "features": (np.concatenate(frames) if frames else
                   np.zeros((0, settings["n_mels"]), np.float32)),
      "frame_ends": np.cumsum([len(f) for f in frames], dtype=np.uint64),
      "floors": np.asarray(floors, np.float32),
      "tokens": tokens.astype(settings["dtype"]),
      "docs": np.cumsum([len(ids) for ids in encoded], dtype=np.uint64),
      "text": np.frombuffer(b"".join(raw), np.uint8),
      "text_ends": np.cumsum([len(r) for r in raw], dtype=np.uint64),
  }


def write_shard(directory: str, split: str, index: int, items: list) -> dict:
  """Reads and writes shard `index` of `split` (images: [(path, label)], audio: [(wav,
  transcript)]) with the settings init_worker set up in this process; returns its entry."""
  kind = _worker["settings"]["kind"]
  arrays = _image_arrays(items) if kind == "image" else _audio_arrays(items)
  shard = {"files": {field: file_name(split, index, field) for field in FIELDS[kind]},
           "num_examples": len(items)}
  for field in FIELDS[kind]:
    _save(directory, shard["files"][field], arrays[field])
  shard["sha256"] = shard_sha256(directory, shard)
  path = os.path.join(directory, sidecar_file(split, index))
  with open(f"{path}.tmp{os.getpid()}", "w", encoding="utf-8") as f:
    json.dump(shard, f)
  os.replace(f"{path}.tmp{os.getpid()}", path)
  return shard
