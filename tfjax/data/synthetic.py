"""Synthetic algorithmic tasks for length-generalization experiments, pure NumPy.

Tasks (the "length" n of an example means, per task):
  copy                n symbols -> the same n symbols
  reverse             n symbols -> them reversed
  sort                n symbols -> them sorted ascending (by symbol id)
  addition            two n-digit operands "a+b" -> the sum as exactly n+1 digits, most significant
                      first (plain order, zero-padded: 123+989 -> 1112, 001+002 -> 0003). Operands
                      are n uniform digits, so leading zeros occur. Symbols: 0-9 and '+';
                      `num_symbols` is ignored.
  associative_recall  n key-value pairs (distinct keys) then a query key -> its value
                      (needs n <= num_symbols)
  majority            n symbols -> the class of the strictly most frequent symbol (ties are
                      broken at generation time by flipping one occurrence), an encoder
                      sequence-classification task (task='classification')
  listops             ListOps as the Long Range Arena generates it (tfjax.data.listops): an
                      expression of n // 4 to n tokens -> its value, 10 classes
                      (task='classification'); fixed alphabet, `num_symbols` is ignored

Vocabulary: PAD=0, BOS=1, SEP=2, EOS=3, then the task's symbols from id 4 on (`vocab_size`).
BOS doubles as the [CLS] token of classification rows.

Determinism: training row r of batch `index` comes from np.random.default_rng([seed, 0, index, r])
and evaluation row r of batch b at test length n from default_rng([eval_seed, 1, n, b, r]): pure
functions of those numbers (the multi-host contract of tfjax.data.datasets), and the stream tag
(0 vs 1) keeps the eval examples' random streams disjoint from training ones whatever the two
seeds are.
Training lengths are drawn uniformly from `train_lengths` (inclusive); evaluation has one group per
test length, so training on <= N and testing up to 2N measures length generalization.

Every batch of a dataset has the same shape: rows are padded to what the longest of the training
and test lengths needs, so a jitted step compiles once.

Batch layouts (all int32 but `weights` float32; padding is id 0 with segment id 0 / weight 0):
  decoder form (task='lm'): one row = [BOS] prompt [SEP] answer [EOS], then
    inputs [B,L] = row[:-1], targets [B,L] = row[1:], weights [B,L] = 1 where the target is an
    answer token or EOS, segment_ids [B,L] = 1 on real input tokens.
  seq2seq form (task='seq2seq'):
    encoder_inputs [B,Le] = prompt, encoder_segment_ids [B,Le],
    decoder_inputs [B,Ld] = [BOS] answer, targets [B,Ld] = answer [EOS], weights [B,Ld],
    decoder_segment_ids [B,Ld].
  classification (majority, task='classification'):
    inputs [B,L] = [BOS] sequence, segment_ids [B,L], labels [B] in [0, num_classes),
    weights [B] = 1.
"""

from __future__ import annotations

import string
from typing import Optional, Sequence

import numpy as np

from tfjax.data import listops
from tfjax.nn.choices import one_of

PAD, BOS, SEP, EOS = 0, 1, 2, 3
NUM_SPECIAL = 4
_SPECIAL_STRINGS = ("_", "^", "|", "$")
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


def _symbol_strings(n: int) -> list[str]:
  letters = string.ascii_lowercase + string.ascii_uppercase
  return [letters[i] if i < len(letters) else f"<{i}>" for i in range(n)]


class _Task:
  """One task: examples as (prompt, answer) arrays of symbol indices (0-based, before offset)."""

  name = ""
  is_classification = False

  def __init__(self, num_symbols: int):
    if num_symbols < 2:
      raise ValueError(f"num_symbols must be >= 2, got {num_symbols}")
    self.num_symbols = num_symbols
    self.symbol_strings = _symbol_strings(num_symbols)

  def check_length(self, n: int) -> None:
    if n < 1:
      raise ValueError(f"{self.name}: lengths must be >= 1, got {n}")

  def prompt_len(self, n: int) -> int:
    return n

  def answer_len(self, n: int) -> int:
    return n

  def generate(self, rng: np.random.Generator, n: int):
    raise NotImplementedError


class _Copy(_Task):
  name = "copy"

  def generate(self, rng, n):
    x = rng.integers(0, self.num_symbols, n)
    return x, x


class _Reverse(_Task):
  name = "reverse"

  def generate(self, rng, n):
    x = rng.integers(0, self.num_symbols, n)
    return x, x[::-1]


class _Sort(_Task):
  name = "sort"

  def generate(self, rng, n):
    x = rng.integers(0, self.num_symbols, n)
    return x, np.sort(x)


class _Addition(_Task):
  name = "addition"
  _PLUS = 10

  def __init__(self, num_symbols: int):
    del num_symbols  # fixed alphabet: digits 0-9 and '+'
    super().__init__(11)
    self.symbol_strings = list("0123456789+")

  def prompt_len(self, n):
    return 2 * n + 1

  def answer_len(self, n):
    return n + 1

  def generate(self, rng, n):
    a, b = rng.integers(0, 10, n), rng.integers(0, 10, n)
    total = int("".join(map(str, a))) + int("".join(map(str, b)))
    answer = np.array([int(d) for d in str(total).zfill(n + 1)])
    return np.concatenate([a, [self._PLUS], b]), answer


class _AssociativeRecall(_Task):
  name = "associative_recall"

  def check_length(self, n):
    super().check_length(n)
    if n > self.num_symbols:
      raise ValueError(f"associative_recall: {n} pairs need distinct keys, but num_symbols is "
                       f"{self.num_symbols}; raise num_symbols or lower the lengths")

  def prompt_len(self, n):
    return 2 * n + 1  # k1 v1 ... kn vn q: odd length, so the query is unambiguous

  def answer_len(self, n):
    return 1

  def generate(self, rng, n):
    keys = rng.choice(self.num_symbols, n, replace=False)
    values = rng.integers(0, self.num_symbols, n)
    q = rng.integers(0, n)
    pairs = np.stack([keys, values], axis=1).reshape(-1)
    return np.concatenate([pairs, [keys[q]]]), values[q:q + 1]


class _Majority(_Task):
  name = "majority"
  is_classification = True

  def answer_len(self, n):
    return 0

  def generate(self, rng, n):
    x = rng.integers(0, self.num_symbols, n)
    counts = np.bincount(x, minlength=self.num_symbols)
    tied = np.flatnonzero(counts == counts.max())
    winner = rng.choice(tied)
    if len(tied) > 1:
      # Give the winner one occurrence of another tied symbol: winner count m+1, that one m-1.
      loser = rng.choice(tied[tied != winner])
      x[rng.choice(np.flatnonzero(x == loser))] = winner
    return x, int(winner)


class _ListOps(_Task):
  name = "listops"
  is_classification = True

  def __init__(self, num_symbols: int):
    del num_symbols  # fixed alphabet: digits, operators and ']'
    super().__init__(len(listops.SYMBOLS))
    # One character each, as decode() joins them: X MAX, N MIN, D MED, S SM.
    self.symbol_strings = list(listops.DIGITS) + list("XNDS") + [listops.CLOSE]
    self.num_classes = listops.NUM_CLASSES

  def answer_len(self, n):
    return 0

  def generate(self, rng, n):
    return listops.generate(rng, n)


TASKS = {t.name: t for t in (_Copy, _Reverse, _Sort, _Addition, _AssociativeRecall, _Majority,
                             _ListOps)}
FORMS = ("decoder", "seq2seq")


def vocab_size(task: str, num_symbols: int) -> int:
  """The vocabulary of synthetic task `task`: the special ids, then the task's symbols."""
  one_of("synthetic task", task, sorted(TASKS))
  return NUM_SPECIAL + TASKS[task](num_symbols).num_symbols


class SyntheticDataset:
  """A synthetic task served as batches; see the module docstring for the layouts.

  Attributes: `task_name`, `form` ('decoder' | 'seq2seq' | 'classification'), `vocab_size`,
  `seq_len` (L of decoder / classification rows), `encoder_len`, `decoder_len` (seq2seq),
  `num_classes` (classification), `train_lengths`, `test_lengths`.
  """

  def __init__(self, task: str, *, form: Optional[str] = None,
               train_lengths: Sequence[int] = (1, 16),
               test_lengths: Sequence[int] = (8, 16, 24, 32), num_symbols: int = 16,
               seed: int = 0, eval_seed: int = 1234):
    one_of("synthetic task", task, sorted(TASKS))
    self._task = TASKS[task](num_symbols)
    self.task_name = task
    # Classification tasks have one layout; the others default to the decoder-only form.
    allowed = ("classification",) if self._task.is_classification else FORMS
    form = allowed[0] if form is None else form
    one_of(f"form of task {task!r}", form, allowed)
    self.form = form
    lo, hi = (int(v) for v in train_lengths)
    if lo > hi:
      raise ValueError(f"train_lengths must be (min, max) with min <= max, got {train_lengths}")
    self.train_lengths = (lo, hi)
    self.test_lengths = tuple(int(n) for n in test_lengths)
    if not self.test_lengths:
      raise ValueError("test_lengths must list at least one length")
    for n in (lo, hi, *self.test_lengths):
      self._task.check_length(n)
    if seed < 0 or eval_seed < 0:
      raise ValueError("seeds must be non-negative")
    self.seed, self.eval_seed = int(seed), int(eval_seed)
    self.vocab_size = vocab_size(task, num_symbols)
    # Attributes describe the longest rows (all test lengths included); training batches are only
    # as long as the longest training example and each eval group as long as its test length, so
    # short-sequence training does not pay for long-sequence evaluation.
    if form == "decoder":
      self.seq_len = self.row_lengths(max(hi, *self.test_lengths))
    elif form == "seq2seq":
      self.encoder_len, self.decoder_len = self.row_lengths(max(hi, *self.test_lengths))
    else:
      self.seq_len = self.row_lengths(max(hi, *self.test_lengths))
      self.num_classes = getattr(self._task, "num_classes", self._task.num_symbols)

  def row_lengths(self, n: int):
    """Row length(s) that fit a task instance of length n in this form."""
    p, a = self._task.prompt_len(n), self._task.answer_len(n)
    if self.form == "decoder":
      return p + a + 2  # [BOS] p [SEP] a [EOS] has p+a+3 tokens; inputs drop the last
    if self.form == "seq2seq":
      return p, a + 1
    return p + 1  # [BOS] as [CLS], then the sequence

  # --- batches --------------------------------------------------------------------------------

  def train_batch(self, index: int, batch_size: int, row_start: int = 0,
                  row_count: Optional[int] = None) -> dict:
    """Rows [row_start, row_start+row_count) of global training batch `index`."""
    rows = row_range(batch_size, row_start, row_count)
    lo, hi = self.train_lengths
    examples = []
    for r in rows:
      rng = np.random.default_rng([self.seed, _TRAIN_STREAM, index, r])
      n = int(rng.integers(lo, hi + 1))
      examples.append(self._task.generate(rng, n))
    return self._layout(examples, self.row_lengths(hi))

  def eval_batches(self, batch_size: int, num_batches: int = 1, *, row_start: int = 0,
                   row_count: Optional[int] = None) -> list:
    """[(f'len_{n}', batch)] with `num_batches` batches per test length n, fixed across runs."""
    rows = row_range(batch_size, row_start, row_count)
    out = []
    for n in self.test_lengths:
      for b in range(num_batches):
        rngs = [np.random.default_rng([self.eval_seed, _EVAL_STREAM, n, b, r]) for r in rows]
        examples = [self._task.generate(rng, n) for rng in rngs]
        out.append((f"len_{n}", self._layout(examples, self.row_lengths(n))))
    return out

  def _layout(self, examples, lengths) -> dict:
    rows = len(examples)
    if self.form == "decoder":
      batch = _zeros(rows, lengths, "inputs", "targets", "weights", "segment_ids")
      for i, (prompt, answer) in enumerate(examples):
        p, a = len(prompt), len(answer)
        tokens = np.concatenate([[BOS], prompt + NUM_SPECIAL, [SEP], answer + NUM_SPECIAL, [EOS]])
        t = len(tokens) - 1
        batch["inputs"][i, :t] = tokens[:-1]
        batch["targets"][i, :t] = tokens[1:]
        batch["segment_ids"][i, :t] = 1
        batch["weights"][i, p + 1:p + a + 2] = 1  # inputs SEP..last answer token predict answer+EOS
      return batch
    if self.form == "seq2seq":
      encoder_len, decoder_len = lengths
      batch = {**_zeros(rows, encoder_len, "encoder_inputs", "encoder_segment_ids"),
               **_zeros(rows, decoder_len, "decoder_inputs", "targets", "weights",
                        "decoder_segment_ids")}
      for i, (prompt, answer) in enumerate(examples):
        p, a = len(prompt), len(answer)
        batch["encoder_inputs"][i, :p] = prompt + NUM_SPECIAL
        batch["encoder_segment_ids"][i, :p] = 1
        batch["decoder_inputs"][i, :a + 1] = np.concatenate([[BOS], answer + NUM_SPECIAL])
        batch["targets"][i, :a + 1] = np.concatenate([answer + NUM_SPECIAL, [EOS]])
        batch["weights"][i, :a + 1] = 1
        batch["decoder_segment_ids"][i, :a + 1] = 1
      return batch
    batch = _zeros(rows, lengths, "inputs", "segment_ids")
    batch["labels"] = np.zeros(rows, np.int32)
    batch["weights"] = np.ones(rows, np.float32)
    for i, (sequence, label) in enumerate(examples):
      batch["inputs"][i, :len(sequence) + 1] = np.concatenate([[BOS], sequence + NUM_SPECIAL])
      batch["segment_ids"][i, :len(sequence) + 1] = 1
      batch["labels"][i] = label
    return batch

  # --- display --------------------------------------------------------------------------------

  def decode(self, ids, skip_pad: bool = True) -> str:
    """Token ids -> compact text: '^' BOS, '|' SEP, '$' EOS, '_' PAD, symbols as letters/digits."""
    table = list(_SPECIAL_STRINGS) + self._task.symbol_strings
    return "".join(table[i] for i in np.asarray(ids).reshape(-1) if not (skip_pad and i == PAD))


def row_range(batch_size: int, row_start: int, row_count: Optional[int]) -> range:
  """Global row numbers [row_start, row_start + row_count) of a batch (default: to its end)."""
  if row_count is None:
    row_count = batch_size - row_start
  if row_start < 0 or row_count < 0 or row_start + row_count > batch_size:
    raise ValueError(f"rows [{row_start}, {row_start}+{row_count}) outside batch of {batch_size}")
  return range(row_start, row_start + row_count)


def _zeros(rows: int, length: int, *names: str) -> dict:
  return {k: np.zeros((rows, length), np.float32 if k == "weights" else np.int32) for k in names}
