"""The prepared-directory format: token shards plus `manifest.json`, written last.

A prepared directory holds, per split (`train`, `val`) and shard k:
  {split}_{k:05d}.tokens.npy  a flat uint16 / uint32 array: the shard's documents back to back
  {split}_{k:05d}.docs.npy    uint64 [num_docs]: the end offset of each document in the tokens
plus `tokenizer.json` (the tokenizer in tfjax's saved-tokenizer format, tfjax.data.tokenizers)
and `manifest.json`:
  {"format": 1, "dtype": "uint16", "tokenizer": {"name", "spec", "vocab_size", "eos_id",
   "sha256"}, "splits": {"train": {"shards": [{"tokens", "docs", "num_tokens", "num_docs",
   "sha256"}...], "num_tokens", "num_docs"}, "val": {...}}, "sources": [{"path", "bytes",
   "mtime"}...], "settings": {...}, "bad_utf8": {...}}
Both arrays are .npy files so that np.load(mmap_mode='r') maps them with their dtype; the
manifest is written only after every shard is on disk, so a directory without one is unfinished.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

import numpy as np

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
FORMAT = 1
SPLITS = ("train", "val")
UINT16_MAX_VOCAB = 1 << 16  # ids 0..65535


def shard_stem(split: str, index: int) -> str:
  return f"{split}_{index:05d}"


def tokens_file(split: str, index: int) -> str:
  return shard_stem(split, index) + ".tokens.npy"


def docs_file(split: str, index: int) -> str:
  return shard_stem(split, index) + ".docs.npy"


def file_sha256(path: str, chunk_bytes: int = 1 << 22) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while True:
      block = f.read(chunk_bytes)
      if not block:
        return digest.hexdigest()
      digest.update(block)


def shard_sha256(directory: str, shard: dict) -> str:
  """One checksum over a shard's two files (tokens, then document ends)."""
  digest = hashlib.sha256()
  for name in (shard["tokens"], shard["docs"]):
    digest.update(file_sha256(os.path.join(directory, name)).encode())
  return digest.hexdigest()


def tokenizer_sha256(state: dict) -> str:
  """The identity of a saved tokenizer: sha256 of its state as canonical JSON (sorted keys; an
  embedded Hugging Face tokenizer.json string is parsed first, so its formatting does not
  matter). The same tokenizer always hashes the same, whichever tool saved it."""
  canonical = dict(state)
  if isinstance(canonical.get("hf_tokenizer"), str):
    canonical["hf_tokenizer"] = json.loads(canonical["hf_tokenizer"])
  text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int, requested: str = "auto") -> np.dtype:
  """uint16 while every id fits (vocab <= 65,536), else uint32; a vocabulary too big for a
  requested uint16 is an error, never a silent wrap-around of ids."""
  if requested not in ("auto", "uint16", "uint32"):
    raise ValueError(f"--dtype={requested!r}: choose auto, uint16 or uint32")
  if requested == "uint16" and vocab_size > UINT16_MAX_VOCAB:
    raise ValueError(f"--dtype=uint16 holds ids up to 65,535 but the tokenizer has {vocab_size:,} "
                     "ids; use --dtype=uint32 (or auto)")
  if requested == "auto":
    return np.dtype(np.uint16 if vocab_size <= UINT16_MAX_VOCAB else np.uint32)
  return np.dtype(requested)


def read_manifest(directory: str, kind: str = "text") -> dict:
  """The manifest of a finished prepared directory of `kind` (text: token shards; image, audio:
  tfjax.data.media_shards); a clear error for anything else."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"data.path={directory!r}: no such prepared directory (make one with "
                            "`tfjax-prepare --input=... --tokenizer=... --output=DIR`)")
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    raise ValueError(f"{directory} has no {MANIFEST}: it is not a finished prepared directory (a "
                     "prepare that was stopped resumes when run again with the same flags)")
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise ValueError(f"{path}: format {manifest.get('format')!r}, this tfjax reads format {FORMAT}")
  found = manifest.get("kind", "text")  # token shards were written before the key existed
  if found != kind:
    raise ValueError(f"{directory} holds prepared {found} examples, not {kind}: "
                     + ("token shards come from tfjax-prepare of text files; train on it with a "
                        "task that reads {found} data" if kind == "text" else
                        f"prepare an {kind} folder with "
                        f"--input={kind.replace('image', 'images')}:DIR")
                     .format(found=found))
  return manifest


def verify(directory: str, manifest: dict, *, checksums: bool = True) -> None:
  """Every shard of the manifest is present with its size (and, with `checksums`, its sha256);
  else a ValueError naming the first bad shard and the fix."""
  itemsize = np.dtype(manifest["dtype"]).itemsize
  for split in SPLITS:
    for shard in manifest["splits"][split]["shards"]:
      for name, count, size in ((shard["tokens"], shard["num_tokens"], itemsize),
                                (shard["docs"], shard["num_docs"], 8)):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
          raise ValueError(f"{path}: shard missing from the prepared directory (copy it back, "
                           "or prepare the corpus again into a new directory)")
        array = np.load(path, mmap_mode="r")
        if array.shape != (count,):
          raise ValueError(f"{path}: {array.shape[0] if array.ndim else 0} entries, the manifest "
                           f"says {count}: the shard is truncated or replaced (prepare again)")
      if checksums and shard_sha256(directory, shard) != shard["sha256"]:
        raise ValueError(f"{os.path.join(directory, shard['tokens'])}: checksum differs from the "
                         "manifest: the shard is corrupted (prepare again into a new directory)")


class TokenFile:
  """A shard's tokens read on demand with pread: `len()` and `[start:stop]` like the array.

  Why not a memory map: every page a map has touched (and the kernel's fault-around, ~64 KB per
  fault) stays in the process's resident set, so over a run of random windows the RSS climbs to
  the corpus size. pread copies just the rows into fresh buffers; the page cache still serves
  repeated reads, but it is not the process's memory."""

  def __init__(self, path: str):
    with open(path, "rb") as f:
      version = np.lib.format.read_magic(f)
      read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                     else np.lib.format.read_array_header_2_0)
      shape, _, dtype = read_header(f)
      self._offset = f.tell()
    self.dtype, self.shape, self.path = np.dtype(dtype), shape, path
    self._fd = os.open(path, os.O_RDONLY)

  def __len__(self) -> int:
    return self.shape[0]

  def __array__(self, dtype=None, copy=None):  # np.asarray(token_file): the whole shard
    del copy
    array = self[:]
    return array if dtype is None else array.astype(dtype)

  def __getitem__(self, key: slice) -> np.ndarray:
    if not isinstance(key, slice):
      raise IndexError("TokenFile reads slices: tokens[start:stop]")
    start, stop, step = key.indices(len(self))
    if step != 1:
      raise IndexError("TokenFile reads contiguous slices only")
    count = max(stop - start, 0)
    size = self.dtype.itemsize
    raw = os.pread(self._fd, count * size, self._offset + start * size)
    return np.frombuffer(raw, self.dtype, count)

  def __getstate__(self):  # a pickled reader (e.g. into a worker process) reopens the file
    return {"path": self.path}

  def __setstate__(self, state):
    self.__init__(state["path"])

  def __del__(self):
    if getattr(self, "_fd", None) is not None:
      os.close(self._fd)


def open_shards(directory: str, manifest: dict, split: str) -> list[tuple[TokenFile, np.ndarray]]:
  """[(tokens, doc_ends)] of a split's shards: tokens read on demand (TokenFile), the document
  ends (8 bytes a document) memory-mapped. Nothing is read until indexed."""
  return [(TokenFile(os.path.join(directory, s["tokens"])),
           np.load(os.path.join(directory, s["docs"]), mmap_mode="r"))
          for s in manifest["splits"][split]["shards"]]


def vocab_size(directory: str, manifest: Optional[dict] = None) -> int:
  return int((manifest or read_manifest(directory))["tokenizer"]["vocab_size"])
