"""Word error rate: the word-level Levenshtein distance between reference and hypothesis
transcripts (substitutions + deletions + insertions), summed over a corpus and divided by the
references' word count (the usual corpus WER: it can exceed 1 when a hypothesis inserts words).
Words are the whitespace-separated tokens; no other normalization is applied."""

from __future__ import annotations

from typing import Sequence


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
  """The fewest substitutions, deletions and insertions turning `reference` into `hypothesis`
  (Wagner-Fischer dynamic programming, one row at a time)."""
  previous = list(range(len(hypothesis) + 1))  # distance from an empty reference prefix
  for i, ref_word in enumerate(reference, start=1):
    current = [i]
    for j, hyp_word in enumerate(hypothesis, start=1):
      current.append(min(previous[j] + 1,                           # delete ref_word
                         current[j - 1] + 1,                        # insert hyp_word
                         previous[j - 1] + (ref_word != hyp_word)))  # match / substitute
    previous = current
  return previous[-1]


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> dict:
  """{'wer', 'errors', 'words', 'sentences', 'sentence_errors'} over paired transcripts."""
  if len(references) != len(hypotheses):
    raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
  errors = words = wrong_sentences = 0
  for reference, hypothesis in zip(references, hypotheses):
    ref, hyp = reference.split(), hypothesis.split()
    distance = edit_distance(ref, hyp)
    errors, words = errors + distance, words + len(ref)
    wrong_sentences += distance > 0
  if not words:
    raise ValueError("the references hold no word: a word error rate needs at least one")
  return {"wer": errors / words, "errors": errors, "words": words,
          "sentences": len(references), "sentence_errors": wrong_sentences}
