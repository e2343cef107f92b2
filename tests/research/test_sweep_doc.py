"""docs/ablations.md and README.md's headline block equal their regeneration from the committed
per-seed results (tfjax/research/sweep_doc.py), and changing one committed number changes the
regenerated verdict."""

import json
import os
import shutil

import pytest

from tfjax.research import sweep_doc, sweep_results

REPO = sweep_doc.REPO


def test_committed_doc_and_readme_equal_their_regeneration():
  for path, text in sweep_doc.regenerate(REPO, figures=False).items():
    with open(path, encoding="utf-8") as f:
      assert f.read() == text, f"{path} is stale: run python -m tfjax.research.sweep_doc"


def test_regeneration_is_byte_identical_on_a_rerun():
  first = sweep_doc.regenerate(REPO, figures=False)
  assert sweep_doc.regenerate(REPO, figures=False) == first


def test_every_sweep_has_a_section_and_claims_in_the_findings():
  doc = sweep_doc.regenerate(REPO, figures=False)[os.path.join(REPO, sweep_doc.DOC)]
  for name in sweep_doc.sweeps(REPO):
    assert f"<!-- sweep_doc:section:{name} begin -->" in doc
    assert f"| {name} (" in doc  # at least one findings row


def test_a_section_names_the_devices_its_points_ran_on():
  doc = sweep_doc.regenerate(REPO, figures=False)[os.path.join(REPO, sweep_doc.DOC)]
  for name in sweep_doc.sweeps(REPO):
    section = doc.split(f"<!-- sweep_doc:section:{name} begin -->")[1].split("<!-- sweep_doc")[0]
    for path in sorted(os.listdir(os.path.join(REPO, sweep_doc.RESULTS_DIR))):
      if path.startswith(name + "_") and f"`{sweep_doc.RESULTS_DIR}/{path}`" in section:
        devices = {row["device"] for row in sweep_results.load(
            os.path.join(REPO, sweep_doc.RESULTS_DIR, path)) if row["device"]}
        for device in devices:
          assert f" on {device}" in section or f" and {device}" in section, (name, device)


def test_arms_run_on_two_devices_are_listed_by_device():
  def row(heads, seed, device):
    return {"overrides": {"model.num_heads": heads, "seed": seed}, "device": device}
  rows = [row(8, 0, "cpu"), row(8, 1, "cpu"), row(2, 0, "gpu: H200"), row(32, 0, "cpu"),
          row(2, 1, None)]
  line = sweep_doc._arms_by_device(rows)  # pylint: disable=protected-access
  assert line.endswith("cpu: num_heads=8 (seeds 0, 1); num_heads=32 (seeds 0). device not "
                       "recorded: num_heads=2 (seeds 1). gpu: H200: num_heads=2 (seeds 0)."), line


def _copy_repo(tmp_path):
  """The files regeneration reads: configs, results, the doc and the README."""
  for rel in ("configs/ablations", sweep_doc.RESULTS_DIR):
    shutil.copytree(os.path.join(REPO, rel), tmp_path / rel)
  for rel in (sweep_doc.DOC, sweep_doc.README):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(REPO, rel), tmp_path / rel)
  return str(tmp_path)


def test_changing_one_committed_number_changes_the_verdict(tmp_path):
  """A claim with a decided word (not tie, not untestable): one seed's value of arm a is set so
  that arm a's mean equals arm b's, and the regenerated verdict becomes 'tie'."""
  repo = _copy_repo(tmp_path)
  sections = {n: sweep_doc.load_section(n, repo) for n in sweep_doc.sweeps(repo)}
  # A two-arm Welch claim with a decided word (position's ALiBi vs rotary at 16L).
  name, section, claim = next(
      (n, s, c) for n, s in sections.items() if s["scale"] for c in sweep_doc.judge(s)
      if c["id"] == "alibi_vs_rope")
  assert claim["result"]["word"] not in ("tie", "untestable here", sweep_doc.PENDING)
  path = os.path.join(repo, section["results"])
  rows = sweep_results.load(path)
  side_a = [r for r in rows if sweep_doc.verdicts.matches(r, claim["a"])]
  mean_b = sum(sweep_doc.verdicts.values(rows, claim["b"])) / claim["result"]["n_b"]
  others = sum(r["metrics"][claim["a"]["metric"]] for r in side_a[1:])
  side_a[0]["metrics"][claim["a"]["metric"]] = len(side_a) * mean_b - others
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps({"point": r["name"], "overrides": r["overrides"],
                          "seed": r["overrides"].get("seed"), "status": r["status"],
                          "metrics": r["metrics"], "commit": r["commit"],
                          "seconds": r["seconds"], "config": r["config"]},
                         sort_keys=True) + "\n")
  new = next(c for c in sweep_doc.judge(sweep_doc.load_section(name, repo))
             if c["id"] == claim["id"])
  assert new["result"]["word"] == "tie", (claim["id"], claim["result"], new["result"])
  before = sweep_doc.regenerate(REPO, figures=False)[os.path.join(REPO, sweep_doc.DOC)]
  after = sweep_doc.regenerate(repo, figures=False)[os.path.join(repo, sweep_doc.DOC)]
  row = next(line for line in after.split("\n") if line.startswith(f"| {name} (")
             and claim["claim"] in line)
  assert row.split(" | ")[-2].startswith("tie") and after != before  # the word, its robustness


def _rewrite(path, edit):
  with open(path, encoding="utf-8") as f:
    recs = [json.loads(line) for line in f]
  with open(path, "w", encoding="utf-8") as f:
    for rec in recs:
      f.write(json.dumps(edit(rec), sort_keys=True) + "\n")


def test_a_changed_config_makes_its_claims_await_a_rerun(tmp_path):
  """heads.py trained at another learning rate: its committed rows no longer carry the current
  config's fingerprint, so no verdict is printed from them; the other sweeps are unchanged."""
  repo = _copy_repo(tmp_path)
  path = os.path.join(repo, "configs", "ablations", "heads.py")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  old = '  return _lm.char_lm(_lm.check_scale(scale, "heads.py"))'
  assert old in text
  with open(path, "w", encoding="utf-8") as f:
    f.write(text.replace(old, old.replace("return ", "config = ") + "\n"
                         "  config.optimizer.lr = 1e-3\n  return config"))
  section = sweep_doc.load_section("heads", repo)
  assert not section["rows"] and len(section["stale"]) == len(section["all_rows"]) > 0
  words = {c["result"]["word"] for c in sweep_doc.judge(section)}
  assert words == {sweep_doc.PENDING}, words
  doc = sweep_doc.regenerate(repo, figures=False)[os.path.join(repo, sweep_doc.DOC)]
  block = doc.split("<!-- sweep_doc:section:heads begin -->")[1].split("sweep_doc:section")[0]
  assert "results of another config" in block and "#### Final metrics" not in block
  ffn = sweep_doc.load_section("ffn", repo)
  assert len(ffn["rows"]) == len(ffn["all_rows"]) and not ffn["stale"]


def test_a_row_is_known_by_what_it_trained_not_by_how_its_arm_is_spelled(tmp_path):
  """An override equal to the config's own value changes nothing trained: the row keeps its
  fingerprint, is used, and takes the current point's overrides; a wrong fingerprint is not."""
  repo = _copy_repo(tmp_path)
  path = os.path.join(repo, sweep_doc.RESULTS_DIR, "ffn_medium.jsonl")
  before = [c["result"] for c in sweep_doc.judge(sweep_doc.load_section("ffn", repo))]
  _rewrite(path, lambda rec: {**rec, "overrides": {**rec["overrides"], "model.ffn_bias": False}})
  section = sweep_doc.load_section("ffn", repo)
  assert not section["stale"] and all("model.ffn_bias" not in r["overrides"]
                                      for r in section["rows"])
  assert [c["result"] for c in sweep_doc.judge(section)] == before
  with open(path, encoding="utf-8") as f:
    seeds = [json.loads(line)["seed"] for line in f]
  _rewrite(path, lambda rec: {**rec, "config": "0" * 12} if rec["seed"] == 0 else rec)
  section = sweep_doc.load_section("ffn", repo)
  assert {r["overrides"]["seed"] for r in section["stale"]} == {0}
  # Only the seed-0 rows (one per arm) drop out.
  assert len(section["stale"]) == seeds.count(0) == 8
  assert len(section["rows"]) == len(seeds) - seeds.count(0)


def test_an_arm_with_points_but_no_results_awaits_a_run(tmp_path):
  """An arm added to a sweep after its run (here: heads' 32-head rows removed from the results
  file) has points in get_sweep but no committed rows: its claim reads pending, not untestable,
  and the other claims keep their verdicts."""
  repo = _copy_repo(tmp_path)
  path = os.path.join(repo, sweep_doc.RESULTS_DIR, "heads_medium.jsonl")
  before = {c["id"]: c["result"]["word"] for c in sweep_doc.judge(sweep_doc.load_section(
      "heads", repo))}
  def is_32_heads(line):
    overrides = json.loads(line)["overrides"]
    return overrides.get("model.num_heads") == 32 and "model.head_dim" not in overrides
  with open(path, encoding="utf-8") as f:
    kept = [line for line in f if not is_32_heads(line)]
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(kept)
  judged = {c["id"]: c["result"] for c in sweep_doc.judge(sweep_doc.load_section("heads", repo))}
  assert judged["many_heads_worse"]["word"] == sweep_doc.PENDING
  assert "awaits a run: num_heads=32 has points in the sweep" in judged["many_heads_worse"]["why"]
  assert judged["one_head_worse"]["word"] == before["one_head_worse"]


def test_bad_arguments_exit_2(capsys):
  assert sweep_doc.main(["--bogus"]) == 2
  assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["findings", "section:position"])
def test_a_missing_marker_names_the_fix(name):
  with pytest.raises(ValueError, match="add the two marker lines"):
    sweep_doc.replace_block("no markers here", name, "x", "docs/ablations.md")


def test_a_count_claims_note_gives_each_trained_seeds_margin():
  """The note lists metric - reference of the seeds with failed = 0, sorted, per arm, and the
  failed seed closest to the line; a diverged seed counts in n as failed. Hand-computed here."""
  def row(placement, seed, failed, loss, status="done"):
    return {"status": status, "overrides": {"model.norm_placement": placement, "seed": seed},
            "metrics": {"failed": failed, "eval/loss": loss, "unigram/loss": 3.0}}
  rows = [row("deepnorm", 0, 0.0, 2.875), row("deepnorm", 1, 1.0, 2.95),
          row("deepnorm", 2, 0.0, 1.75), row("deepnorm", 3, 1.0, 2.96),
          row("post", 0, 1.0, 3.0), row("post", 1, 1.0, float("nan"), "diverged")]
  claim = {"a": {"model.norm_placement": "deepnorm", "metric": "eval/loss"},
           "b": {"model.norm_placement": "post", "metric": "eval/loss"},
           "trained_margin": ("eval/loss", "unigram/loss", -0.1)}
  trained = sweep_doc._trained_seeds  # pylint: disable=protected-access
  note = trained(rows, claim, {"word": "direction only"})
  assert note == ("seeds that trained, by eval/loss - unigram/loss (trained below -0.1): "
                  "norm_placement=deepnorm 2 of 4 (-1.250, -0.125), closest failed -0.050; "
                  "norm_placement=post 0 of 2, closest failed +0.000")
  assert trained(rows, {**claim, "trained_margin": None}, {"word": "direction only"}) is None
