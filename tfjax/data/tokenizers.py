"""Tokenizers for text datasets: `byte`, `char`, `bpe` and `hf`, all pure NumPy at the interface.

Every tokenizer has `name`, `vocab_size`, `encode(str) -> np.ndarray[int32]`, `decode(ids) -> str`,
`save(dir)` and the classmethod `load(dir)`. `make_tokenizer(name, corpus_text, workdir)` builds one
(training it on the corpus where needed) or, when the workdir already holds one, loads that, so a
resumed run keeps the vocabulary it started with even if the corpus changed.

No id is reserved for padding: every id 0..vocab_size-1 is a real token. Where a batch needs
padding it uses id 0 and marks those positions with segment_ids 0 / weights 0. A dataset that needs
extra ids (the [MASK] of masked LM) appends them after `vocab_size` and says so in its own
`vocab_size`.

`hf` is a Hugging Face `tokenizer.json` (with the model's special token ids) brought in by
`python -m tfjax.hf import`; it is never trained here, only loaded from a run directory (an imported
run, or the `config.init_from` run of a fine-tune).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

import numpy as np

from tfjax.nn.choices import one_of

from tfjax.runtime import files

TOKENIZER_FILE = "tokenizer.json"


class Tokenizer:
  """Interface shared by all tokenizers."""

  name: str
  vocab_size: int

  def encode(self, text: str) -> np.ndarray:
    raise NotImplementedError

  def decode(self, ids: Iterable[int]) -> str:
    raise NotImplementedError

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [self.encode(t) for t in texts]

  def _state(self) -> dict:
    return {}

  def save(self, directory: str) -> str:
    """Writes `<directory>/tokenizer.json`; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, TOKENIZER_FILE)
    # Several processes of a multi-host run may save the same (identical) tokenizer into a shared
    # workdir; written atomically, a reader never sees a half-written file.
    files.write_json_atomic(path, {"type": self.name, **self._state()}, ensure_ascii=False)
    return path

  @classmethod
  def load(cls, directory: str) -> "Tokenizer":
    """Loads the tokenizer saved in `directory`; it must be of this class's type."""
    tok = load_tokenizer(directory)
    if not isinstance(tok, cls):
      raise ValueError(f"{directory} holds a '{tok.name}' tokenizer, not '{cls.name}'")
    return tok


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes: 256 ids, nothing to train. Decoding replaces invalid UTF-8 with U+FFFD."""

  name = "byte"
  vocab_size = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decode(self, ids: Iterable[int]) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() > 255):
      raise ValueError(f"byte ids must be in [0, 256), got range [{ids.min()}, {ids.max()}]")
    return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class CharTokenizer(Tokenizer):
  """One id per character; the vocabulary is the sorted unique characters of the corpus."""

  name = "char"

  def __init__(self, chars: str):
    chars = "".join(sorted(set(chars)))
    if not chars:
      raise ValueError("char tokenizer needs a non-empty corpus to build its vocabulary")
    self.chars = chars
    self.vocab_size = len(chars)
    # Code points sorted ascending == Python's sort order of str, so searchsorted maps char -> id.
    self._codes = np.frombuffer(chars.encode("utf-32-le"), dtype="<u4")
    self._char_array = np.array(list(chars), dtype=object)

  @classmethod
  def train(cls, corpus_text: str) -> "CharTokenizer":
    return cls(corpus_text)

  def encode(self, text: str) -> np.ndarray:
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    ids = np.searchsorted(self._codes, codes)
    ids_clipped = np.minimum(ids, self.vocab_size - 1)
    unknown = self._codes[ids_clipped] != codes
    if unknown.any():
      missing = sorted({chr(c) for c in codes[unknown][:1000]})
      raise ValueError(f"char tokenizer: characters not in the vocabulary: {missing[:20]!r}")
    return ids.astype(np.int32)

  def decode(self, ids: Iterable[int]) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return "".join(self._char_array[ids])

  def _state(self) -> dict:
    return {"chars": self.chars}


class BPETokenizer(Tokenizer):
  """Byte-level BPE trained locally with the `tokenizers` package (optional dependency).

  Byte-level pre-tokenization makes every string encodable and `decode(encode(s)) == s` exact.
  """

  name = "bpe"

  def __init__(self, hf_tokenizer, requested_vocab_size: int):
    self._tok = hf_tokenizer
    self.requested_vocab_size = int(requested_vocab_size)
    # A small corpus can run out of merges before the requested size: report the real size.
    self.vocab_size = hf_tokenizer.get_vocab_size()

  @classmethod
  def train(cls, corpus_text: str, vocab_size: int) -> "BPETokenizer":
    hf = _import_hf_tokenizers()
    if vocab_size < 256:
      raise ValueError(f"bpe_vocab_size must be >= 256 (the byte alphabet), got {vocab_size}")
    tok = hf.Tokenizer(hf.models.BPE())
    tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator([corpus_text], trainer=trainer)
    return cls(tok, vocab_size)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text).ids, dtype=np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)])

  def _state(self) -> dict:
    return {"requested_vocab_size": self.requested_vocab_size, "hf_tokenizer": self._tok.to_str()}


class HFTokenizer(Tokenizer):
  """A pretrained Hugging Face tokenizer (tokenizer.json) with its model's special token ids.

  `encode` adds the special tokens the tokenizer's post-processor defines (LLaMA's BOS, BERT's
  [CLS] ... [SEP]), as `transformers` does by default; `decode` drops special tokens. `special`
  holds bos_id, eos_id, pad_id and decoder_start_id (None where the model has none).
  """

  name = "hf"

  def __init__(self, hf_tokenizer, special: Optional[dict] = None):
    self._tok = hf_tokenizer
    self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
    self.special = {k: special.get(k) if special else None for k in SPECIAL_IDS}

  @classmethod
  def from_file(cls, path: str, special: Optional[dict] = None) -> "HFTokenizer":
    return cls(_import_hf_tokenizers().Tokenizer.from_file(path), special)

  @property
  def eos_id(self) -> Optional[int]:
    return self.special["eos_id"]

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text).ids, dtype=np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                            skip_special_tokens=True)

  def to_str(self) -> str:
    """The Hugging Face tokenizer.json text."""
    return self._tok.to_str()

  def _state(self) -> dict:
    return {"special": self.special, "hf_tokenizer": self._tok.to_str()}


SPECIAL_IDS = ("bos_id", "eos_id", "pad_id", "decoder_start_id")


def _import_hf_tokenizers():
  try:
    import tokenizers as hf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        "the 'bpe' and 'hf' tokenizers need the optional `tokenizers` package: "
        "pip install 'tfjax[bpe]'"
    ) from e
  return hf


TOKENIZERS = {"byte": ByteTokenizer, "char": CharTokenizer, "bpe": BPETokenizer,
              "hf": HFTokenizer}


def _check_name(name: str) -> None:
  one_of("tokenizer", name, sorted(TOKENIZERS))


def load_tokenizer(directory: str) -> Tokenizer:
  """Loads whatever tokenizer `save` wrote into `directory`."""
  path = os.path.join(directory, TOKENIZER_FILE)
  state = files.read_json(path)
  name = state.get("type")
  _check_name(name)
  if name == "byte":
    return ByteTokenizer()
  if name == "char":
    return CharTokenizer(state["chars"])
  hf = _import_hf_tokenizers()
  if name == "hf":
    return HFTokenizer(hf.Tokenizer.from_str(state["hf_tokenizer"]), state.get("special"))
  return BPETokenizer(hf.Tokenizer.from_str(state["hf_tokenizer"]), state["requested_vocab_size"])


def make_tokenizer(name: str, corpus_text: str, workdir: Optional[str],
                   *, bpe_vocab_size: int = 1024) -> Tokenizer:
  """Returns tokenizer `name`, loaded from `workdir` if saved there, else built and saved there.

  `corpus_text` builds the char vocabulary / trains BPE (byte ignores it). `workdir=None` builds
  without saving. A saved tokenizer of another type or BPE size is an error, not silently reused.
  """
  _check_name(name)
  if workdir is not None and os.path.exists(os.path.join(workdir, TOKENIZER_FILE)):
    tok = load_tokenizer(workdir)
    if tok.name != name:
      raise ValueError(f"workdir {workdir} holds a '{tok.name}' tokenizer but '{name}' was asked "
                       "for; use a fresh workdir or the same tokenizer")
    if name == "bpe" and tok.requested_vocab_size != bpe_vocab_size:
      raise ValueError(f"workdir {workdir} holds a bpe tokenizer trained for vocab size "
                       f"{tok.requested_vocab_size}, but {bpe_vocab_size} was asked for")
    return tok
  if name == "hf":
    raise ValueError(
        "tokenizer 'hf' is a pretrained Hugging Face tokenizer and is not built from a corpus: "
        f"{workdir} has none. Import a model with `python -m tfjax.hf import`, or fine-tune one "
        "with --config.init_from=RUN (the tokenizer comes from RUN)")
  if name == "byte":
    tok = ByteTokenizer()
  elif name == "char":
    tok = CharTokenizer.train(corpus_text)
  else:
    tok = BPETokenizer.train(corpus_text, bpe_vocab_size)
  if workdir is not None:
    tok.save(workdir)
  return tok
