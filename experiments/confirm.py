"""Run one section of a pre-registered confirmation plan (tfjax/research/confirm.py).

  python experiments/confirm.py --plan=configs/ablations/confirm/replication_1.py \\
      --section=norm_init --parallel=1

The plan must be committed as it stands (its commit goes into every result row). The section's
planned points train into --workdir (default runs/confirm/<plan id>/<section>) through
experiments/sweep.py, so a rerun resumes; then every finished point is written to
docs/ablations/results/confirm/<plan id>_<section>.jsonl with the plan's id, commit and hash.
Points whose rows that file already holds are not run again, so a section can be finished over
several sessions from the committed file (a fixed-size plan read only when complete: partial
rows are stored, never read). --export_only writes the finished points of --workdir without
running any (e.g. before a session ends). An existing results file of another plan version is
never overwritten. Rebuild the page with `python -m tfjax.research.sweep_doc`.
"""
import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags

from tfjax.training.entry import cli

_PLAN = flags.DEFINE_string("plan", None, "The plan module, configs/ablations/confirm/*.py.",
                            required=True)
_SECTION = flags.DEFINE_string("section", None, "The plan's section to run (e.g. norm_init).",
                               required=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Where the points train (default "
                               "runs/confirm/<plan id>/<section>).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at once (experiments/sweep.py).")
_PACK = flags.DEFINE_string("pack_seeds", "", "Passed to experiments/sweep.py: the planned seeds of "
                            "an arm trained as one program (K, or 'auto'; '' each alone).")
_EXPORT_ONLY = flags.DEFINE_bool("export_only", False, "Write the finished points of --workdir "
                                 "to the results file; train nothing.")


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every setting is a flag (see --help)")
  # pylint: disable-next=import-outside-toplevel
  from tfjax.research import confirm, sweep as sweep_lib, sweep_results
  try:
    module = sweep_lib.load_module(_PLAN.value)
    plan = module.PLAN
    module.get_sweep(_SECTION.value)  # an unknown section or claim fails here, before any run
    commit = module._plan.commit()  # pylint: disable=protected-access
  except ValueError as e:
    cli.fail(str(e))
  repo = module._plan.repo  # pylint: disable=protected-access
  out = confirm.results_path(repo, plan["id"], _SECTION.value)
  old_records = []  # the committed rows, read once
  if os.path.exists(out):
    with open(out, encoding="utf-8") as f:
      old_records = [json.loads(line) for line in f]
    foreign = [r for r in old_records
               if (r.get("plan") or {}).get("hash") != confirm.plan_hash(plan)]
    if foreign:
      cli.fail(f"{out} holds {len(foreign)} rows of another version of plan {plan['id']}; it "
               "is not overwritten: a changed plan is a new plan (new id, new file)")
  workdir = _WORKDIR.value or os.path.join("runs", "confirm", plan["id"], _SECTION.value)
  have = {r["point"] for r in old_records}
  planned = sweep_lib.load_sweep(f"{_PLAN.value}", _SECTION.value).points
  remaining = [p.name for p in planned if p.name not in have]
  args = [sys.executable, os.path.join(repo, "experiments", "sweep.py"),
          f"--config={_PLAN.value}:{_SECTION.value}", f"--workdir={workdir}",
          f"--parallel={_PARALLEL.value}"]
  if not remaining:
    print(f"every planned point of {_SECTION.value} has a row in {out}; nothing to run")
    return
  if _EXPORT_ONLY.value:
    if not os.path.isdir(workdir):
      cli.fail(f"--export_only: {workdir} does not exist, so no planned point finished there "
               "(give the --workdir the section ran in)")
    args.append("--report_only")
  else:
    args.append("--only=" + ",".join(remaining))
    if _PACK.value:
      args.append(f"--pack_seeds={_PACK.value}")
  with tempfile.TemporaryDirectory() as tmp:
    jsonl = os.path.join(tmp, "results.jsonl")
    code = subprocess.call(args + [f"--results_jsonl={jsonl}"])
    if not os.path.exists(jsonl):
      cli.fail(f"the sweep wrote no results (exit {code}); see its output above")
    with open(jsonl, encoding="utf-8") as f:
      new = [r for r in map(json.loads, f) if r["point"] not in have]
  if not new:  # nothing finished: an existing file stays as it is
    cli.fail(f"no planned point finished (sweep exit {code}); see its output above")
  order = {p.name: i for i, p in enumerate(planned)}
  records = sorted(old_records + confirm.stamp(new, plan, commit),
                   key=lambda r: order.get(r["point"], len(order)))
  sweep_results.write(out, records)
  print(f"{len(new)} new rows ({len(records)} of {len(planned)} planned) of plan {plan['id']} "
        f"(commit {commit}) -> {out}")
  sys.exit(code if not _EXPORT_ONLY.value else 0)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
