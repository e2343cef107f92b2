"""Rebuilds docs/ablations.md's generated blocks, its figures and README.md's headline block from
the committed per-seed results (docs/ablations/results/<sweep>_<scale>.jsonl) alone.

  python -m tfjax.research.sweep_doc            # rewrite the blocks and figures
  python -m tfjax.research.sweep_doc --check    # exit 1 if a block differs from its regeneration

A generated block sits between `<!-- sweep_doc:NAME begin -->` and `<!-- sweep_doc:NAME end -->`;
text outside the blocks is hand-written and states no result. Blocks: `findings` (one row per
claim: claim, the paper's number, ours, verdict), `rule` (the verdict rule,
tfjax/research/verdicts.py), `aot` (the full-scale configs compiled ahead of time),
`section:<sweep>` (per sweep: scale, commits, runtime, tables,
figures, claims with their evidence) and, in README.md between `<!-- ablation-headlines:begin -->`
and `<!-- ablation-headlines:end -->`, a line per sweep.
A sweep is every configs/ablations/*.py not starting with '_'; its results are the file of the
largest scale present (full, medium, smoke). A sweep without a results file shows "pending
rerun" and the command that makes one. Everything is a function of the committed files: a rerun
gives the same bytes.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import sys
from typing import Optional

from tfjax.research import sweep as sweep_lib
from tfjax.research import (qualifiers, robustness, sweep_plots, sweep_results, sweep_scale,
                            sweep_tables, verdicts)
from tfjax.research.sweep_tables import arm_label as _arm_label
from tfjax.research.sweep_tables import arms_by_device as _arms_by_device, wall_time_text
from tfjax.research.aot_table import aot_block  # noqa: F401  (the doc's `aot` block)
from tfjax.research.confirm_doc import (  # noqa: F401  (the doc's `confirm` block)
    _confirm_headline, confirm_block, confirmations)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC, README = "docs/ablations.md", "README.md"
RESULTS_DIR, FIGURES_DIR = "docs/ablations/results", "docs/figures"
SCALES = ("full", "medium", "smoke")  # the largest scale with results is the one reported
PENDING = "pending rerun"


def sweeps(repo: str = REPO) -> list[str]:
  paths = glob.glob(os.path.join(repo, "configs", "ablations", "*.py"))
  return sorted(os.path.basename(p)[:-3] for p in paths
                if not os.path.basename(p).startswith("_"))


def rerun_command(name: str, scale: str = "medium") -> str:
  return (f"python experiments/sweep.py --config=configs/ablations/{name}.py --scale={scale} "
          f"--workdir=runs/ablations/{name}_{scale} --parallel=2 --results_jsonl="
          f"{RESULTS_DIR}/{name}_{scale}.jsonl")


def _call(module, attr, scale):
  value = getattr(module, attr, None)
  return value(scale) if callable(value) else (value or ([] if attr == "CLAIMS" else {}))


def point_fingerprints(module, scale: str) -> dict[str, dict]:
  """{config fingerprint: the point's overrides but the seeds} of every point the config's
  get_sweep(scale) makes now (the first point of a fingerprint, where two resolve alike)."""
  base, out = module.get_config(scale), {}
  for point in module.get_sweep(scale):
    fingerprint = sweep_results.config_fingerprint(sweep_lib.apply_overrides(base, point))
    out.setdefault(fingerprint, {k: v for k, v in point.items() if k not in sweep_lib.SEED_KEYS})
  return out


def _current(row: dict, arms: dict) -> Optional[dict]:
  """The row as a result of the current config (its overrides those of the current point that
  trains the same thing, seeds kept), or None: no fingerprint, or one no current point gives."""
  arm = arms.get(row["config"]) if row["config"] else None
  if arm is None:
    return None
  seeds = {k: v for k, v in row["overrides"].items() if k in sweep_lib.SEED_KEYS}
  return {**row, "overrides": {**arm, **seeds}}


def load_section(name: str, repo: str = REPO) -> dict:
  """{'name', 'scale' (None: no results), 'rows' (of the current config), 'stale' (rows of
  another config: no fingerprint, or one the current config does not give), 'all_rows',
  'claims', 'report', 'points', 'results'}.

  Which results belong to which config: a row is used only when its recorded config fingerprint
  (sweep_results.config_fingerprint of the resolved config it trained) is one that a point of
  the current config gives; it then takes that point's overrides, so an arm whose spelling
  changed but whose training did not keeps its results, and one whose learning rate, warmup,
  depth, embedding or other setting changed awaits a rerun."""
  module = sweep_lib.load_module(os.path.join(repo, "configs", "ablations", f"{name}.py"))
  for scale in SCALES:
    path = os.path.join(repo, RESULTS_DIR, f"{name}_{scale}.jsonl")
    if os.path.exists(path):
      rows = sweep_results.load(path)
      arms = point_fingerprints(module, scale)
      current = [_current(r, arms) for r in rows]
      return {"name": name, "scale": scale, "rows": [r for r in current if r],
              "all_rows": rows, "stale": [r for r, c in zip(rows, current) if c is None],
              "claims": _call(module, "CLAIMS", scale), "report": _call(module, "REPORT", scale),
              "points": len(module.get_sweep(scale)), "results": os.path.relpath(path, repo),
              "sweep": module.get_sweep(scale), "module": module}
  return {"name": name, "scale": None, "module": module, "rows": [], "all_rows": [], "stale": [],
          "claims": _call(module, "CLAIMS", "medium"), "report": {},
          "points": len(module.get_sweep("medium")), "results": None}


def judge(section: dict) -> list[dict]:
  """Each claim with its verdict ('pending rerun' without results)."""
  if section["scale"] is None:
    return [{**claim, "result": {"word": PENDING, "why": "no per-seed results committed",
                                 "delta": None}} for claim in section["claims"]]
  waiting = {i: why for i, claim in enumerate(section["claims"])
             if (why := _awaits_rerun(section, claim))}
  testable = [c for i, c in enumerate(section["claims"]) if i not in waiting]
  judged = verdicts.judge_claims(section["rows"], testable)  # Holm: one family
  loo = iter(robustness.leave_one_out(section["rows"], testable))
  results = iter(judged)
  out = []
  for i, claim in enumerate(section["claims"]):
    caveats, robust = [], "-"
    if i in waiting:
      result = {"word": PENDING, "why": waiting[i], "delta": None}
    else:
      result = next(results)
      if "secondary" in claim:
        second = {k: v for k, v in claim["secondary"].items() if k != "label"}
        result["secondary"] = verdicts.verdict(section["rows"], {**claim, **second})
      caveats = qualifiers.of_claim(section["rows"], claim)
      robust = robustness.describe(next(loo), result["word"], result.get("secondary"))
    trained = _trained_seeds(section["rows"], claim, result)
    out.append({**claim, "result": result, "trained": trained, "caveats": caveats,
                "robustness": robust})
  return out + _aggregates(section, out)


def _aggregates(section: dict, judged: list) -> list:
  """A section's aggregate claims (its config's AGGREGATES: {'id', 'claim', 'paper', 'of':
  [claim ids]}), where the paper makes one over several pairs: *reproduced* only when every
  member claim reads reproduced (an intersection-union test: each member at the rule's level),
  else *not reproduced*, with the members' words counted."""
  out = []
  for agg in _call(section.get("module"), "AGGREGATES", section["scale"] or "medium") or ():
    members = [c for c in judged if c["id"] in agg["of"]]
    words = [c["result"]["word"] for c in members]
    if PENDING in words or not members:
      word, why = PENDING, "a member claim awaits a run"
    else:
      word = "reproduced" if all(w == "reproduced" for w in words) else "not reproduced"
      counts = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(words))
      why = f"aggregate of {len(members)} claims: {counts}"
    out.append({**agg, "aggregate": True, "caveats": [], "robustness": "-", "trained": None,
                "result": {"word": word, "why": why, "delta": None}})
  return out


def _trained_seeds(rows: list, claim: dict, result: dict) -> Optional[str]:
  """A count claim's note on how narrowly its seeds counted as trained or failed:
  claim['trained_margin'] = (metric, reference, line) prints metric - reference of each seed that
  did not fail (its `failed` is 0) and of the failed seed closest to the line (diverged seeds
  count as failed), against the line a seed must be below to count as trained. A count alone
  hides a seed that cleared, or missed, the line by a hair."""
  if not claim.get("trained_margin") or result["word"] == PENDING:
    return None
  metric, reference, line = claim["trained_margin"]
  keys = [k for k in claim["a"] if k != "metric" and claim["a"][k] != claim["b"].get(k)]
  parts = []
  for side in (claim["a"], claim["b"]):
    members = [r for r in rows if r["status"] in ("done", "diverged") and verdicts.matches(r, side)]
    margin = lambda r: r["metrics"][metric] - r["metrics"][reference]  # noqa: E731
    trained = sorted(margin(r) for r in members
                     if r["status"] == "done" and r["metrics"].get("failed") == 0)
    missed = [margin(r) for r in members if r["status"] == "done"
              and r["metrics"].get("failed") == 1 and math.isfinite(r["metrics"][metric])]
    arm = _arm_label((k, side[k]) for k in keys)
    parts.append(f"{arm} {len(trained)} of {len(members)}"
                 + (f" ({', '.join(f'{v:+.3f}' for v in trained)})" if trained else "")
                 + (f", closest failed {min(missed):+.3f}" if missed else ""))
  return (f"seeds that trained, by {metric} - {reference} (trained below {line:+g}): "
          + "; ".join(parts))


def _awaits_rerun(section: dict, claim: dict) -> Optional[str]:
  """Why a claim awaits a rerun: an arm it compares has fewer than 2 rows of the current config
  while the results file holds rows of another config (see load_section), or while the sweep
  has points of that arm with no committed result (an arm added since the run); else None."""
  if claim.get("kind") != "mrr":
    for side in (claim["a"], claim["b"]):
      if "value" in side:
        continue
      planned = sum(verdicts.matches({"overrides": p}, side) for p in section.get("sweep", ()))
      if planned and sum(verdicts.matches(r, side) for r in section["rows"]) < min(planned, 2):
        arm = _arm_label((k, v) for k, v in side.items() if k != "metric")
        return (f"awaits a run: {arm} has points in the sweep but no committed results (the "
                f"command: {section['name']}'s section)")
  if not section["stale"]:
    return None
  if claim.get("kind") == "mrr":
    spec = claim["mrr"]
    sides = [{spec["arms"]: arm} for arm in spec.get("all_arms") or ()]
  else:
    sides = [claim["a"], claim["b"]]
  for side in sides:
    exact = claim.get("kind") != "mrr"
    if sum(verdicts.matches(r, side, exact) for r in section["rows"]) < 2:
      arm = _arm_label((k, v) for k, v in side.items() if k != "metric")
      return (f"awaits a rerun: the committed results of {arm} are of another config of this "
              f"sweep (the command: {section['name']}'s section)")
  return None


def _ours(claim: dict) -> str:
  result = claim["result"]
  if result["word"] == PENDING or claim.get("aggregate"):
    return "-"
  return verdicts.format_ours(result, claim.get("kind", "mean"))


def _note(claim: dict) -> str:
  """The section table's note: the reason (untestable, near the threshold, bimodal, ...) and the
  claim on its second metric."""
  result, notes = claim["result"], [claim["result"]["why"], claim.get("trained")]
  if "secondary" in result:
    second = result["secondary"]
    notes.append(f"{claim['secondary']['label']} (second metric): {second['word']}, "
                 f"{verdicts.format_ours(second)}" + (f", {second['why']}" if second["why"]
                                                       else ""))
  return "; ".join(n for n in notes if n) or "-"


def _word(claim: dict) -> str:
  """The findings table's verdict: the word, with its reason or scope (why no verdict was
  reached; what a ranking ranked over; that failed seeds made it a count) where there is one."""
  result = claim["result"]
  text = f"{result['word']} ({result['why']})" if result["why"] else result["word"]
  caveats = claim.get("caveats") or ()
  return text + (f"; **caveats:** {'; '.join(caveats)}" if caveats else "")


def _claim(claim: dict) -> str:
  """The claim as tested: a ranking names the settings it ranked over (the paper's may be more)."""
  ranked = claim.get("result", {}).get("ranked")
  return f"{claim['claim']}, on {', '.join(map(str, ranked))} only" if ranked else claim["claim"]


def findings_block(sections: list[dict]) -> str:
  lines = ["| sweep | claim | paper | ours | verdict | robustness |", "|---|---|---|---|---|---|"]
  for section in sections:
    scale = section["scale"] or "no results"
    for claim in section["judged"]:
      lines.append(f"| {section['name']} ({scale}) | {_claim(claim)} | {claim['paper']} | "
                   f"{_ours(claim)} | {_word(claim)} | {claim.get('robustness', '-')} |")
  return "\n".join(lines)


def section_block(section: dict) -> str:
  name, rows = section["name"], section["all_rows"]
  if section["scale"] is None:
    return (f"**Verdicts: {PENDING}.** No per-seed results of this sweep are committed, so no "
            f"verdict can be derived. To make them (then rerun the Regenerate command):\n\n"
            f"```bash\n{rerun_command(name)}\n```")
  commits = sorted({r["commit"] for r in rows})
  seconds = sum(r["seconds"] or 0.0 for r in rows)
  devices = sorted({r["device"] for r in rows if r.get("device")})
  unnamed = sum(not r.get("device") for r in rows)
  where = (f" on {' and '.join(devices)}" if devices else "") + (
      f" ({unnamed} of the {len(rows)} points recorded no device: run before points named it)"
      if unnamed else "")
  seeds = sorted({r["overrides"].get("seed") for r in rows})
  lines = [f"Results: `{section['results']}`, scale **{section['scale']}**, {len(rows)} of "
           f"{section['points']} points of the sweep, seeds {', '.join(map(str, seeds))}, run at "
           f"commit {', '.join(f'`{c}`' for c in commits)}; the points' training and evaluation "
           f"took {seconds / 60:.1f} min in all{where} (the sum of the runtimes the points "
           "recorded: a point resumed from a checkpoint records its last attempt only); "
           + wall_time_text(rows), ""]
  if len(devices) > 1:
    lines += [_arms_by_device(rows), ""]
  if section["stale"]:
    arms = {json.dumps({k: v for k, v in r["overrides"].items()
                        if k not in sweep_lib.SEED_KEYS}, sort_keys=True)
            for r in section["stale"]}
    lines += [f"**{len(section['stale'])} of these {len(rows)} points are results of another "
              f"config of this sweep** (their config fingerprint, `tfjax/research/"
              f"sweep_results.config_fingerprint`, is not the one the current config gives "
              f"their arm; {len(arms)} arms): they are left out of every table, figure and "
              f"verdict below, and the claims on those arms await a rerun:", "",
              f"```bash\n{rerun_command(name, section['scale'])}\n```", ""]
  rows = section["rows"]
  lines += ["| claim | paper | ours | verdict | caveats | robustness | note |",
            "|---|---|---|---|---|---|---|"]
  for claim in section["judged"]:
    lines.append(f"| {_claim(claim)} | {claim['paper']} | {_ours(claim)} | "
                 f"{claim['result']['word']} | {'; '.join(claim.get('caveats') or ()) or '-'} | "
                 f"{claim.get('robustness', '-')} | {_note(claim)} |")
  lines.append("")
  available = sorted({k for r in rows if r["status"] == "done" for k in r["metrics"]})
  metrics = sweep_tables.expand_metrics(section["report"].get("metrics",
                                                              sweep_tables.DEFAULT_METRICS),
                                        available)
  summary = sweep_tables.summarize(rows, metrics)
  rankings = [r for spec in section["report"].get("mrr", ())
              for r in _rankings(section, summary, metrics, spec)]
  table = sweep_tables.markdown("", rows, summary, metrics, rankings)
  table = re.sub(r"^## ", "#### ", table.split("\n", 2)[2], flags=re.M).strip()
  lines.append(table)
  files = [spec["file"] for spec in section["report"].get("plots", ())] + [
      spec["file"] for spec in section["report"].get("mrr", ())]
  lines += [""] + [f"![{f}](figures/{f})" for f in files if section["rows"]]
  return "\n".join(lines)


def _rankings(section: dict, summary: list, metrics: list, spec: dict) -> list[dict]:
  """The MRR over every setting (the figure's), labelled as such, then the MRR over the
  settings the section's rank claims were judged on (the verdicts' precondition and controls
  leave tasks out), so that neither table passes for the other."""
  everything = sweep_tables.rank_arms(summary, metrics, spec)
  if everything is None:
    return []
  key = spec["settings"][0] if spec.get("settings") else None
  ranked = next((c["result"]["ranked"] for c in section["judged"]
                 if c.get("kind") == "mrr" and c["result"].get("ranked")), None)
  if key is None or ranked is None:
    return [everything]
  out = [{**everything, "heading": everything["heading"] + ": every task, also those the "
          "verdicts leave out; not the ranking the verdicts use"}]
  used = sweep_tables.rank_arms([e for e in summary if e["variant"].get(key) in ranked],
                                metrics, spec)
  if used is not None:
    out.append({**used, "heading": used["heading"] + f": over {', '.join(map(str, ranked))}, "
                "the tasks the verdicts rank (the seed-mean ranking; the verdicts compare "
                "per-seed MRR)"})
  return out


def headline_block(sections: list[dict], planned: list[dict] = ()) -> str:
  """One line per sweep: how many claims got each verdict word, and what rankings ranked over;
  then one line per confirmation plan: how many of its claims were confirmed."""
  lines = []
  for section in sections:
    pairs = [c for c in section["judged"] if not c.get("aggregate")]
    words = [c["result"]["word"] for c in pairs]
    counts = ", ".join(_headline_count(pairs, w) for w in (*verdicts.WORDS, PENDING)
                       if words.count(w))
    aggregates = "".join(f"; aggregate \"{c['claim']}\": {c['result']['word']}"
                         for c in section["judged"] if c.get("aggregate"))
    scale = f"{section['scale']} scale" if section["scale"] else "no per-seed results yet"
    ranked = sorted({str(s) for c in section["judged"] for s in c["result"].get("ranked", ())})
    scope = f"; rankings over {', '.join(ranked)} only" if ranked else ""
    lines.append(f"- **{section['name']}** ({scale}): {len(words)} claims: {counts}{scope}"
                 f"{aggregates} ([docs/ablations.md](docs/ablations.md))")
  return "\n".join(lines + _confirm_headline(list(planned)))


def _headline_count(claims: list, word: str) -> str:
  """'3 reproduced (2 with caveats: pilot-selected setting, one task)': a word's count, and how
  many of those claims carry caveats, by the caveats' names."""
  having = [c for c in claims if c["result"]["word"] == word]
  caveated = [c for c in having if c.get("caveats")]
  names = list(dict.fromkeys(qualifiers.short(q) for c in caveated for q in c["caveats"]))
  return f"{len(having)} {word}" + (f" ({len(caveated)} with caveats: {', '.join(names)})"
                                    if caveated else "")


def replace_block(text: str, name: str, body: str, path: str) -> str:
  """`text` with the block NAME's body replaced (README's block is marked
  `<!-- ablation-headlines:begin -->` ... `:end -->`, the doc's `<!-- sweep_doc:NAME begin -->`)."""
  if name == "ablation-headlines":
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
  else:
    begin, end = f"<!-- sweep_doc:{name} begin -->", f"<!-- sweep_doc:{name} end -->"
  pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
  if not pattern.search(text):
    raise ValueError(f"{path} has no block {begin} ... {end}; add the two marker lines")
  return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text, count=1)


def regenerate(repo: str = REPO, figures: bool = True) -> dict[str, str]:
  """{path: new text} of the doc and README; figures (when True) are written as a side effect."""
  doc_path, readme_path = os.path.join(repo, DOC), os.path.join(repo, README)
  with open(doc_path, encoding="utf-8") as f:
    doc = f.read()
  # In the page's order of sections; a sweep without one is an error of replace_block below.
  order = lambda n: doc.find(f"<!-- sweep_doc:section:{n} begin -->") % (len(doc) + 1)  # noqa: E731
  sections = [load_section(n, repo) for n in sorted(sweeps(repo), key=order)]
  for section in sections:
    section["judged"] = judge(section)
  doc = replace_block(doc, "findings", findings_block(sections), DOC)
  doc = replace_block(doc, "rule", verdicts.RULE_TEXT, DOC)
  doc = replace_block(doc, "aot", aot_block(repo), DOC)
  doc = replace_block(doc, "scale", sweep_scale.scale_block(sections), DOC)
  planned = confirmations(sections, repo)
  doc = replace_block(doc, "confirm", confirm_block(planned), DOC)
  for section in sections:
    doc = replace_block(doc, f"section:{section['name']}", section_block(section), DOC)
    if figures and section["rows"]:
      _figures(section, os.path.join(repo, FIGURES_DIR))
  with open(readme_path, encoding="utf-8") as f:
    readme = replace_block(f.read(), "ablation-headlines", headline_block(sections, planned),
                           README)
  return {doc_path: doc, readme_path: readme}


def _figures(section: dict, out_dir: str) -> None:
  rows = section["rows"]
  for spec in section["report"].get("plots", ()):
    sweep_plots.plot(spec, rows, out_dir)
  available = sorted({k for r in rows if r["status"] == "done" for k in r["metrics"]})
  metrics = sweep_tables.expand_metrics(section["report"].get("metrics", ()), available)
  summary = sweep_tables.summarize(rows, metrics)
  for spec in section["report"].get("mrr", ()):
    if ranking := sweep_tables.rank_arms(summary, metrics, spec):
      sweep_plots.plot_ranking(ranking, out_dir)


def main(argv: Optional[list] = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  check = argv == ["--check"]
  if argv and not check:
    print(f"error: unexpected arguments {argv}; the only flag is --check", file=sys.stderr)
    return 2
  texts = regenerate(figures=not check)
  stale = []
  for path, text in texts.items():
    with open(path, encoding="utf-8") as f:
      if f.read() != text:
        stale.append(path)
    if not check:
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
  if check and stale:
    print(f"stale: {', '.join(stale)}; run python -m tfjax.research.sweep_doc", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
