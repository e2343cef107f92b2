"""Reading a Hugging Face model directory: config.json, safetensors weights, tokenizer files.

Tensors are read one at a time (`HFCheckpoint.get`) from safetensors files, single
(`model.safetensors`) or sharded (`model.safetensors.index.json` + shards): each file's JSON
header gives every tensor's dtype, shape and byte range, and `get` returns a read-only NumPy
memory map of that range alone. Nothing is copied until the caller converts it (the importer
casts it once, into the target dtype), and its pages leave the process's resident memory when
the map is dropped, so reading a checkpoint holds about one tensor at a time. No torch;
bfloat16 tensors come back as ml_dtypes.bfloat16 arrays.
"""

from __future__ import annotations

import glob
import json
import os
import struct

import numpy as np

from tfjax.hf.mapping import UnsupportedError

INDEX_FILE = "model.safetensors.index.json"
# Files copied next to an imported run (tfjax/hf/importer.py) so that export can write them back.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
METADATA_FILES = ("config.json", "generation_config.json") + TOKENIZER_FILES


def read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _numpy_dtype(code: str, path: str):
  """NumPy dtype of a safetensors dtype code."""
  if code == "BF16":
    import ml_dtypes  # pylint: disable=import-outside-toplevel
    return np.dtype(ml_dtypes.bfloat16)
  codes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
  if code not in codes:
    raise UnsupportedError(f"{path} holds a tensor of safetensors dtype {code}, which tfjax "
                           f"does not read (it reads {['BF16'] + list(codes)})")
  return np.dtype(codes[code])


def read_header(path: str) -> dict:
  """{name: (dtype, shape, byte offset of its data in the file)} of one safetensors file."""
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    begin, _ = info["data_offsets"]
    out[name] = (_numpy_dtype(info["dtype"], path), tuple(info["shape"]), 8 + length + begin)
  return out


class HFCheckpoint:
  """A Hugging Face model directory opened for reading (use as a context manager or close())."""

  def __init__(self, directory: str):
    self.directory = directory
    config_path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
      raise ValueError(f"{directory} does not exist (give a Hugging Face model directory: "
                       "config.json and *.safetensors)" if not os.path.exists(directory) else
                       f"{directory} is not a directory (give a Hugging Face model directory)")
    if not os.path.exists(config_path):
      raise ValueError(f"{directory} has no config.json: not a Hugging Face model directory")
    self.config = read_json(config_path)
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.exists(index_path):
      files = sorted({os.path.join(directory, f)
                      for f in read_json(index_path)["weight_map"].values()})
    else:
      files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
      if not files:
        legacy = [f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".h5"))]
        hint = (f" (it holds {legacy}: save the model again with transformers' "
                "save_pretrained, which writes safetensors)") if legacy else ""
        raise UnsupportedError(f"{directory} has no *.safetensors weights{hint}")
    self._where = {}  # name -> (path, dtype, shape, offset)
    for path in files:
      for name, (dtype, shape, offset) in read_header(path).items():
        self._where[name] = (path, dtype, shape, offset)

  @property
  def names(self) -> set:
    return set(self._where)

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` in its stored dtype: a read-only memory map of its bytes (unmapped when
    the last reference to it goes)."""
    if name not in self._where:
      raise UnsupportedError(f"{self.directory} has no tensor {name!r}")
    path, dtype, shape, offset = self._where[name]
    if not int(np.prod(shape, dtype=np.int64)):
      return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)

  def generation_config(self) -> dict:
    path = os.path.join(self.directory, "generation_config.json")
    return read_json(path) if os.path.exists(path) else {}

  def tokenizer_path(self):
    path = os.path.join(self.directory, "tokenizer.json")
    return path if os.path.exists(path) else None

  def close(self) -> None:
    """Nothing stays open between `get` calls; kept for the context-manager protocol."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
