"""Tokenizes one shard's documents and writes it: tokens, document ends, then a small sidecar
JSON that marks the shard finished (what a resumed prepare trusts). Each file is written to a
temporary name and renamed, so a killed prepare leaves either a whole file or none."""

from __future__ import annotations

import json
import os

import numpy as np

from tfjax.data import manifest as mf
from tfjax.data.tokenizer_spec import Encoder

ENCODE_BATCH_DOCS = 1024  # documents per encode_batch call: large enough to keep every core busy

_encoder = None  # this process's Encoder, set by init_worker (once per worker process)


def init_worker(tokenizer_state: dict, single_thread: bool = True) -> None:
  global _encoder
  if single_thread:  # a pool's worker: parallelism comes from the processes, not HF's threads
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _encoder = Encoder(tokenizer_state)


def sidecar_file(split: str, index: int) -> str:
  return mf.shard_stem(split, index) + ".done.json"


def _save_npy(path: str, array: np.ndarray) -> None:
  tmp = f"{path}.tmp{os.getpid()}.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


def finished(directory: str, split: str, index: int):
  """The sidecar of a finished shard, or None (never written, or its files went missing)."""
  path = os.path.join(directory, sidecar_file(split, index))
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    shard = json.load(f)
  if all(os.path.exists(os.path.join(directory, shard[k])) for k in ("tokens", "docs")):
    return shard
  return None


def write_shard(directory: str, split: str, index: int, texts: list[str], dtype: str,
                eos_id) -> dict:
  """Encodes `texts` (eos_id appended to each when not None) into shard `index` of `split`, with
  the Encoder init_worker set up in this process."""
  encoded = []
  for start in range(0, len(texts), ENCODE_BATCH_DOCS):
    encoded += _encoder.encode_batch(texts[start:start + ENCODE_BATCH_DOCS])
  if eos_id is not None:
    eos = np.asarray([eos_id])
    encoded = [np.concatenate([ids, eos]) for ids in encoded]
  lengths = np.fromiter((len(ids) for ids in encoded), np.uint64, len(encoded))
  tokens = np.concatenate(encoded).astype(np.int64) if encoded else np.zeros(0, np.int64)
  if tokens.size and tokens.max() > np.iinfo(dtype).max:  # the vocabulary check, made certain
    raise ValueError(f"token id {tokens.max()} does not fit {dtype}; use --dtype=uint32")
  shard = {"tokens": mf.tokens_file(split, index), "docs": mf.docs_file(split, index),
           "num_tokens": int(tokens.size), "num_docs": len(encoded)}
  _save_npy(os.path.join(directory, shard["tokens"]), tokens.astype(dtype))
  _save_npy(os.path.join(directory, shard["docs"]), np.cumsum(lengths, dtype=np.uint64))
  shard["sha256"] = mf.shard_sha256(directory, shard)
  path = os.path.join(directory, sidecar_file(split, index))
  with open(f"{path}.tmp{os.getpid()}", "w", encoding="utf-8") as f:
    json.dump(shard, f)
  os.replace(f"{path}.tmp{os.getpid()}", path)
  return shard
