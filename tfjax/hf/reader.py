"""Reading a Hugging Face model directory: config.json, safetensors weights, tokenizer files.

Tensors are read one at a time (`HFCheckpoint.get`) from memory-mapped safetensors files, single
(`model.safetensors`) or sharded (`model.safetensors.index.json` + shards), with the `safetensors`
package's NumPy reader: no torch. bfloat16 tensors come back as ml_dtypes.bfloat16 arrays.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os

import numpy as np

from tfjax.hf.mapping import UnsupportedError

INDEX_FILE = "model.safetensors.index.json"
# Files copied next to an imported run (tfjax/hf/importer.py) so that export can write them back.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
METADATA_FILES = ("config.json", "generation_config.json") + TOKENIZER_FILES


def read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _safetensors():
  try:
    import safetensors  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("reading Hugging Face checkpoints needs the `safetensors` package: "
                      "pip install 'tfjax[hf]'") from e
  return safetensors


class HFCheckpoint:
  """A Hugging Face model directory opened for reading (use as a context manager or close())."""

  def __init__(self, directory: str):
    self.directory = directory
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
      raise ValueError(f"{directory} has no config.json: not a Hugging Face model directory")
    self.config = read_json(config_path)
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.exists(index_path):
      weight_map = read_json(index_path)["weight_map"]
      self._file_of = {name: os.path.join(directory, f) for name, f in weight_map.items()}
    else:
      files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
      if not files:
        legacy = [f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".h5"))]
        hint = (f" (it holds {legacy}: save the model again with transformers' "
                "save_pretrained, which writes safetensors)") if legacy else ""
        raise UnsupportedError(f"{directory} has no *.safetensors weights{hint}")
      self._file_of = {}
      safetensors = _safetensors()
      for path in files:
        with safetensors.safe_open(path, framework="numpy") as f:
          for name in f.keys():
            self._file_of[name] = path
    self._stack = contextlib.ExitStack()
    self._open = {}

  @property
  def names(self) -> set:
    return set(self._file_of)

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` as a NumPy array (its stored dtype)."""
    path = self._file_of.get(name)
    if path is None:
      raise UnsupportedError(f"{self.directory} has no tensor {name!r}")
    if path not in self._open:
      self._open[path] = self._stack.enter_context(
          _safetensors().safe_open(path, framework="numpy"))
    return self._open[path].get_tensor(name)

  def generation_config(self) -> dict:
    path = os.path.join(self.directory, "generation_config.json")
    return read_json(path) if os.path.exists(path) else {}

  def tokenizer_path(self):
    path = os.path.join(self.directory, "tokenizer.json")
    return path if os.path.exists(path) else None

  def close(self) -> None:
    self._stack.close()
    self._open.clear()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
