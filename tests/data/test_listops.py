"""tfjax/data/listops.py and the 'listops' dataset: every generated label equals the value that an
evaluator written here (a stack parser over the expression's text) computes, the trees keep LRA's
limits (depth <= 10, 2-10 arguments per operator, N // 4 .. N tokens), generation is a pure
function of the seed, and the classification batches carry the expressions and labels."""

import numpy as np
import pytest

from tfjax.data import datasets, listops, synthetic


def _evaluate(text: str):
  """(value, depth, argument counts) of a ListOps expression such as '[MAX 4 [MIN 2 3 ] ]',
  parsed with an explicit stack: MAX, MIN, MED (median rounded down), SM (sum mod 10)."""
  ops = {"[MAX": max, "[MIN": min, "[SM": lambda a: sum(a) % 10,
         "[MED": lambda a: int(np.floor(np.median(a)))}
  stack, depth, arg_counts, result = [], 0, [], None
  for token in text.split():
    if token in ops:
      stack.append((token, []))
      depth = max(depth, len(stack))
    elif token == "]":
      op, args = stack.pop()
      arg_counts.append(len(args))
      value = ops[op](args)
      if stack:
        stack[-1][1].append(value)
      else:
        result = value
    else:
      digit = int(token)
      assert 0 <= digit <= 9 and len(token) == 1, token
      if stack:
        stack[-1][1].append(digit)
      else:
        result = digit
  assert not stack, "unclosed operator"
  return result, depth + 1 if depth else 1, arg_counts  # a digit leaf sits one level below


def test_operators_on_hand_computed_cases():
  assert listops.apply_operator("[MED", [1, 2, 3, 4]) == 2  # (2 + 3) / 2 = 2.5, rounded down
  assert listops.apply_operator("[MED", [7, 1, 5]) == 5
  assert listops.apply_operator("[SM", [9, 5, 8]) == 2  # 22 mod 10
  assert listops.apply_operator("[MAX", [3, 9, 0]) == 9
  assert listops.apply_operator("[MIN", [3, 9, 1]) == 1
  assert _evaluate("[MAX 4 3 [MIN 2 3 ] 1 0 ]")[0] == 4
  assert _evaluate("[SM [MED 1 2 3 4 ] 9 ]")[0] == 1  # 2 + 9 = 11 mod 10


@pytest.mark.parametrize("max_len", [16, 64, 255])
def test_labels_equal_an_independent_evaluation_within_lras_limits(max_len):
  labels = []
  for i in range(150):
    tokens, label = listops.generate(np.random.default_rng([7, i]), max_len)
    assert max_len // 4 <= len(tokens) <= max_len
    assert tokens.dtype == np.int32 and 0 <= tokens.min() and tokens.max() < len(listops.SYMBOLS)
    value, depth, arg_counts = _evaluate(listops.to_text(tokens))
    assert value == label, listops.to_text(tokens)
    # LRA: the root at depth 1, digits only at depth 10; 2..10 arguments per operator.
    assert depth <= listops.MAX_DEPTH
    assert all(2 <= n <= listops.MAX_ARGS for n in arg_counts)
    labels.append(label)
  assert set(labels) <= set(range(10))
  if max_len >= 64:  # long expressions reach most classes
    assert len(set(labels)) >= 8, sorted(set(labels))


def test_deeper_trees_than_the_limit_never_occur_and_every_operator_appears():
  seen = set()
  for i in range(100):
    tokens, _ = listops.generate(np.random.default_rng([3, i]), 60, max_depth=3)
    text = listops.to_text(tokens)
    assert _evaluate(text)[1] <= 3
    seen |= {t for t in text.split() if t.startswith("[")}
  assert seen == set(listops.OPERATORS)


def test_generation_is_a_pure_function_of_the_seed():
  a = [listops.generate(np.random.default_rng([1, i]), 128) for i in range(5)]
  b = [listops.generate(np.random.default_rng([1, i]), 128) for i in range(5)]
  c = [listops.generate(np.random.default_rng([2, i]), 128) for i in range(5)]
  assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
  assert not all(np.array_equal(x[0], z[0]) for x, z in zip(a, c))


def test_bad_lengths_name_the_problem():
  with pytest.raises(ValueError, match="min_len <= max_len"):
    listops.generate(np.random.default_rng(0), 10, min_len=20)
  with pytest.raises(ValueError, match="max_args >= 2"):
    listops.generate(np.random.default_rng(0), 10, max_args=1)


def test_listops_dataset_serves_classification_batches():
  config = datasets.default_data_config()
  config.update(name="listops", train_lengths=(63, 63), test_lengths=(63,))
  data = datasets.make_dataset(config, "classification")
  assert data.num_classes == 10 and data.seq_len == 64
  assert data.vocab_size == synthetic.NUM_SPECIAL + len(listops.SYMBOLS)
  batch = data.train_batch(3, 8)
  assert batch["inputs"].shape == (8, 64) and batch["labels"].shape == (8,)
  assert (batch["inputs"][:, 0] == synthetic.BOS).all()
  for row, segment, label in zip(batch["inputs"], batch["segment_ids"], batch["labels"]):
    n = int(segment.sum())
    assert (row[n:] == synthetic.PAD).all() and 63 // 4 + 1 <= n <= 64
    text = listops.to_text(row[1:n] - synthetic.NUM_SPECIAL)
    assert _evaluate(text)[0] == label
  again = datasets.make_dataset(config, "classification").train_batch(3, 8)
  assert all(np.array_equal(batch[k], again[k]) for k in batch)
  (name, eval_batch), = data.eval_batches(4)
  assert name == "len_63" and eval_batch["inputs"].shape == (4, 64)
  assert "X" in data.decode(batch["inputs"]) or "N" in data.decode(batch["inputs"])
  with pytest.raises(ValueError, match="serves task 'classification'"):
    datasets.make_dataset(config, "lm")
