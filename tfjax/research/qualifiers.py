"""A claim's caveats: what its verdict word needs said beside it, declared in its sweep config
and, where they state a measurement, computed from the committed per-seed results.

A claim may carry `qualifiers`, a list of
  {'text': str}                     always printed (e.g. 'pilot-selected setting: ...');
  {'text': str, 'unless': condition}  printed, with the failing detail, when the condition (as
                                    verdicts.check_conditions reads it) fails on the rows: e.g.
                                    'control passes only under one init' unless post-LN with
                                    warmup also trains under the paper's Xavier init;
  {'text': str, 'order': {'key': override, 'values': (v, ...), 'metric': m,
                          'paper': {v: number}}}
                                    printed when the arms `key` = v order by their seed-mean of m
                                    unlike the paper's numbers (e.g. the ungated FFN baselines):
                                    both orders are printed.
The Findings table and the README headline print them (tfjax/research/sweep_doc.py); a verdict
with caveats is never shown without them.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from tfjax.research import verdicts


def _order_text(values: Mapping, fmt: str) -> str:
  return " < ".join(f"{k} {v:{fmt}}" for k, v in sorted(values.items(), key=lambda kv: kv[1]))


def _ordering(rows: Sequence[dict], spec: Mapping):
  """(ours, paper) as 'a x < b y < ...' texts, or None when the two orders agree (or an arm has
  no finished seed)."""
  ours = {}
  for value in spec["values"]:
    members = [verdicts.metric_value(r["metrics"], spec["metric"]) for r in rows
               if r["status"] == "done" and r["overrides"].get(spec["key"]) == value]
    members = [v for v in members if isinstance(v, (int, float)) and math.isfinite(v)]
    if not members:
      return None
    ours[value] = float(np.mean(members))
  paper = {v: spec["paper"][v] for v in spec["values"]}
  if sorted(ours, key=ours.get) == sorted(paper, key=paper.get):
    return None
  return _order_text(ours, ".4f"), _order_text(paper, "g")


def of_claim(rows: Sequence[dict], claim: Mapping) -> list[str]:
  """The claim's caveats that apply to these rows, as printed."""
  out = []
  for q in claim.get("qualifiers", ()):
    if "unless" in q:
      failing = verdicts.check_conditions(rows, [q["unless"]])
      if failing:
        out.append(f"{q['text']} ({failing})")
    elif "order" in q:
      orders = _ordering(rows, q["order"])
      if orders:
        out.append(f"{q['text']} (here {orders[0]}; the paper {orders[1]})")
    else:
      out.append(q["text"])
  return out


def short(text: str) -> str:
  """A caveat's name, the text before its first ':' or '(' (the README headline's)."""
  for mark in (":", " ("):
    text = text.split(mark)[0]
  return text.strip()
