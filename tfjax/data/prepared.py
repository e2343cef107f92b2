"""Training batches from a prepared directory (tfjax-prepare, tfjax.data.manifest):
`data.name='prepared'`, `data.path=DIR`.

Shards stay on disk: a batch reads only its own rows' tokens (tfjax.data.manifest.TokenFile, from
the page cache once warm), so memory does not grow with the corpus. The multi-host contract of
tfjax.data.datasets holds: row r of training batch i is a pure function of (seed, i, r), drawn
with the same counter-based hash, so each process reads only its rows and resuming needs only the
batch index.

  mode='random': a window of L+1 tokens (L for mlm) uniform over every window that lies inside
    one shard (nanoGPT's sampling; documents are back to back, each ended by the tokenizer's
    end-of-text id when the prepare appended it).
  mode='packed': documents are cut into pieces of at most L tokens (as pack_documents cuts them);
    a row starts at the piece holding a uniformly drawn token and takes the following pieces, in
    corpus order, while whole pieces fit; the rest is padding. Each piece is its own segment, so
    attention and targets never cross a document.

The validation split is small by design (tfjax-prepare --val_fraction / --val_docs); sequential
evaluation reads it into memory. The tokenizer is the one saved in the prepared directory.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from tfjax.data import manifest as mf
from tfjax.nn.choices import one_of
from tfjax.runtime import files
from tfjax.data.text_dataset import EVAL_MODES, MODES, TextDataset, text_vocab_size
from tfjax.data.hashed_rng import _randint, hash_bits
from tfjax.data.packing import _packed_lm_targets, pack_documents
from tfjax.data.tokenizers import TOKENIZER_FILE, load_tokenizer

VERIFY = ("checksum", "size")


def check_tokenizer(directory: str, manifest: dict, *, expect: str = "",
                    run_dir: Optional[str] = None) -> None:
  """The prepared tokenizer is the one the config (`expect`: a name like 'gpt2', or a sha256
  prefix) and the run (the tokenizer saved in `run_dir`, when it has one) were built for."""
  entry = manifest["tokenizer"]
  if expect and expect not in (entry["name"], entry["spec"]) and not (
      len(expect) >= 8 and entry["sha256"].startswith(expect)):
    raise ValueError(f"data.path={directory} was prepared with tokenizer {entry['spec']!r} but the "
                     f"config expects {expect!r} (data.expect_tokenizer): prepare the corpus with "
                     f"--tokenizer={expect}, or change data.expect_tokenizer")
  saved = os.path.join(run_dir, TOKENIZER_FILE) if run_dir else None
  if saved and os.path.exists(saved) and mf.tokenizer_sha256(
      files.read_json(saved)) != entry["sha256"]:
    raise ValueError(f"data.path={directory} was prepared with tokenizer {entry['spec']!r}, not "
                     f"the tokenizer of the run in {run_dir}: use a directory prepared with that "
                     "run's tokenizer, or a fresh workdir")


class _Split:
  """The shards of one split, and the two ways rows are drawn from them."""

  def __init__(self, shards: list, name: str, source: str):
    self.tokens = [t for t, _ in shards]
    self.doc_ends = [d for _, d in shards]
    self.name, self.source = name, source
    self.shard_tokens = np.cumsum([len(t) for t in self.tokens])
    self._windows_per_shard = {}  # width -> cumulative count of the windows inside each shard

  def windows(self, bits: np.ndarray, width: int) -> np.ndarray:
    """[rows, width] int32: uniform over the windows lying inside one shard."""
    if width not in self._windows_per_shard:
      per_shard = np.maximum(np.asarray([len(t) for t in self.tokens]) - width + 1, 0)
      self._windows_per_shard[width] = np.cumsum(per_shard)
    cumulative = self._windows_per_shard[width]
    if cumulative[-1] == 0:
      again = (f", or prepare the corpus again with --min_val_tokens={8 * width} --overwrite"
               if self.name == "val" else "")
      raise ValueError(f"{self.source}: no {self.name} shard holds {width} tokens (the longest "
                       f"has {max(len(t) for t in self.tokens)}); lower data.seq_len{again}")
    picks = _randint(bits, int(cumulative[-1]))
    shard_ids = np.searchsorted(cumulative, picks, side="right")
    starts = picks - np.concatenate([[0], cumulative])[shard_ids]
    return np.stack([np.asarray(self.tokens[s][i:i + width], np.int32)
                     for s, i in zip(shard_ids, starts)])

  def packed_rows(self, bits: np.ndarray, length: int) -> dict:
    """tokens, segment_ids, positions [rows, length] int32 (see the module docstring)."""
    picks = _randint(bits, int(self.shard_tokens[-1]))
    shard_ids = np.searchsorted(self.shard_tokens, picks, side="right")
    offsets = picks - np.concatenate([[0], self.shard_tokens])[shard_ids]
    out = {k: np.zeros((len(picks), length), np.int32)
           for k in ("tokens", "segment_ids", "positions")}
    for row, (s, offset) in enumerate(zip(shard_ids, offsets)):
      tokens, ends = self.tokens[s], self.doc_ends[s]
      # uint64 on both sides: a mixed-type search would convert (read) all of `ends` every time.
      doc = int(np.searchsorted(ends, np.uint64(offset), side="right"))
      doc_start = int(ends[doc - 1]) if doc else 0
      position = doc_start + (int(offset) - doc_start) // length * length  # its piece's start
      used, segment = 0, 1
      while doc < len(ends):
        piece = min(length, int(ends[doc]) - position)
        if used + piece > length:
          break
        out["tokens"][row, used:used + piece] = tokens[position:position + piece]
        out["segment_ids"][row, used:used + piece] = segment
        out["positions"][row, used:used + piece] = np.arange(piece)
        used, segment, position = used + piece, segment + 1, position + piece
        if position == int(ends[doc]):
          doc += 1
    return out

  def documents(self) -> list:
    """Every document as an int32 array (for sequential evaluation of the small val split)."""
    out = []
    for tokens, ends in zip(self.tokens, self.doc_ends):
      starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
      out += [np.asarray(tokens[a:b], np.int32) for a, b in zip(starts, np.asarray(ends, np.int64))]
    return out


class PreparedDataset(TextDataset):
  """A prepared directory for task 'lm' or 'mlm' (TextDataset's batches and attributes, except
  that `train_tokens` is not loaded; `val_tokens` loads the val split on first use)."""

  def __init__(self, directory: str, *, task: str = "lm", seq_len: int = 256,
               mode: str = "random", eval_mode: str = "random", mlm_prob: float = 0.15,
               seed: int = 0, eval_seed: int = 1234, verify: str = "checksum",
               expect_tokenizer: str = "", run_dir: Optional[str] = None):
    if task not in ("lm", "mlm"):
      raise ValueError(f"prepared datasets support tasks 'lm' and 'mlm', not {task!r}")
    one_of("data.mode", mode, MODES)
    one_of("data.eval_mode", eval_mode, EVAL_MODES)
    one_of("data.verify", verify, VERIFY)
    if seq_len < 1:
      raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    manifest = mf.read_manifest(directory)
    mf.verify(directory, manifest, checksums=verify == "checksum")
    check_tokenizer(directory, manifest, expect=expect_tokenizer, run_dir=run_dir)
    self.manifest, self.source = manifest, directory
    self.tokenizer = load_tokenizer(directory)
    self.task, self.mode, self.seq_len, self.eval_mode = task, mode, int(seq_len), eval_mode
    self.mlm_prob, self.seed, self.eval_seed = float(mlm_prob), int(seed), int(eval_seed)
    self.mask_id = self.tokenizer.vocab_size if task == "mlm" else None
    self.vocab_size = text_vocab_size(self.tokenizer.vocab_size, task)
    self._splits = {split: _Split(mf.open_shards(directory, manifest, split), split, directory)
                    for split in mf.SPLITS}
    self._packed = {}
    self._val_tokens = None

  @property
  def val_tokens(self) -> np.ndarray:
    if self._val_tokens is None:
      self._val_tokens = np.concatenate([np.asarray(t, np.int32)
                                         for t in self._splits["val"].tokens])
    return self._val_tokens

  def _random_batch(self, split: str, key: tuple, rows: np.ndarray, mask_seed: tuple) -> dict:
    bits = hash_bits(*key, rows)
    if self.mode == "packed":
      packed = self._splits[split].packed_rows(bits, self.seq_len)
      if self.task == "lm":
        packed["targets"], packed["weights"] = _packed_lm_targets(packed["tokens"],
                                                                  packed["segment_ids"])
      batch = self._from_packed(packed, np.arange(len(rows)))
    else:
      width = self.seq_len + (1 if self.task == "lm" else 0)
      windows = self._splits[split].windows(bits, width)
      batch = self._from_windows(windows, np.ones(windows.shape, bool))
    if self.task == "mlm":
      batch = self._mask(batch, mask_seed, rows)
    return batch

  def _sequential_rows(self) -> dict:
    if self.mode == "packed" and "val" not in self._packed:
      docs = [d for d in self._splits["val"].documents() if len(d) >= 2]
      packed = pack_documents(docs, self.seq_len)
      if self.task == "lm":
        packed["targets"], packed["weights"] = _packed_lm_targets(packed["tokens"],
                                                                  packed["segment_ids"])
      self._packed["val"] = packed
    return super()._sequential_rows()
