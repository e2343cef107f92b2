"""How robust a verdict word is, computed from the committed per-seed results: does it survive
leaving out any one seed, and does the claim read the same on the section's other metric.

Leave-one-out: each run of either arm of a claim is left out in turn (for a rank claim, each
seed, with all its runs: a seed's MRR ranks its arms together) and the whole section is judged
again by the verdict rule, Holm family included, without the rule's words that ask for more
seeds (leaving one out puts a 5-seed arm under the rule's 5, which would ask for more seeds
whatever the evidence): the word is *robust* when every such judgement gives the word the whole
data give by the same reading, else the column counts the runs whose omission changes it and
names the words they give. A claim judged on fewer than 3 runs a side is not tested this way
(leaving one
out would leave a side below the rule's 2 seeds by design).
"""

from __future__ import annotations

from typing import Sequence

from tfjax.research import verdicts


def _members(rows: Sequence[dict], claim: dict) -> list[int]:
  """Indices of the rows whose omission the claim's leave-one-out tries."""
  if claim.get("kind") == "mrr":
    return []
  sides = [s for s in (claim["a"], claim["b"]) if "value" not in s]
  return [i for i, r in enumerate(rows)
          if r["status"] in ("done", "diverged") and any(verdicts.matches(r, s) for s in sides)]


def _seeds(rows: Sequence[dict], claim: dict) -> dict:
  """{seed: row indices} of a rank claim's arms (every seed's runs go together)."""
  if claim.get("kind") != "mrr":
    return {}
  out: dict = {}
  for i, r in enumerate(rows):
    if r["status"] in ("done", "diverged"):
      out.setdefault(r["overrides"].get("seed"), []).append(i)
  return out


def leave_one_out(rows: Sequence[dict], claims: Sequence[dict]) -> list:
  """Per claim: None (not tested: an untestable word, or too few runs) or {'word': the whole
  data's word without the seed-count words, 'tried': n, 'changed': {word: count}}."""
  base = verdicts.raw_results(rows, claims)
  words = [r["word"] for r in verdicts.judge_claims(rows, claims, False, raws=base)]
  drops: dict = {}  # a dropped set of row indices -> the claims it is tried for
  for c, (claim, word) in enumerate(zip(claims, words)):
    if word in ("untestable here",):
      continue
    seeds = _seeds(rows, claim)
    groups = list(seeds.values()) if seeds else [[i] for i in _members(rows, claim)]
    if len(groups) < 3 or (not seeds and _too_few(rows, claim)):
      continue
    for group in groups:
      drops.setdefault(tuple(group), []).append(c)
  out: list = [None] * len(claims)
  for group, tried_for in drops.items():
    kept = [r for i, r in enumerate(rows) if i not in group]
    # Only the claims that read a dropped row change their statistics; Holm then reweighs all.
    touched = [any(verdicts.reads(claim, rows[i]["overrides"]) for i in group) for claim in claims]
    raws = [verdicts.raw_results(kept, [claim])[0] if t else raw
            for claim, raw, t in zip(claims, base, touched)]
    judged = verdicts.judge_claims(kept, claims, False, raws=raws)
    for c in tried_for:
      entry = out[c] or {"word": words[c], "tried": 0, "changed": {}}
      entry["tried"] += 1
      if judged[c]["word"] != words[c]:
        entry["changed"][judged[c]["word"]] = entry["changed"].get(judged[c]["word"], 0) + 1
      out[c] = entry
  return out


def _too_few(rows: Sequence[dict], claim: dict) -> bool:
  for side in (claim["a"], claim["b"]):
    if "value" not in side and sum(r["status"] in ("done", "diverged")
                                   and verdicts.matches(r, side) for r in rows) < 3:
      return True
  return False


def describe(entry, word: str, secondary: dict | None = None) -> str:
  """The robustness column's text."""
  parts = []
  if entry is None:
    parts.append("leave-one-out: not tried" + (" (untestable)" if word == "untestable here"
                                               else ""))
  elif not entry["changed"]:
    parts.append(f"robust: all {entry['tried']} leave-one-out judgements read {entry['word']}")
  else:
    n = sum(entry["changed"].values())
    to = ", ".join(f"{k} {v}x" for k, v in sorted(entry["changed"].items()))
    parts.append(f"fragile: {n} of {entry['tried']} leave-one-out judgements change "
                 f"{entry['word']} ({to})")
  if secondary is not None:
    same = secondary["word"] == word
    parts.append(f"other metric: {'same word' if same else secondary['word']}")
  return "; ".join(parts)
