"""Synthetic tasks: answers checked against independent Python, layouts, determinism, errors."""

from collections import Counter

import numpy as np
import pytest

from tfjax.data import synthetic
from tfjax.training import tasks
from tfjax.data.synthetic import BOS, EOS, NUM_SPECIAL, PAD, SEP, SyntheticDataset

SEQUENCE_TASKS = ("copy", "reverse", "sort", "addition", "associative_recall")


def _dataset(task, **kw):
  kw = {"train_lengths": (1, 5), "test_lengths": (3, 10), "num_symbols": 12, **kw}
  return SyntheticDataset(task, **kw)


def _check_answer(task, prompt, answer):
  """prompt / answer: lists of symbol indices. Recomputes the answer without tfjax's code."""
  if task == "copy":
    assert answer == prompt
  elif task == "reverse":
    assert answer == prompt[::-1]
  elif task == "sort":
    assert answer == sorted(prompt)
  elif task == "addition":
    plus = prompt.index(10)
    a, b = prompt[:plus], prompt[plus + 1:]
    assert len(a) == len(b) and 10 not in b
    as_int = lambda digits: int("".join(map(str, digits)))  # noqa: E731
    assert len(answer) == len(a) + 1
    assert as_int(answer) == as_int(a) + as_int(b)
  elif task == "associative_recall":
    keys, values, query = prompt[0:-1:2], prompt[1:-1:2], prompt[-1]
    assert len(set(keys)) == len(keys)
    assert answer == [dict(zip(keys, values))[query]]
  else:
    raise AssertionError(task)


def _decoder_example(batch, i):
  """(prompt, answer) symbol lists rebuilt from a decoder row's full token sequence."""
  n = int(batch["segment_ids"][i].sum())
  tokens = list(batch["inputs"][i, :n]) + [batch["targets"][i, n - 1]]
  assert tokens[0] == BOS and tokens[-1] == EOS and tokens.count(SEP) == 1
  sep = tokens.index(SEP)
  return ([t - NUM_SPECIAL for t in tokens[1:sep]], [t - NUM_SPECIAL for t in tokens[sep + 1:-1]])


@pytest.mark.parametrize("task", SEQUENCE_TASKS)
def test_decoder_rows_answers_and_weights(task):
  ds = _dataset(task)
  batch = ds.train_batch(0, 32)
  # Training rows are as long as the longest training example needs, no longer.
  assert batch["inputs"].shape == batch["targets"].shape == (
      32, ds.row_lengths(ds.train_lengths[1]))
  assert batch["weights"].dtype == np.float32 and batch["inputs"].dtype == np.int32
  for i in range(32):
    prompt, answer = _decoder_example(batch, i)
    _check_answer(task, prompt, answer)
    # Weighted targets are exactly answer + EOS; inputs are targets shifted right.
    w = batch["weights"][i] > 0
    assert list(batch["targets"][i, w]) == [a + NUM_SPECIAL for a in answer] + [EOS]
    n = int(batch["segment_ids"][i].sum())
    np.testing.assert_array_equal(batch["inputs"][i, 1:n], batch["targets"][i, :n - 1])
    assert not batch["inputs"][i, n:].any() and not batch["weights"][i, n:].any()
    assert set(batch["segment_ids"][i, :n]) == {1}


@pytest.mark.parametrize("task", SEQUENCE_TASKS)
def test_seq2seq_rows(task):
  ds = _dataset(task, form="seq2seq")
  batch = ds.train_batch(1, 16)
  encoder_len, decoder_len = ds.row_lengths(ds.train_lengths[1])
  assert (encoder_len, decoder_len) <= (ds.encoder_len, ds.decoder_len)
  assert batch["encoder_inputs"].shape == (16, encoder_len)
  assert batch["decoder_inputs"].shape == batch["targets"].shape == (16, decoder_len)
  for i in range(16):
    p = int(batch["encoder_segment_ids"][i].sum())
    a = int(batch["decoder_segment_ids"][i].sum())
    prompt = list(batch["encoder_inputs"][i, :p] - NUM_SPECIAL)
    answer = list(batch["targets"][i, :a - 1] - NUM_SPECIAL)
    _check_answer(task, prompt, answer)
    assert batch["targets"][i, a - 1] == EOS and batch["decoder_inputs"][i, 0] == BOS
    np.testing.assert_array_equal(batch["decoder_inputs"][i, 1:a], batch["targets"][i, :a - 1])
    np.testing.assert_array_equal(batch["weights"][i], batch["decoder_segment_ids"][i])
    assert not batch["encoder_inputs"][i, p:].any()


def test_majority_classification():
  ds = _dataset("majority", train_lengths=(1, 9), num_symbols=3)
  assert ds.form == "classification" and ds.num_classes == 3
  batch = ds.train_batch(0, 64)
  assert batch["labels"].shape == batch["weights"].shape == (64,)
  for i in range(64):
    n = int(batch["segment_ids"][i].sum())
    assert batch["inputs"][i, 0] == BOS
    counts = Counter(batch["inputs"][i, 1:n] - NUM_SPECIAL).most_common()
    assert counts[0][0] == batch["labels"][i]
    assert len(counts) == 1 or counts[0][1] > counts[1][1]  # strict majority, never a tie


@pytest.mark.parametrize("task", SEQUENCE_TASKS + ("majority",))
def test_determinism_and_row_slicing(task):
  ds = _dataset(task)
  full = ds.train_batch(7, 8)
  part = ds.train_batch(7, 8, row_start=2, row_count=3)
  again = _dataset(task).train_batch(7, 8)
  for k in full:
    np.testing.assert_array_equal(full[k], again[k])
    np.testing.assert_array_equal(full[k][2:5], part[k])
  other = ds.train_batch(8, 8)
  assert any(not np.array_equal(full[k], other[k]) for k in full)
  reseeded = _dataset(task, seed=1).train_batch(7, 8)
  assert any(not np.array_equal(full[k], reseeded[k]) for k in full)


def test_train_and_test_lengths():
  ds = _dataset("copy", train_lengths=(2, 4), test_lengths=(3, 8))
  train = ds.train_batch(0, 200)
  lengths = {len(_decoder_example(train, i)[0]) for i in range(200)}
  assert lengths == {2, 3, 4}
  groups = ds.eval_batches(5, num_batches=2)
  assert [name for name, _ in groups] == ["len_3", "len_3", "len_8", "len_8"]
  for name, batch in groups:
    # Each group's rows fit its length: one eval compile per test length, none wasted on padding.
    assert batch["inputs"].shape == (5, ds.row_lengths(int(name[4:])))
    for i in range(5):
      assert len(_decoder_example(batch, i)[0]) == int(name[4:])


def test_eval_fixed_across_training_seeds_and_sliceable():
  a = _dataset("sort", seed=0).eval_batches(6, 1)
  b = _dataset("sort", seed=5).eval_batches(6, 1)
  part = _dataset("sort").eval_batches(6, 1, row_start=4, row_count=2)
  for (na, ba), (nb, bb), (_, bp) in zip(a, b, part):
    assert na == nb
    for k in ba:
      np.testing.assert_array_equal(ba[k], bb[k])
      np.testing.assert_array_equal(ba[k][4:], bp[k])


def test_addition_vocab_and_decode():
  ds = _dataset("addition", num_symbols=99)
  assert ds.vocab_size == NUM_SPECIAL + 11
  text = ds.decode(ds.train_batch(0, 1)["inputs"][0])
  assert text.startswith("^") and "+" in text and "|" in text
  assert ds.decode([BOS, PAD, SEP, EOS], skip_pad=False) == "^_|$"


class _PredictsGiven:
  """A stand-in model whose logits put all mass on the given ids (one-hot over `vocab`)."""

  def __init__(self, pred_ids, vocab):
    self._logits = np.eye(vocab, dtype=np.float32)[pred_ids] * 10.0

  def apply(self, variables, *args, **kwargs):
    del variables, args, kwargs
    return self._logits


def _row_exact(pred_ids, batch, vocab):
  """tasks.forward's per-row exact match (what eval/exact_match@L averages) for these argmaxes."""
  stats = tasks.forward(_PredictsGiven(pred_ids, vocab), {}, batch, "lm")
  return np.asarray(stats["row_correct"]), np.asarray(stats["row_count"])


def test_row_exact_match_counts_only_weighted_positions_and_rows_with_targets():
  targets = np.array([[5, 6, 7], [5, 6, 7], [1, 2, 3]])
  weights = np.array([[0, 1, 1], [0, 1, 1], [0, 0, 0]], np.float32)
  preds = np.array([[9, 6, 7], [5, 6, 8], [0, 0, 0]])
  batch = {"inputs": np.zeros_like(targets), "targets": targets, "weights": weights}
  correct, counted = _row_exact(preds, batch, vocab=10)
  # A row with no weighted position is neither correct nor counted (no vacuous matches).
  np.testing.assert_array_equal(correct, [True, False, False])
  np.testing.assert_array_equal(counted, [True, True, False])


def test_row_exact_match_on_a_real_batch():
  ds = _dataset("reverse")
  batch = ds.train_batch(0, 4)
  preds = batch["targets"].copy()
  preds[batch["weights"] == 0] = 1  # unweighted positions don't matter
  assert _row_exact(preds, batch, ds.vocab_size)[0].all()
  row, col = 2, int(np.flatnonzero(batch["weights"][2])[-1])
  preds[row, col] = (preds[row, col] + 1) % ds.vocab_size
  np.testing.assert_array_equal(_row_exact(preds, batch, ds.vocab_size)[0],
                                [True, True, False, True])


def test_errors():
  with pytest.raises(ValueError, match="copy"):
    SyntheticDataset("nope")
  with pytest.raises(ValueError, match="num_symbols"):
    SyntheticDataset("associative_recall", num_symbols=4, test_lengths=(8,))
  with pytest.raises(ValueError, match="form"):
    SyntheticDataset("copy", form="encoder")
  with pytest.raises(ValueError, match="form"):
    SyntheticDataset("majority", form="seq2seq")
  with pytest.raises(ValueError, match="train_lengths"):
    SyntheticDataset("copy", train_lengths=(5, 2))
  with pytest.raises(ValueError, match="outside"):
    _dataset("copy").train_batch(0, 4, row_start=3, row_count=2)
  assert set(synthetic.TASKS) == set(SEQUENCE_TASKS) | {"majority", "listops"}
