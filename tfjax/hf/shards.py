"""Writing safetensors weights as transformers does: one `model.safetensors` up to a size limit,
above it `model-0000k-of-0000n.safetensors` shards and `model.safetensors.index.json`
({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}), which
`from_pretrained` and tfjax's reader (tfjax/hf/reader.py) both load.

Tensors fill shards in the order given until the next would pass the limit; a tensor larger
than the limit gets a shard of its own (so a shard can exceed it, as in transformers).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DEFAULT_MAX_SHARD_SIZE = "5GB"
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def parse_size(size) -> int:
  """Bytes of `size`: an int, or a number and a unit ("500MB", "5GB", "2GiB"; any case, always
  bytes; KB/MB/GB are powers of 10, KiB/MiB/GiB of 2)."""
  if isinstance(size, int):
    value = size
  else:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = match.group(2).upper() if match else None
    if unit not in _UNITS:
      raise ValueError(f"--max_shard_size={size!r} is not a size: write bytes or a number and "
                       "a unit, e.g. 500MB, 5GB, 2GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
  if value <= 0:
    raise ValueError(f"--max_shard_size={size!r} must be positive")
  return value


def plan(sizes: dict, max_bytes: int) -> list:
  """Tensor names grouped into shards ([[name, ...], ...]) from {name: bytes} in order."""
  shards, current, used = [], [], 0
  for name, nbytes in sizes.items():
    if current and used + nbytes > max_bytes:
      shards.append(current)
      current, used = [], 0
    current.append(name)
    used += nbytes
  if current:
    shards.append(current)
  return shards


def existing_weights(directory: str) -> list:
  """Weight files already in `directory` (export refuses to mix its files with them)."""
  if not os.path.isdir(directory):
    return []
  return sorted(f for f in os.listdir(directory)
                if f.endswith((".safetensors", ".bin")) or f == INDEX_FILE)


def write(tensors: dict, directory: str, max_shard_size=DEFAULT_MAX_SHARD_SIZE) -> list:
  """Writes {name: np.ndarray} into `directory`; returns the files written."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  limit = parse_size(max_shard_size)
  sizes = {name: int(np.asarray(t).nbytes) for name, t in tensors.items()}
  shards = plan(sizes, limit)
  metadata = {"format": "pt"}
  if len(shards) <= 1:
    save_file(tensors, os.path.join(directory, SINGLE_FILE), metadata=metadata)
    return [SINGLE_FILE]
  files, weight_map = [], {}
  for k, names in enumerate(shards):
    name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({n: tensors[n] for n in names}, os.path.join(directory, name), metadata=metadata)
    weight_map.update({n: name for n in names})
    files.append(name)
  index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
  with open(os.path.join(directory, INDEX_FILE), "w", encoding="utf-8") as f:
    json.dump(index, f, indent=2, sort_keys=True)
  return files + [INDEX_FILE]
