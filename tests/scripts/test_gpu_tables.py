"""docs/benchmarks/gpu.md's tables are what scripts/gpu_tables.py prints from the committed
results (docs/gpu/*.json), and those results say what the tables claim."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_doc_tables_are_generated_from_committed_results():
  printed = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_tables.py"),
                            os.path.join(REPO, "docs", "gpu")], capture_output=True, text=True,
                           check=True).stdout
  doc = open(os.path.join(REPO, "docs", "benchmarks", "gpu.md")).read()
  block = doc.split("<!-- gpu-tables -->\n")[1].split("<!-- /gpu-tables -->")[0]
  assert block == printed


def test_tuned_tilings_are_the_tuning_winners():
  """GPU_TILINGS' tuned bf16 rows are the fastest candidates in the committed tuning results."""
  from tfjax.nn.kernels.flash_attention import GPU_TILINGS  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO, "docs", "gpu", "tuning_h200.json")) as f:
    tuning = json.load(f)
  for head_dim in (64, 128):
    rows = [r for r in tuning["forward"] if r["head_dim"] == head_dim and r["status"] == "ok"]
    fastest = min(rows, key=lambda r: r["fwd_ms"])["tilings"]["forward"]
    rows = [r for r in tuning["backward"] if r["head_dim"] == head_dim and r["status"] == "ok"]
    fastest_bwd = min(rows, key=lambda r: r["fwd_bwd_ms"])["tilings"]["backward"]
    tilings = GPU_TILINGS[(head_dim, 2)]
    assert vars(tilings.forward) == fastest and vars(tilings.backward) == fastest_bwd
