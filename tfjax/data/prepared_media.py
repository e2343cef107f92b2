"""Reading prepared image and audio directories (tfjax.data.prepare_media, the shard layout in
tfjax.data.media_shards): what an image-classification, contrastive or speech task draws its
examples from.

    split = open_split(DIR, "train", kind="image")     # checks every shard first
    split.pixels([0, 5]), split.labels([0, 5]), split.class_names
    split = open_split(DIR, "val", kind="audio")
    split.features([3])   # float32 [1, chunk_seconds * 100, n_mels], the padding frames put back
    split.tokens(3), split.text(3)

Examples are addressed by their index in the split (shards in order); arrays are memory-mapped,
so only the rows asked for are read.
"""

from __future__ import annotations

import os

import numpy as np

from tfjax.data import manifest as mf
from tfjax.data import media_shards

VERIFY = ("checksum", "size")


def verify(directory: str, manifest: dict, *, checksums: bool = True) -> None:
  """Every shard file is present and holds as many entries as the manifest says (and, with
  `checksums`, its sha256 matches); else a ValueError naming the first bad shard and the fix."""
  for split in mf.SPLITS:
    for shard in manifest["splits"][split]["shards"]:
      for field, name in shard["files"].items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
          raise ValueError(f"{path}: shard missing from the prepared directory (copy it back, or "
                           "prepare the folder again into a new directory)")
        if field in ("pixels", "labels", "frame_ends", "floors", "docs", "text_ends"):
          rows = np.load(path, mmap_mode="r").shape[0]
          if rows != shard["num_examples"]:
            raise ValueError(f"{path}: {rows} examples, the manifest says "
                             f"{shard['num_examples']}: the shard is truncated or replaced "
                             "(prepare again)")
      if checksums and media_shards.shard_sha256(directory, shard) != shard["sha256"]:
        raise ValueError(f"{os.path.join(directory, next(iter(shard['files'].values())))}: "
                         "checksum differs from the manifest: the shard is corrupted (prepare "
                         "again into a new directory)")


class MediaSplit:
  """One split of a prepared image or audio directory (module docstring)."""

  def __init__(self, directory: str, manifest: dict, split: str):
    self.directory, self.manifest, self.kind = directory, manifest, manifest["kind"]
    self.settings = manifest["settings"]
    shards = manifest["splits"][split]["shards"]
    self._arrays = [{field: np.load(os.path.join(directory, name), mmap_mode="r")
                     for field, name in shard["files"].items()} for shard in shards]
    self._starts = np.cumsum([0] + [s["num_examples"] for s in shards])

  def __len__(self) -> int:
    return int(self._starts[-1])

  @property
  def class_names(self) -> list[str]:
    return list(self.manifest["class_names"])

  def _locate(self, index: int) -> tuple[dict, int]:
    if not 0 <= index < len(self):
      raise IndexError(f"example {index} of a split of {len(self)}")
    shard = int(np.searchsorted(self._starts, index, side="right")) - 1
    return self._arrays[shard], int(index - self._starts[shard])

  def _span(self, arrays: dict, row: int, data: str, ends: str) -> np.ndarray:
    start = int(arrays[ends][row - 1]) if row else 0
    return np.asarray(arrays[data][start:int(arrays[ends][row])])

  def pixels(self, indices) -> np.ndarray:
    """uint8 [len(indices), size, size, channels]."""
    return np.stack([np.asarray(a["pixels"][r]) for a, r in map(self._locate, indices)])

  def labels(self, indices) -> np.ndarray:
    """int32 [len(indices)] class ids (names: class_names)."""
    return np.asarray([a["labels"][r] for a, r in map(self._locate, indices)], np.int32)

  def features(self, indices) -> np.ndarray:
    """float32 [len(indices), frames, n_mels]: each clip's full Whisper log-mel features."""
    frames, n_mels = self.settings["frames"], self.settings["n_mels"]
    out = np.empty((len(indices), frames, n_mels), np.float32)
    for i, (arrays, row) in enumerate(map(self._locate, indices)):
      kept = self._span(arrays, row, "features", "frame_ends")
      out[i, :len(kept)] = kept
      out[i, len(kept):] = arrays["floors"][row]
    return out

  def _lengths(self, ends: str) -> np.ndarray:
    return np.concatenate([np.diff(np.asarray(a[ends], np.int64), prepend=0)
                           for a in self._arrays]) if self._arrays else np.zeros(0, np.int64)

  def frame_counts(self) -> np.ndarray:
    """int64 [len(self)]: each clip's frames before its dropped padding (its speech and the
    partial frames at its end), read from the index alone."""
    return self._lengths("frame_ends")

  def token_counts(self) -> np.ndarray:
    """int64 [len(self)]: each transcript's token count (tokens(i)'s length)."""
    return self._lengths("docs")

  def tokens(self, index: int) -> np.ndarray:
    """The transcript's token ids (with the end-of-text id when the prepare appended it)."""
    return self._span(*self._locate(index), "tokens", "docs")

  def text(self, index: int) -> str:
    """The transcript as read from its .txt file (whitespace collapsed)."""
    return self._span(*self._locate(index), "text", "text_ends").tobytes().decode("utf-8")


def open_split(directory: str, split: str, *, kind: str, verify_mode: str = "checksum"
               ) -> MediaSplit:
  """A split of a prepared `kind` ('image' / 'audio') directory, after checking its shards."""
  if split not in mf.SPLITS:
    raise ValueError(f"split {split!r}: choose one of {', '.join(mf.SPLITS)}")
  if verify_mode not in VERIFY:
    raise ValueError(f"data.verify={verify_mode!r}: choose one of {', '.join(VERIFY)}")
  manifest = mf.read_manifest(directory, kind)
  verify(directory, manifest, checksums=verify_mode == "checksum")
  return MediaSplit(directory, manifest, split)
