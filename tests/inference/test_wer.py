"""tfjax.inference.wer against word error rates worked out by hand."""

import pytest

from tfjax.inference.wer import edit_distance, word_error_rate


def test_edit_distance_of_a_hand_aligned_pair():
  # the cat sat on the  mat
  # the cat sit on  --  mat the      -> 1 substitution, 1 deletion, 1 insertion
  ref, hyp = "the cat sat on the mat".split(), "the cat sit on mat the".split()
  assert edit_distance(ref, hyp) == 3
  assert edit_distance(hyp, ref) == 3  # symmetric: insertions and deletions swap
  assert edit_distance([], ["a", "b"]) == 2 and edit_distance(["a", "b"], []) == 2
  assert edit_distance(["a", "b", "c"], ["a", "b", "c"]) == 0
  # "kitten" -> "sitting" as words of letters: the textbook 3 (k->s, e->i, +g)
  assert edit_distance(list("kitten"), list("sitting")) == 3


def test_corpus_wer_sums_edits_over_reference_words():
  refs = ["three one four", "one five", "nine"]
  hyps = ["three one four", "one five nine two", ""]  # 0 edits; 2 insertions; 1 deletion
  score = word_error_rate(refs, hyps)
  assert (score["errors"], score["words"]) == (3, 6)
  assert score["wer"] == pytest.approx(0.5)
  assert (score["sentence_errors"], score["sentences"]) == (2, 3)
  assert word_error_rate(["one"], ["two three"])["wer"] == 2.0  # insertions can pass 1
  with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
    word_error_rate(["a", "b"], ["a"])
