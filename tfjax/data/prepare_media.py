"""tfjax-prepare for image and audio folders: `--input=images:DIR` / `--input=audio:DIR`.

    tfjax-prepare --input=images:DIR [--val_input=images:DIR | --val_fraction=F] --output=OUT \
        [--image_size=224] [--image_mode=RGB]
    tfjax-prepare --input=audio:DIR [--val_input=audio:DIR | --val_fraction=F] --output=OUT \
        --tokenizer=byte|char|bpe:DIR|hf:DIR|gpt2 [--n_mels=80] [--chunk_seconds=30]

Folders: tfjax.data.image_folder (one subfolder per class) and tfjax.data.audio_folder (NAME.wav
+ NAME.txt). The val split is a second folder (--val_input: a fixed held-out set, its classes the
same as --input's), or the examples whose index hashes under --val_fraction (the text split's
hash). Shards (tfjax.data.media_shards) are cut every --shard_mb megabytes of decoded pixels /
WAV bytes, so where they end depends only on the inputs and flags; resuming after a kill, the
refusal to touch an earlier prepare and --overwrite work as for text (tfjax.data.prepare).
"""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import os
from typing import Optional

from tfjax.data import audio_folder, image_folder, log_mel, media_shards
from tfjax.data import manifest as mf
from tfjax.data import prepare as text_prepare
from tfjax.data import tokenizer_spec

PREFIXES = {"images:": "image", "audio:": "audio"}


def media_kind(spec: str) -> Optional[str]:
  """'image' / 'audio' for an --input of an image / audio folder, else None (text inputs)."""
  for prefix, kind in PREFIXES.items():
    if spec.startswith(prefix):
      return kind
  return None


def _folder(spec: str, kind: str, flag: str) -> str:
  if media_kind(spec) != kind:
    prefix = next(p for p, k in PREFIXES.items() if k == kind)
    raise ValueError(f"{flag}={spec!r}: give the {kind} folder as {prefix}DIR, like --input")
  return spec.split(":", 1)[1]


def _fingerprint(directory: str, paths: list[str]) -> dict:
  """What a resumed prepare checks the folder against: file count, bytes, and a digest of every
  file's relative path, size and modification time."""
  digest, total = hashlib.sha256(), 0
  for path in paths:
    stat = os.stat(path)
    total += stat.st_size
    digest.update(f"{os.path.relpath(path, directory)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                  .encode())
  return {"path": os.path.abspath(directory), "files": len(paths), "bytes": total,
          "sha256": digest.hexdigest()}


def _scan(kind: str, directory: str):
  """(examples, class names or None, skipped files, fingerprint) of one folder."""
  if kind == "image":
    classes, items, skipped = image_folder.find_images(directory)
    return items, classes, skipped, _fingerprint(directory, [p for p, _ in items])
  clips = audio_folder.find_clips(directory)
  return clips, None, 0, _fingerprint(directory, [p for clip in clips for p in clip])


def _check_flags(kind, tokenizer, image_size, image_mode, n_mels, chunk_seconds) -> None:
  if kind == "image":
    if image_mode not in image_folder.MODES:
      raise ValueError(f"--image_mode={image_mode!r}: choose one of "
                       f"{', '.join(image_folder.MODES)}")
    if image_size < 1:
      raise ValueError(f"--image_size={image_size}: must be >= 1")
    image_folder._pillow()  # pylint: disable=protected-access  (the install hint, before writing)
    return
  if tokenizer is None:
    raise ValueError("--input=audio:... needs --tokenizer= for the transcripts (byte, char, "
                     "bpe:DIR, hf:DIR (e.g. a Whisper tokenizer), gpt2)")
  if n_mels not in log_mel.MEL_BINS:
    raise ValueError(f"--n_mels={n_mels}: Whisper's features have "
                     f"{' or '.join(map(str, log_mel.MEL_BINS))} mel bins")
  if chunk_seconds < 1:
    raise ValueError(f"--chunk_seconds={chunk_seconds}: must be >= 1 (Whisper's: 30)")


def prepare_media(inputs: str, output: str, *, val_input: Optional[str] = None,
                  val_fraction: float = 0.0005, val_docs: Optional[int] = None,
                  tokenizer: Optional[str] = None, image_size: int = 224,
                  image_mode: str = "RGB", n_mels: int = 80, chunk_seconds: int = 30,
                  shard_mb: float = 64.0, dtype: str = "auto", append_eos: bool = True,
                  workers: Optional[int] = None, overwrite: bool = False) -> dict:
  """Prepares an image or audio folder into `output` (module docstring); returns the manifest."""
  kind = media_kind(inputs)
  directory = _folder(inputs, kind, "--input")
  if val_docs is not None:
    raise ValueError(f"--val_docs takes the first documents, which in a {kind} folder are one "
                     "class or speaker; give a held-out folder with --val_input or use "
                     "--val_fraction")
  if val_input is None and not 0.0 < val_fraction < 1.0:
    raise ValueError(f"--val_fraction={val_fraction}: must be in (0, 1)")
  if shard_mb <= 0:
    raise ValueError(f"--shard_mb={shard_mb}: must be > 0")
  _check_flags(kind, tokenizer, image_size, image_mode, n_mels, chunk_seconds)
  workers = (os.cpu_count() or 1) if workers is None else int(workers)
  if workers < 1:
    raise ValueError(f"--workers={workers}: must be >= 1")

  items, classes, skipped, fingerprint = _scan(kind, directory)
  sources = [fingerprint]
  if val_input is not None:
    val_dir = _folder(val_input, kind, "--val_input")
    val_items, val_classes, val_skipped, val_print = _scan(kind, val_dir)
    if classes != val_classes:
      raise ValueError(f"--val_input={val_input}: its classes {val_classes} differ from "
                       f"--input's {classes}; both folders need the same class subfolders")
    skipped += val_skipped
    sources.append(val_print)
    splits = {"train": items, "val": val_items}
  else:
    splits = {"train": [], "val": []}
    for index, item in enumerate(items):
      in_val = text_prepare._in_val(index, val_fraction)  # pylint: disable=protected-access
      splits["val" if in_val else "train"].append(item)
  for split in mf.SPLITS:
    if not splits[split]:
      raise ValueError(f"--input={inputs}: the {split} split got no example ({len(items)} in the "
                       "folder); give a held-out folder with --val_input=... or change "
                       "--val_fraction")

  spec = None
  if kind == "image":
    settings = {"kind": kind, "size": image_size, "mode": image_mode,
                "resize": "shorter side to size (bicubic), center crop; EXIF orientation applied"}
    bytes_per = lambda item: image_size * image_size * image_folder.MODES[image_mode]  # noqa: E731
  else:
    transcripts = lambda: (audio_folder.read_transcript(t)  # noqa: E731
                           for split in mf.SPLITS for _, t in splits[split])
    spec = tokenizer_spec.resolve(tokenizer, transcripts() if tokenizer == "char" else None)
    token_dtype = mf.token_dtype(spec.vocab_size, dtype)
    settings = {"kind": kind, "n_mels": n_mels, "chunk_seconds": chunk_seconds,
                "frames": chunk_seconds * log_mel.SAMPLING_RATE // log_mel.HOP_LENGTH,
                "sampling_rate": log_mel.SAMPLING_RATE, "n_fft": log_mel.N_FFT,
                "hop_length": log_mel.HOP_LENGTH, "dtype": token_dtype.name,
                "eos_id": spec.eos_id if append_eos else None}
    bytes_per = lambda clip: os.path.getsize(clip[0])  # noqa: E731
  settings.update(val_input=val_input, val_fraction=None if val_input else val_fraction,
                  shard_mb=shard_mb)

  plan = {"inputs": [inputs] + ([val_input] if val_input else []), "sources": sources,
          "tokenizer": spec.manifest_entry() if spec else None, "settings": settings}
  # pylint: disable-next=protected-access
  final_output, output = output, text_prepare._target(output, plan, overwrite)
  text_prepare._check_output(output, plan)  # pylint: disable=protected-access
  if spec is not None:
    with open(os.path.join(output, mf.TOKENIZER), "w", encoding="utf-8") as f:
      json.dump(spec.state, f, ensure_ascii=False)

  pool = None
  state = spec.state if spec else None
  if workers > 1:
    pool = multiprocessing.get_context("spawn").Pool(
        workers, media_shards.init_worker, (settings, state))
  else:
    media_shards.init_worker(settings, state, single_thread=False)
  shards = {split: [] for split in mf.SPLITS}
  pending = collections.deque()  # (split, shard or AsyncResult), at most 2 x workers

  def collect(limit: int) -> None:
    while len(pending) > limit:
      split, result = pending.popleft()
      shards[split].append(result if isinstance(result, dict) else result.get())

  try:
    limit = shard_mb * 1e6
    for split in mf.SPLITS:
      groups, size = [[]], 0
      for item in splits[split]:
        groups[-1].append(item)
        size += bytes_per(item)
        if size >= limit:
          groups.append([])
          size = 0
      for index, group in enumerate(g for g in groups if g):
        done = media_shards.finished(output, split, index)
        if done is not None:  # a resumed prepare keeps what a killed one finished
          pending.append((split, done))
        elif pool is not None:
          pending.append((split, pool.apply_async(media_shards.write_shard,
                                                  (output, split, index, group))))
        else:
          pending.append((split, media_shards.write_shard(output, split, index, group)))
        collect(2 * workers)
    collect(0)
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()

  manifest = {
      "format": mf.FORMAT, "kind": kind, "settings": settings, "sources": sources,
      "splits": {split: {"shards": shards[split],
                         "num_examples": sum(s["num_examples"] for s in shards[split])}
                 for split in mf.SPLITS},
      "skipped_files": skipped,
  }
  if kind == "image":
    manifest["class_names"] = classes
  else:
    manifest["tokenizer"] = spec.manifest_entry()
    manifest["dtype"] = settings["dtype"]
  path = os.path.join(output, mf.MANIFEST)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
  os.replace(path + ".tmp", path)
  for split in mf.SPLITS:
    for index in range(len(shards[split])):
      os.remove(os.path.join(output, media_shards.sidecar_file(split, index)))
  os.remove(os.path.join(output, text_prepare.PLAN))
  if output != final_output:
    text_prepare._replace(final_output, output)  # pylint: disable=protected-access
  return manifest
