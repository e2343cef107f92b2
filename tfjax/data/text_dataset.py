"""Text files as batches of token ids for 'lm' and 'mlm': `TextDataset` and its random /
packed row layouts (the batch formats are in tfjax/data/datasets.py's docstring). Rows are pure
functions of (seed, index, row) through tfjax.data.hashed_rng, so any process builds any row."""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from tfjax.data.hashed_rng import _randint, hash_bits, mask_tokens
from tfjax.data.packing import _packed_lm_targets, pack_documents
from tfjax.data.synthetic import row_range
from tfjax.data.text_files import split_text
from tfjax.data.tokenizers import Tokenizer
from tfjax.nn.choices import one_of

MODES = ("random", "packed")
EVAL_MODES = ("random", "sequential")
DOC_SPLITS = ("blank_lines", "chunks")

# Stream tags keep the random numbers of different uses independent for the same seed.
_TRAIN, _EVAL, _TRAIN_MASK, _EVAL_MASK = 0, 1, 2, 3

def text_vocab_size(tokenizer_vocab_size: int, task: str) -> int:
  """The model vocabulary of a text dataset: the tokenizer's, + 1 for [MASK] when task='mlm'."""
  return tokenizer_vocab_size + (1 if task == "mlm" else 0)


class TextDataset:
  """A tokenized text file for task 'lm' or 'mlm', split into train / val (see module docstring).

  Attributes: `tokenizer`, `task`, `mode`, `seq_len` (L), `vocab_size` (model vocabulary: the
  tokenizer's, + 1 for [MASK] when task='mlm'), `mask_id` (mlm, else None), `source` (file path),
  `train_tokens`, `val_tokens` (int32 arrays of each split).
  """

  def __init__(self, text: str, tokenizer: Tokenizer, *, source: str, task: str = "lm",
               seq_len: int = 256, val_fraction: float = 0.1, mode: str = "random",
               doc_split: str = "blank_lines", doc_chunk_tokens: int = 128,
               eval_mode: str = "random", mlm_prob: float = 0.15, seed: int = 0,
               eval_seed: int = 1234):
    if task not in ("lm", "mlm"):
      raise ValueError(f"text datasets support tasks 'lm' and 'mlm', not {task!r}")
    one_of("data.mode", mode, MODES)
    one_of("data.eval_mode", eval_mode, EVAL_MODES)
    one_of("data.doc_split", doc_split, DOC_SPLITS)
    if seq_len < 1:
      raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    self.tokenizer, self.task, self.mode, self.seq_len = tokenizer, task, mode, int(seq_len)
    self.source, self.eval_mode, self.mlm_prob = source, eval_mode, float(mlm_prob)
    self.seed, self.eval_seed = int(seed), int(eval_seed)
    self.mask_id = tokenizer.vocab_size if task == "mlm" else None
    self.vocab_size = text_vocab_size(tokenizer.vocab_size, task)

    train_text, val_text = split_text(text, val_fraction)
    self.train_tokens = tokenizer.encode(train_text)
    self.val_tokens = tokenizer.encode(val_text)
    minimum = self.seq_len + 1
    for split, tokens in (("train", self.train_tokens), ("val", self.val_tokens)):
      if len(tokens) < minimum:
        raise ValueError(
            f"{source} is too short: its {split} split has {len(tokens)} tokens ({len(text)} "
            f"characters in the file, val_fraction={val_fraction}), but seq_len={self.seq_len} "
            f"needs at least {minimum} tokens in each split")
    if mode == "packed":
      self._packed = {
          "train": self._pack(train_text, self.train_tokens, doc_split, doc_chunk_tokens),
          "val": self._pack(val_text, self.val_tokens, doc_split, doc_chunk_tokens),
      }

  def _pack(self, text, tokens, doc_split, doc_chunk_tokens) -> dict:
    if doc_split == "blank_lines":
      paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
      docs = self.tokenizer.encode_batch(paragraphs)
    else:
      docs = [tokens[i:i + doc_chunk_tokens] for i in range(0, len(tokens), doc_chunk_tokens)]
    # A one-token document has nothing to predict (lm) and nothing to attend to (mlm): drop it.
    packed = pack_documents([d for d in docs if len(d) >= 2], self.seq_len)
    if not len(packed["tokens"]):
      raise ValueError(f"{self.source}: no document of >= 2 tokens to pack (doc_split={doc_split})")
    if self.task == "lm":
      packed["targets"], packed["weights"] = _packed_lm_targets(packed["tokens"],
                                                                packed["segment_ids"])
    return packed

  # --- batches --------------------------------------------------------------------------------

  def train_batch(self, index: int, batch_size: int, row_start: int = 0,
                  row_count: Optional[int] = None) -> dict:
    """Rows [row_start, row_start+row_count) of global training batch `index`."""
    rows = np.asarray(row_range(batch_size, row_start, row_count))
    return self._random_batch("train", (self.seed, _TRAIN, index), rows,
                              mask_seed=(self.seed, _TRAIN_MASK, index))

  def eval_batches(self, batch_size: int, num_batches: Optional[int] = None, *,
                   mode: Optional[str] = None, row_start: int = 0,
                   row_count: Optional[int] = None) -> list:
    """[('val', batch)] from the validation split, the same in every run.

    mode (default: the dataset's eval_mode): 'random' = `num_batches` batches of random rows drawn
    with eval_seed (nanoGPT's estimate_loss); 'sequential' = the split in order (lm random mode:
    non-overlapping windows, every target counted once; packed: the packed rows in order), at
    most `num_batches` batches (None = all); the tail is padded with weight-0 rows.
    """
    mode = self.eval_mode if mode is None else mode
    one_of("eval mode", mode, EVAL_MODES)
    rows = np.asarray(row_range(batch_size, row_start, row_count))
    if mode == "random":
      if num_batches is None:
        raise ValueError("random eval needs num_batches")
      return [("val", self._random_batch("val", (self.eval_seed, _EVAL, b), rows,
                                         mask_seed=(self.eval_seed, _EVAL_MASK, b)))
              for b in range(num_batches)]
    all_rows = self._sequential_rows()
    total = -(-len(all_rows["inputs"]) // batch_size)
    num_batches = total if num_batches is None else min(num_batches, total)
    out = []
    for b in range(num_batches):
      ids = b * batch_size + rows
      present = ids < len(all_rows["inputs"])
      batch = {k: np.where(present.reshape((-1,) + (1,) * (v.ndim - 1)),
                           v[np.minimum(ids, len(v) - 1)], 0).astype(v.dtype)
               for k, v in all_rows.items()}
      if self.task == "mlm":
        batch = self._mask(batch, (self.eval_seed, _EVAL_MASK, b), ids)
      out.append(("val", batch))
    return out

  def _random_batch(self, split: str, key: tuple, rows: np.ndarray, mask_seed: tuple) -> dict:
    bits = hash_bits(*key, rows)
    if self.mode == "packed":
      packed = self._packed[split]
      picked = _randint(bits, len(packed["tokens"]))  # rows sampled with replacement
      batch = self._from_packed(packed, picked)
    else:
      tokens = self.train_tokens if split == "train" else self.val_tokens
      width = self.seq_len + (1 if self.task == "lm" else 0)
      starts = _randint(bits, len(tokens) - width + 1)
      windows = tokens[starts[:, None] + np.arange(width)[None, :]]
      batch = self._from_windows(windows, np.ones(windows.shape, bool))
    if self.task == "mlm":
      batch = self._mask(batch, mask_seed, rows)
    return batch

  def _from_windows(self, windows, valid) -> dict:
    if self.task == "lm":
      return {"inputs": windows[:, :-1], "targets": windows[:, 1:],
              "weights": valid[:, 1:].astype(np.float32)}
    return {"inputs": windows, "targets": windows.copy(), "weights": valid.astype(np.float32)}

  def _from_packed(self, packed, picked) -> dict:
    batch = {"inputs": packed["tokens"][picked], "segment_ids": packed["segment_ids"][picked],
             "positions": packed["positions"][picked]}
    if self.task == "lm":
      batch["targets"], batch["weights"] = packed["targets"][picked], packed["weights"][picked]
    else:
      batch["targets"] = batch["inputs"].copy()
      batch["weights"] = (batch["segment_ids"] != 0).astype(np.float32)
    return batch

  def _mask(self, batch, seed, rows) -> dict:
    # Before masking, weights mark the real tokens (padding 0): only those may be selected.
    masked, targets, weights = mask_tokens(
        batch["inputs"], seed, self.tokenizer.vocab_size, self.mask_id,
        maskable=batch["weights"] > 0, prob=self.mlm_prob, rows=rows)
    return {**batch, "inputs": masked, "targets": targets, "weights": weights}

  def _sequential_rows(self) -> dict:
    """Every validation row in order, unmasked."""
    if self.mode == "packed":
      packed = self._packed["val"]
      return self._from_packed(packed, np.arange(len(packed["tokens"])))
    tokens, length = self.val_tokens, self.seq_len
    if self.task == "lm":
      # Windows of L+1 tokens overlapping by one: each target appears once; the tail window is
      # padded (padding sits after the real tokens, so causal attention never sees it).
      starts = np.arange(0, len(tokens) - 1, length)
      idx = starts[:, None] + np.arange(length + 1)[None, :]
    else:
      # Bidirectional attention would see padding, so only whole windows; the tail is dropped.
      starts = np.arange(0, len(tokens) - length + 1, length)
      idx = starts[:, None] + np.arange(length)[None, :]
    valid = idx < len(tokens)
    windows = np.where(valid, tokens[np.minimum(idx, len(tokens) - 1)], 0).astype(np.int32)
    return self._from_windows(windows, valid)

  def decode(self, ids) -> str:
    """Token ids -> text; the [MASK] id (mlm) shows as '[MASK]'."""
    ids = np.asarray(ids).reshape(-1)
    if self.mask_id is None:
      return self.tokenizer.decode(ids)
    parts, run = [], []
    for i in ids:
      if i == self.mask_id:
        parts += [self.tokenizer.decode(run), "[MASK]"]
        run = []
      else:
        run.append(int(i))
    return "".join(parts) + self.tokenizer.decode(run)
