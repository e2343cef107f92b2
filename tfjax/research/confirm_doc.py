"""docs/ablations.md's `confirm` block and the README headline's confirmation lines: the
pre-registered confirmations (configs/ablations/confirm/*.py, tfjax/research/confirm.py) beside
the exploratory verdicts (tfjax/research/sweep_doc.py places them)."""

import glob
import os

from tfjax.research import confirm, verdicts
from tfjax.research import sweep as sweep_lib


def confirmations(sections: list[dict], repo: str) -> list[dict]:
  """Every planned claim of the committed confirmation plans (configs/ablations/confirm/*.py):
  {'plan', 'commit', 'section', 'claim', 'before' (the exploratory word), 'word', 'evidence',
  'outcome': 'confirmed' | 'not confirmed (...)' | 'untestable here' | 'pending...' | 'not
  read'}. The confirmatory word is computed from the planned seeds alone, and only once every
  planned point of its section has a result (tfjax/research/confirm.py)."""
  exploratory = {(s["name"], c.get("id")): c for s in sections for c in s["judged"]}
  out = []
  for path in sorted(glob.glob(os.path.join(repo, "configs", "ablations", "confirm", "*.py"))):
    module = sweep_lib.load_module(path)
    for name, spec in module.PLAN["sections"].items():
      judged = confirm.judge(module, name, repo)
      commit = ", ".join(f"`{c}`" for c in judged["commit"] or ()) or "not run"
      results = {c["id"]: c.get("result") for c in judged["claims"]}
      for claim_id in spec["claims"]:
        before = exploratory.get((name, claim_id))
        before_word = before["result"]["word"] if before else "-"
        result = results.get(claim_id)
        if judged["status"] == "pending":
          word = "pending"
          outcome = "pending: nothing is read before every planned point has a result"
          evidence = f"{judged['done']} of {judged['planned']} planned points finished"
        elif judged["status"] != "read":
          word, evidence, outcome = judged["status"], judged["why"], "not read"
        else:
          word, evidence = result["word"], verdicts.format_ours(result)
          evidence += f" ({result['why']})" if result["why"] else ""
          # The exploratory word is what is confirmed or not; a different word is reported as
          # not confirmed even where the planned seeds read the claim more strongly.
          stronger = (" (the claim itself reads reproduced on the planned seeds)"
                      if word == "reproduced" else "")
          outcome = ("untestable here" if word == "untestable here" else "confirmed"
                     if word == before_word else
                     f"not confirmed ({before_word} -> {word}){stronger}")
        out.append({"plan": module.PLAN["id"], "commit": commit, "section": name,
                    "claim": before["claim"] if before else claim_id, "before": before_word,
                    "word": word, "evidence": evidence, "outcome": outcome})
  return out


def confirm_block(planned: list[dict]) -> str:
  """The confirmations' table: exploratory and confirmatory words side by side."""
  if not planned:
    return "No confirmation plan is committed."
  lines = ["| plan (commit) | section | claim | exploratory | confirmatory (fresh seeds) | "
           "confirmatory evidence | outcome |", "|---|---|---|---|---|---|---|"]
  lines += [f"| {c['plan']} ({c['commit']}) | {c['section']} | {c['claim']} | {c['before']} | "
            f"{c['word']} | {c['evidence']} | {c['outcome']} |" for c in planned]
  return "\n".join(lines)


def _confirm_headline(planned: list[dict]) -> list[str]:
  lines = []
  for plan in dict.fromkeys(c["plan"] for c in planned):
    outcomes = [c["outcome"].split(" (")[0].split(":")[0] for c in planned if c["plan"] == plan]
    counts = ", ".join(f"{outcomes.count(o)} {o}" for o in dict.fromkeys(outcomes))
    lines.append(f"- **confirmation `{plan}`** (pre-registered, fresh seeds): {len(outcomes)} "
                 f"planned claims: {counts} ([docs/ablations.md](docs/ablations.md"
                 "#confirmation-on-fresh-seeds-pre-registered))")
  return lines
