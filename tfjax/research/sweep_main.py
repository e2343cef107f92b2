"""`tfjax-sweep` / experiments/sweep.py: run a sweep (a config module with get_sweep) and
aggregate its results.

  python experiments/sweep.py --config=configs/ablations/ffn.py --workdir=runs/ffn --scale=smoke
  python experiments/sweep.py ... --parallel=2        # points in 2 child processes at a time
  python experiments/sweep.py ... --pack_seeds=auto  # each variant's seeds as one program
                                                      # (tfjax/research/sweep_packed.py)
  python experiments/sweep.py ... --report_only       # rewrite results.* and plots, train nothing
  python experiments/sweep.py ... --list              # print the points and exit
  python experiments/sweep.py ... --launcher=slurm --slurm.partition=gpu --slurm.gpus_per_node=8
                                                      # each point a job of one SLURM job array
  python experiments/sweep.py --status --workdir=runs/ffn   # each point's state, from its files
  python experiments/sweep.py ... --report_only \\
      --results_jsonl=docs/ablations/results/ffn_medium.jsonl  # the per-seed results to commit

Each point trains into WORKDIR/<point name>/. Running the same command again skips finished points
and resumes interrupted ones from their checkpoints; failed points are retried. At the end (also
after failures) it writes WORKDIR/results.csv (one row per point), results_summary.csv and
results.md (mean ± std over seeds per variant) and PNG plots. Exit status 1 if any point failed.
See tfjax/research/sweep.py for the config-module interface; --import=MODULE[,...] imports code
outside tfjax (a kind a point uses) first, in the children and jobs too. A bad flag or sweep
config ends in one `error:` line, exit 2 (tfjax/training/entry/cli.py); a point that diverged is a
result, not a failure (tfjax/training/loop/divergence.py).
"""

import os
import sys

from absl import flags

from tfjax.research import sweep_children, sweep_slurm
from tfjax.training.entry import cli

# --import=MODULE[,...]: imported now, before the sweep config names their kinds; children and
# jobs import them again (sweep_children, sweep_slurm), and every point's config.json records them.
cli.define_import_flag()
_CONFIG = flags.DEFINE_string("config", None, "Sweep config module, e.g. configs/ablations/ffn.py "
                              "(PATH:SCALE also accepted). Required except with --status.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (one subdirectory per point).",
                               required=True)
_SCALE = flags.DEFINE_string("scale", None, "Passed to get_config / get_sweep (and REPORT when it "
                             "is a function): smoke | medium | full.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at once (> 1: child processes).")
_ONLY = flags.DEFINE_string("only", "", "Run only these points: names as --list prints them, "
                            "comma-separated (names contain commas; each is matched whole).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only aggregate existing results.")
_LIST = flags.DEFINE_bool("list", False, "Print the point names and overrides, then exit.")
_LAUNCHER = flags.DEFINE_enum(
    "launcher", "local", ["local", "slurm", "submitit_local"], "Where points run: local (this "
    "process, or --parallel children), slurm (one job array through submitit; resources from "
    "--slurm.* and the sweep config's SLURM dict), submitit_local (submitit's jobs as local "
    "processes). See tfjax/research/sweep_slurm.py.")
_STATUS = flags.DEFINE_bool("status", False, "Print each point's state (done / running / queued "
                            "/ failed with its error) from the files in --workdir, then exit.")
_WAIT = flags.DEFINE_bool("wait", True, "slurm / submitit_local: wait for the jobs and write the "
                          "report (--nowait: submit and exit; --status follows them).")
_POLL_S = flags.DEFINE_float("poll_s", 2.0, "slurm / submitit_local: seconds between checks "
                             "on the running jobs.")
_SLURM = {key: flags.DEFINE_string(f"slurm.{key}", None, help_text)
          for key, help_text in sweep_slurm.Resources.HELP.items()}
_SLURM_SBATCH = flags.DEFINE_multi_string(
    "slurm.sbatch", [], "More sbatch options as KEY=VALUE, repeatable: --slurm.sbatch=account=proj "
    "--slurm.sbatch=qos=high.")
_SLURM_SETUP = flags.DEFINE_multi_string(
    "slurm.setup", [], "Shell lines run in each job before the point (module load ..., source "
    "venv/bin/activate), repeatable.")
_RESULTS = flags.DEFINE_string(
    "results_jsonl", "", "Also write the per-seed results (point, seed, the report's metrics, "
    "commit, runtime) to this JSONL file (tfjax/research/sweep_results.py), e.g. "
    "docs/ablations/results/ffn_medium.jsonl.")
_RESULTS_COMMIT = flags.DEFINE_string(
    "results_commit", "", "With --results_jsonl: the commit of points whose SWEEP_DONE.json "
    "records none (finished by an older sweep runner).")
_PACK = flags.DEFINE_string(
    "pack_seeds", "", "Train the points of one variant that differ only in seed together as one "
    "program, K per group (an integer >= 2), or 'auto' (as many as the memory plan fits); "
    "''/0: each point alone. Local launcher; with --parallel=N, one group per child "
    "(tfjax/research/sweep_packed.py).")
_CACHE = flags.DEFINE_string(
    "compilation_cache", "", "Persistent XLA compilation cache (points differing only in seeds "
    "compile once). Default WORKDIR/.jax_cache; 'none' turns it off.")


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every setting is a flag (see --help)")
  # pylint: disable-next=import-outside-toplevel
  from tfjax.research import sweep as sweep_lib, sweep_report
  from tfjax.research import sweep_status  # pylint: disable=import-outside-toplevel
  if _STATUS.value:
    print(sweep_status.format_status(sweep_status.collect(_WORKDIR.value)))
    return
  if not _CONFIG.value:
    cli.fail("--config is required (e.g. --config=configs/ablations/ffn.py)")
  if _POLL_S.value <= 0:
    cli.fail(f"--poll_s={_POLL_S.value}: give the seconds between job checks, > 0 (e.g. 2)")
  path, _, scale = _CONFIG.value.partition(":")
  scale = _SCALE.value or scale or None
  sweep = sweep_lib.load_sweep(path, scale)  # every point checked before anything runs
  root = _WORKDIR.value
  if _LIST.value:
    for point in sweep.points:
      print(f"{point.name}\t{point.overrides}")
    return
  only = sweep.select(_ONLY.value)
  pack = _pack_setting()
  statuses = {}
  if not _REPORT_ONLY.value:
    cache = _CACHE.value or os.path.join(root, ".jax_cache")
    cache = None if cache == "none" else cache
    try:
      if _LAUNCHER.value == "local" and _PARALLEL.value > 1:
        sweep_lib.write_sweep_file(sweep, root)
        statuses = sweep_children.run_in_children(
            sweep, root, [sweep.point(n) for n in only] if only else list(sweep.points),
            _PARALLEL.value, cache, pack=pack)
      elif pack is not None:
        from tfjax.research import sweep_packed  # pylint: disable=import-outside-toplevel
        statuses = sweep_packed.run_packed(
            sweep, root, [sweep.point(n) for n in only] if only else list(sweep.points), pack,
            compilation_cache=cache)
      elif _LAUNCHER.value == "local":
        statuses = sweep_lib.run_sweep(sweep, root, only=only, compilation_cache=cache)
      else:
        resources = sweep_slurm.Resources.from_sources(sweep.slurm, {
            **{k: f.value for k, f in _SLURM.items()}, "sbatch": _SLURM_SBATCH.value,
            "setup": _SLURM_SETUP.value})
        statuses = sweep_slurm.launch(
            sweep, root, [sweep.point(n) for n in only] if only else sweep.points,
            launcher=_LAUNCHER.value, resources=resources, compilation_cache=cache,
            parallel=_PARALLEL.value, wait=_WAIT.value, poll_s=_POLL_S.value)
        if not _WAIT.value:
          print(f"submitted {sum(s == 'submitted' for s in statuses.values())} point(s); "
                f"follow them with: python {sys.argv[0]} --status --workdir={root}")
          return
    except KeyboardInterrupt:
      print("interrupted; run the same command again to resume", file=sys.stderr)
      sys.exit(130)
  title = f"Sweep {path}" + (f" (scale {scale})" if scale else "")
  result = sweep_report.write_report(root, sweep.points, sweep.report, title=title)
  if _RESULTS.value:
    _write_results(root, result, _RESULTS.value)
  counts = {s: sum(v == s for v in statuses.values()) for s in set(statuses.values())}
  print(f"points: {counts or 'none run'}; results: {os.path.join(root, 'results.md')}; "
        f"{len(result['plots'])} plots")
  failed = [r["name"] for r in result["rows"] if r["status"] == "failed"]
  if failed:
    print(f"failed points ({len(failed)}): {', '.join(failed)}", file=sys.stderr)
    sys.exit(1)
  if "interrupted" in statuses.values():
    print("interrupted; run the same command again to resume", file=sys.stderr)
    sys.exit(130)


def _pack_setting():
  """--pack_seeds as sweep_packed.parse_pack reads it; an error line where it cannot apply."""
  from tfjax.research import sweep_packed  # pylint: disable=import-outside-toplevel
  try:
    pack = sweep_packed.parse_pack(_PACK.value)
  except ValueError as e:
    cli.fail(str(e))
  if pack is not None and _LAUNCHER.value != "local":
    cli.fail(f"--pack_seeds={_PACK.value} needs --launcher=local (groups run in this process, "
             "or one group per child with --parallel=N)")
  if pack == sweep_packed.AUTO and _PARALLEL.value > 1:
    cli.fail("--pack_seeds=auto sizes one group for the whole device; with --parallel > 1 give "
             "the group size, e.g. --pack_seeds=3")
  return pack


def _write_results(root, result, path) -> None:
  """The per-seed results file of the finished points (an error line if one records no commit)."""
  # pylint: disable-next=import-outside-toplevel
  from tfjax.research import sweep as sweep_lib, sweep_results
  done_files = {r["name"]: sweep_lib.read_json(os.path.join(root, r["name"], sweep_lib.DONE_FILE))
                for r in result["rows"] if r["status"] in ("done", "diverged")}
  try:
    recs = sweep_results.records(result["rows"], done_files, result["metrics"],
                                 _RESULTS_COMMIT.value or None)
  except ValueError as e:
    cli.fail(str(e))
  sweep_results.write(path, recs)
  print(f"per-seed results of {len(recs)} points: {path}")


def run():
  """The `tfjax-sweep` console script."""
  cli.run_absl(main)


if __name__ == "__main__":
  run()
