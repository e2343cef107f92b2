"""`--tokenizer=gpt2|bpe:DIR|hf:DIR|byte|char` -> the tokenizer a prepare encodes with.

The result is saved into the prepared directory in tfjax's saved-tokenizer format
({"type": "byte" | "char" | "bpe" | "hf", ...}, read by tfjax.data.tokenizers.load_tokenizer),
so training takes its tokenizer from there and never needs the original files again.

  byte    UTF-8 bytes, 256 ids.
  char    one id per character of the corpus (a first pass over the inputs collects them).
  bpe:DIR a tfjax byte-level BPE saved in DIR/tokenizer.json (e.g. by a data.tokenizer=bpe run).
  hf:DIR  a Hugging Face tokenizer.json in DIR (or one `python -m tfjax.hf import` saved); its
          end-of-text id comes from tfjax's saved special ids or DIR/tokenizer_config.json.
  gpt2    GPT-2's tokenizer.json (50,257 ids, <|endoftext|> = 50256). There is no network and it
          cannot be built offline, so it must already be on disk: $TFJAX_GPT2_TOKENIZER (the file
          or its folder), or the Hugging Face cache of `gpt2` / `openai-community/gpt2`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Iterable, Optional

import numpy as np

from tfjax.data.manifest import TOKENIZER, tokenizer_sha256

GPT2_ENV = "TFJAX_GPT2_TOKENIZER"
GPT2_VOCAB, GPT2_EOS = 50257, 50256
KINDS = ("byte", "char", "gpt2", "bpe:DIR", "hf:DIR")


@dataclasses.dataclass
class TokenizerSpec:
  name: str  # byte | char | gpt2 | bpe | hf
  spec: str  # the flag as given
  state: dict  # tfjax's saved-tokenizer JSON
  vocab_size: int
  eos_id: Optional[int]

  @property
  def sha256(self) -> str:
    return tokenizer_sha256(self.state)

  def manifest_entry(self) -> dict:
    return {"name": self.name, "spec": self.spec, "vocab_size": self.vocab_size,
            "eos_id": self.eos_id, "sha256": self.sha256, "file": TOKENIZER}


def _hf():
  try:
    import tokenizers  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("bpe, hf and gpt2 tokenizers need the `tokenizers` package: "
                     "pip install 'tfjax[data]'") from None
  return tokenizers


def _read_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _tokenizer_file(directory: str, flag: str) -> str:
  path = directory if directory.endswith(".json") else os.path.join(directory, TOKENIZER)
  if not os.path.exists(path):
    raise FileNotFoundError(f"--tokenizer={flag}: no {path}")
  return path


def _hf_state(path: str, flag: str) -> tuple[dict, Optional[int]]:
  """(tfjax 'hf' state, eos id) of a Hugging Face or tfjax-saved tokenizer.json."""
  data = _read_json(path)
  if data.get("type") in ("hf", "bpe") and "hf_tokenizer" in data:  # tfjax's format
    special = data.get("special") or {}
    return ({"type": "hf", "special": special, "hf_tokenizer": data["hf_tokenizer"]},
            special.get("eos_id"))
  if "model" not in data:
    raise ValueError(f"--tokenizer={flag}: {path} is not a Hugging Face tokenizer.json")
  hf_text = _hf().Tokenizer.from_file(path).to_str()
  eos_id = None
  config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
  if os.path.exists(config_path):
    eos = _read_json(config_path).get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos:
      eos_id = _hf().Tokenizer.from_str(hf_text).token_to_id(eos)
  special = {"bos_id": None, "eos_id": eos_id, "pad_id": None, "decoder_start_id": None}
  return {"type": "hf", "special": special, "hf_tokenizer": hf_text}, eos_id


def gpt2_tokenizer_file() -> Optional[str]:
  """GPT-2's tokenizer.json on this machine, or None."""
  given = os.environ.get(GPT2_ENV)
  if given:
    return _tokenizer_file(given, f"gpt2 (${GPT2_ENV}={given})")
  hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
      os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"),
      "hub")
  for repo in ("models--gpt2", "models--openai-community--gpt2"):
    found = sorted(glob.glob(os.path.join(hub, repo, "snapshots", "*", TOKENIZER)))
    if found:
      return found[-1]
  return None


def resolve(flag: str, documents: Optional[Iterable[str]] = None) -> TokenizerSpec:
  """The tokenizer named by `flag`; `documents` (an iterable of the corpus) only for 'char'."""
  if flag == "byte":
    return TokenizerSpec("byte", flag, {"type": "byte"}, 256, None)
  if flag == "char":
    chars = set()
    for text in documents or ():
      chars.update(text)
    if not chars:
      raise ValueError("--tokenizer=char: the corpus has no characters")
    chars = "".join(sorted(chars))
    return TokenizerSpec("char", flag, {"type": "char", "chars": chars}, len(chars), None)
  if flag == "gpt2":
    path = gpt2_tokenizer_file()
    if path is None:
      raise ValueError(
          "--tokenizer=gpt2 needs GPT-2's tokenizer.json on disk (no network here, and it cannot "
          "be rebuilt offline): fetch it once where there is network (`huggingface-cli download "
          f"gpt2 tokenizer.json`) and set ${GPT2_ENV}=FILE, or pass --tokenizer=hf:DIR")
    state, _ = _hf_state(path, flag)
    hf = _hf().Tokenizer.from_str(state["hf_tokenizer"])
    size = hf.get_vocab_size(with_added_tokens=True)
    if size != GPT2_VOCAB or hf.token_to_id("<|endoftext|>") != GPT2_EOS:
      raise ValueError(f"--tokenizer=gpt2: {path} is not GPT-2's tokenizer ({size} ids, "
                       f"<|endoftext|> = {hf.token_to_id('<|endoftext|>')}); pass it as "
                       "--tokenizer=hf:DIR if it is what you want")
    state["special"] = {"bos_id": GPT2_EOS, "eos_id": GPT2_EOS, "pad_id": None,
                        "decoder_start_id": None}
    return TokenizerSpec("gpt2", flag, state, size, GPT2_EOS)
  kind, _, directory = flag.partition(":")
  if kind in ("bpe", "hf") and directory:
    path = _tokenizer_file(directory, flag)
    if kind == "bpe":
      state = _read_json(path)
      if state.get("type") != "bpe":
        raise ValueError(f"--tokenizer={flag}: {path} holds a {state.get('type')!r} tokenizer, "
                         "not tfjax's 'bpe' (for a Hugging Face tokenizer.json use hf:DIR)")
      hf = _hf().Tokenizer.from_str(state["hf_tokenizer"])
      return TokenizerSpec("bpe", flag, state, hf.get_vocab_size(), None)
    state, eos_id = _hf_state(path, flag)
    size = _hf().Tokenizer.from_str(state["hf_tokenizer"]).get_vocab_size(with_added_tokens=True)
    return TokenizerSpec("hf", flag, state, size, eos_id)
  raise ValueError(f"--tokenizer={flag!r}: choose one of {', '.join(KINDS)}")


class Encoder:
  """Encodes batches of documents with a saved tokenizer state (rebuilt in each worker process).
  HF tokenizers encode with their special tokens, as tfjax.data.tokenizers.HFTokenizer does."""

  def __init__(self, state: dict):
    self.kind = state["type"]
    if self.kind == "char":
      self._codes = np.frombuffer(state["chars"].encode("utf-32-le"), dtype="<u4")
    elif self.kind in ("bpe", "hf"):
      self._tok = _hf().Tokenizer.from_str(state["hf_tokenizer"])

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    if self.kind == "byte":
      return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    if self.kind == "char":
      out = []
      for t in texts:
        codes = np.frombuffer(t.encode("utf-32-le"), dtype="<u4")
        ids = np.searchsorted(self._codes, codes)
        if (ids >= len(self._codes)).any() or (self._codes[np.minimum(
            ids, len(self._codes) - 1)] != codes).any():
          raise ValueError("char tokenizer: a character outside the vocabulary collected by the "
                           "first pass (did an input change during the prepare?)")
        out.append(ids)
      return out
    return [np.asarray(e.ids) for e in self._tok.encode_batch(texts)]
