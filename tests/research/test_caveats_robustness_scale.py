"""A verdict's caveats, its robustness and the section's scale (issue 59 items 1 and 3), each
computed from rows and checked here against an independent computation: caveats print only
when their measurement says so, leave-one-out recomputes a claim's word with each run left out
(checked against scipy's Welch test), the committed page prints the norm warmup claims' caveats
with the Xavier failure count read from the JSONL, the FFN aggregate follows its 15 pairs, and
the scale block's parameter counts equal the points' own."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from tfjax.research import qualifiers, robustness, sweep_doc, sweep_scale, verdicts

REPO = sweep_doc.REPO


def _rows(arms: dict, metric="eval/loss"):
  return [{"overrides": {"model.ffn": arm, "seed": seed}, "status": "done",
           "metrics": {metric: float(v)}}
          for arm, values in arms.items() for seed, v in enumerate(values)]


def test_a_static_caveat_always_prints_and_a_conditional_one_only_when_its_condition_fails():
  rows = _rows({"relu": [1.0, 1.1, 1.2], "gelu": [2.0, 2.1, 2.2]})
  cond = {"where": {"model.ffn": "relu"}, "metric": "eval/loss", "max": 1.5, "what": "relu learns"}
  claim = {"qualifiers": [{"text": "one task"}, {"text": "control only here", "unless": cond}]}
  assert qualifiers.of_claim(rows, claim) == ["one task"]
  failing = {**cond, "max": 1.05}  # relu's mean 1.1 is above it
  out = qualifiers.of_claim(rows, {"qualifiers": [{"text": "control only here",
                                                   "unless": failing}]})
  assert len(out) == 1 and out[0].startswith("control only here (relu learns fails")


def test_an_ordering_caveat_prints_both_orders_only_when_they_differ():
  spec = {"key": "model.ffn", "values": ("relu", "gelu", "silu"), "metric": "eval/loss",
          "paper": {"relu": 1.997, "gelu": 1.983, "silu": 1.994}}
  claim = {"qualifiers": [{"text": "baseline ordering unlike the paper's", "order": spec}]}
  as_paper = _rows({"gelu": [1.0, 1.0], "silu": [1.1, 1.1], "relu": [1.2, 1.2]})
  assert qualifiers.of_claim(as_paper, claim) == []
  unlike = _rows({"relu": [1.0, 1.0], "gelu": [1.1, 1.1], "silu": [1.2, 1.2]})
  (text,) = qualifiers.of_claim(unlike, claim)
  assert "here relu 1.0000 < gelu 1.1000 < silu 1.2000" in text
  assert "the paper gelu 1.983 < silu 1.994 < relu 1.997" in text


def test_leave_one_out_recomputes_the_word_with_each_run_left_out():
  """One outlier seed carries a difference: leaving it out changes the word, leaving out any
  other run does not; the expected words come from scipy's Welch test on each subset."""
  a = [1.00, 1.01, 0.99, 1.00, 0.70]  # the last seed alone makes a < b
  b = [1.00, 1.01, 0.99, 1.00, 1.00]
  rows = _rows({"glu": a, "relu": b})
  claim = {"a": {"model.ffn": "glu", "metric": "eval/loss"},
           "b": {"model.ffn": "relu", "metric": "eval/loss"}, "expect": "less"}
  (entry,) = robustness.leave_one_out(rows, [claim])
  def word(xa, xb):
    t = stats.ttest_ind(xa, xb, equal_var=False)
    se = np.sqrt(np.var(xa, ddof=1) / len(xa) + np.var(xb, ddof=1) / len(xb))
    delta = np.mean(xa) - np.mean(xb)
    return ("tie" if abs(delta) < se else ("reproduced" if t.pvalue < 0.05 else
                                           "direction only") if delta < 0 else
            "contradicted" if t.pvalue < 0.05 else "opposite only")
  expected = [word([x for j, x in enumerate(a) if j != i], b) for i in range(5)] + [
      word(a, [x for j, x in enumerate(b) if j != i]) for i in range(5)]
  whole = word(a, b)
  assert entry["word"] == whole and entry["tried"] == 10
  changed = {}
  for w in expected:
    if w != whole:
      changed[w] = changed.get(w, 0) + 1
  assert entry["changed"] == changed and changed  # the outlier's omission moves it
  assert robustness.describe(entry, whole).startswith(f"fragile: {sum(changed.values())} of 10")


def _findings(doc: str) -> list:
  block = doc.split("<!-- sweep_doc:findings begin -->")[1].split("<!-- sweep_doc:findings end")[0]
  return [[c.strip() for c in line.strip().strip("|").split(" | ")]
          for line in block.strip().split("\n")[2:]]


@pytest.fixture(scope="module", name="doc")
def committed_doc():
  with open(os.path.join(REPO, sweep_doc.DOC), encoding="utf-8") as f:
    return f.read()


def test_the_norm_warmup_rows_print_their_caveats_with_the_xavier_count_from_the_jsonl(doc):
  with open(os.path.join(REPO, sweep_doc.RESULTS_DIR, "norm_medium.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  xavier_post = [r for r in rows if r["overrides"].get("model.init") == "xavier_uniform"
                 and r["overrides"].get("model.norm_placement") == "post"
                 and r["overrides"].get("optimizer.warmup_steps") == 150]
  failed = sum(r["metrics"].get("failed") == 1 or r["status"] == "diverged" for r in xavier_post)
  for cells in _findings(doc):
    if cells[0].startswith("norm (") and "warmup" in cells[1] and "depth" not in cells[1]:
      verdict = cells[4]
      assert "**caveats:** pilot-selected setting" in verdict, cells[1]
      if failed:  # the control under the paper's init fails in the committed data
        assert "control passes only under one init" in verdict, cells[1]
  assert failed == len(xavier_post) == 8  # the "fails 8 of 8 seeds", from the JSONL


def test_the_ffn_aggregate_reads_reproduced_only_when_every_pair_does(doc):
  rows = [c for c in _findings(doc) if c[0].startswith("ffn (")]
  pairs = [c for c in rows if "beats" in c[1] and "every" not in c[1]]
  (aggregate,) = [c for c in rows if c[1] == "every gated variant beats every ungated one"]
  assert len(pairs) == 15
  every = all(c[4].startswith("reproduced") for c in pairs)
  assert aggregate[4].startswith("reproduced" if every else "not reproduced")
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    assert 'aggregate "every gated variant beats every ungated one": not reproduced' in f.read()


def test_the_scale_blocks_parameter_counts_equal_the_points_own():
  """heads and ffn record params/total per point; the block's count for the other sections uses
  the same counting with CHAR_VOCAB, checked here against the rows that record it."""
  for name in ("heads", "ffn"):
    section = sweep_doc.load_section(name, REPO)
    recorded = [r["metrics"]["params/total"] for r in section["rows"]]
    scale = sweep_scale.section_scale({**section, "rows": [
        {**r, "metrics": {k: v for k, v in r["metrics"].items() if k != "params/total"}}
        for r in section["rows"]]})  # counted, not read back
    assert scale["params"] == (min(recorded), max(recorded)), name
    config = section["module"].get_config("medium")
    steps = config.train.num_steps * config.train.batch_size * config.data.seq_len
    assert scale["tokens"] == (steps, steps)


def test_the_char_vocabulary_is_tiny_shakespeares():
  """Where the corpus is on this machine ($TFJAX_DATA_DIR or the cache; never downloaded here)."""
  from tfjax.data import text_files  # pylint: disable=import-outside-toplevel
  rel = os.path.join("tinyshakespeare", "input.txt")
  candidates = [os.path.join(os.environ.get(text_files.DATA_DIR_ENV, ""), rel),
                os.path.join(text_files.cache_dir(), rel)]
  found = next((p for p in candidates if os.path.exists(p)), None)
  if not found:
    pytest.skip("Tiny Shakespeare is not on this machine ($TFJAX_DATA_DIR or the cache)")
  with open(found, encoding="utf-8") as f:
    assert len(set(f.read())) == sweep_scale.CHAR_VOCAB
