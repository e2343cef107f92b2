"""The fit table of docs/scaling/aot.md: every shipped config compiled ahead of time for TPU
slices and an 8xH100 node from this CPU host (python -m tfjax.aot per row), with its verdict.

  python experiments/aot_fit_table.py [--only=REGEX] [--out=aot_results] [--write_docs]

Each row runs `python -m tfjax.aot` in its own process and keeps its JSON line; results
accumulate in OUT/fit_table.json (a rerun replaces only the rows it ran), so the table can be
built a few rows at a time. A row that does not fit is compiled again with its `fix` overrides,
and the table shows whether that fixed it. --write_docs renders every recorded row (and the rows
not yet run) into docs/scaling/aot.md between the aot-fit-table markers. Needs the tpu-aot and
cuda-aot extras; TFJAX_DATA_DIR for the text configs.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import time

from absl import flags

from tfjax.training.entry import cli

_ONLY = flags.DEFINE_string("only", "", "Run only rows whose key matches this regex.")
_OUT = flags.DEFINE_string("out", "aot_results", "Output directory (fit_table.json, .md).")
_WRITE_DOCS = flags.DEFINE_bool("write_docs", False, "Render the table into docs/scaling/aot.md.")
_TIMEOUT = flags.DEFINE_integer("timeout", 1800, "Seconds per compile.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("default", "shakespeare_char", "gpt2_small", "bert_base", "transformer_base",
           "llama2_7b")
TARGETS = ("v5e-8", "v5p-8", "v6e-8", "h100x8")
# Settings tried, in order, when a row does not fit (the first that fits is reported): ZeRO-3 over
# the devices for the 7B (its fp32 weights and Adam moments alone exceed a device).
FIXES = {"llama2_7b": [["--config.mesh.data=1", "--config.mesh.fsdp=-1"]]}
EXTRA_ROWS = [("llama2_7b", "v5p-64", []), ("llama2_70b", "v5p-256", [])]
# configs/bert_base.py is the published architecture (no MLM head, task 'lm' of the base config):
# it trains as a masked LM with its head on.
OVERRIDES = {"bert_base": ["--config.task=mlm", "--config.model.mlm_head=True"]}
MARKERS = ("<!-- aot-fit-table:start -->", "<!-- aot-fit-table:end -->")


def rows() -> list[tuple[str, str, list]]:
  return [(c, t, OVERRIDES.get(c, [])) for c in CONFIGS for t in TARGETS] + EXTRA_ROWS


def key(config: str, target: str, overrides: list) -> str:
  return " ".join([config, target, *overrides])


def compile_row(config: str, target: str, overrides: list) -> dict:
  command = [sys.executable, "-m", "tfjax.aot", f"--config=configs/{config}.py",
             f"--target={target}", *overrides]
  start = time.perf_counter()
  try:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            timeout=_TIMEOUT.value, env=dict(os.environ, PYTHONPATH=REPO))
  except subprocess.TimeoutExpired:
    return {"status": "timeout", "seconds": _TIMEOUT.value}
  seconds = time.perf_counter() - start
  lines = result.stdout.strip().splitlines()
  if result.returncode not in (0, 1) or not lines:
    error = (result.stderr.strip().splitlines() or ["?"])[-1]
    return {"status": "error", "error": error[:300], "seconds": seconds}
  out = {"status": "ok", "seconds": seconds, **json.loads(lines[-1])}
  if result.returncode == 1:
    out["verdict"] = lines[-2] if len(lines) > 1 else ""
  return out


def save(results: dict, path: str) -> None:
  with open(path, "w") as f:
    json.dump(results, f, indent=1)


def run_rows(results: dict, path: str) -> None:
  """Compiles the selected rows, saving the results after each (a row can take minutes)."""
  pattern = re.compile(_ONLY.value) if _ONLY.value else None
  for config, target, overrides in rows():
    name = key(config, target, overrides)
    if pattern and not pattern.search(name):
      continue
    row = compile_row(config, target, overrides)
    if row.get("fits") is False:
      for fix in FIXES.get(config, []):
        fixed = compile_row(config, target, overrides + fix)
        row["fix"] = {"overrides": fix, **fixed}
        if fixed.get("fits"):
          break
    row["date"] = datetime.date.today().isoformat()
    results[name] = row
    save(results, path)
    print(name, json.dumps(row), flush=True)


def _gib(n) -> str:
  return "" if n is None else f"{n / (1 << 30):.1f}"


def _cells(row: dict) -> str:
  if row.get("status") != "ok":
    return f"{row.get('status')}: {row.get('error', '')} | | | | |"
  # compiler / analytic (tfjax.aot's JSON: flops_per_step is the analytic count)
  ratio = (f"{row['xla_flops_per_step'] / row['flops_per_step']:.2f}"
           if row.get("xla_flops_per_step") and row.get("flops_per_step") else "")
  comm = (f"{sum(c['bytes'] for c in row['collectives']) / 1e9:.2f}"
          if row.get("collectives") is not None else "")
  step = f"{row['est_step_s'] * 1e3:.1f}" if row.get("est_step_s") else ""
  mfu = f"{100 * row['mfu_bound']:.0f}%" if row.get("mfu_bound") else ""
  fits = "yes" if row["fits"] else "**no**"
  return (f"{fits} | {_gib(row['bytes_per_device'])} / {_gib(row['hbm_bytes'])} | {ratio} | "
          f"{comm} | {step} | {mfu}")


def markdown(results: dict) -> str:
  out = ["| config | target | fits | GiB per device / HBM | compiled / analytic FLOPs | "
         "collective GB per step | roofline step ms | MFU bound | compile s | fix (verified) |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for config, target, overrides in rows():
    row = results.get(key(config, target, overrides))
    if row is None:
      out.append(f"| {config} | {target} | not run yet | | | | | | | |")
      continue
    fix = ""
    if "fix" in row:
      fixed = row["fix"]
      fix = (f"`{' '.join(fixed['overrides'])}`: "
             f"{'fits' if fixed.get('fits') else 'still does not fit'}, "
             f"{_gib(fixed.get('bytes_per_device'))} GiB")
    out.append(f"| {config} | {target} | {_cells(row)} | {row.get('seconds', 0):.0f} | {fix} |")
  return "\n".join(out) + "\n"


def write_docs(table: str) -> None:
  from tfjax.aot import report  # pylint: disable=import-outside-toplevel
  report.replace_marked_block(os.path.join(REPO, "docs", "scaling", "aot.md"), MARKERS, table)


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, "fit_table.json")
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      results = json.load(f)
  run_rows(results, path)
  table = markdown(results)
  with open(os.path.join(_OUT.value, "fit_table.md"), "w") as f:
    f.write(table)
  if _WRITE_DOCS.value:
    write_docs(table)
  print(table)


if __name__ == "__main__":
  cli.run_absl(main)
