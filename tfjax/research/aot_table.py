"""docs/ablations.md's `aot` block: the full-scale configs compiled ahead of time
(docs/ablations/results/aot_full.jsonl, one `python -m tfjax.aot` JSON line each, with its command
and commit); tfjax/research/sweep_doc.py places it."""

import json
import os

AOT_FILE = os.path.join("docs", "ablations", "results", "aot_full.jsonl")


def _kernel_sum(rec: dict) -> str:
  """The kernel-sum estimate (tfjax/aot/kernel_model.py; GPU targets, recorded since it exists)."""
  seconds = rec.get("est_step_kernel_sum_s")
  return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def aot_block(repo: str) -> str:
  """The full-scale configs compiled ahead of time (docs/ablations/results/aot_full.jsonl, one
  `python -m tfjax.aot` JSON line each, with its command and commit)."""
  path = os.path.join(repo, AOT_FILE)
  if not os.path.exists(path):
    return "No full-scale config has been compiled ahead of time yet."
  lines = ["| config | target | fits | memory per device | roofline step time (lower bound) | "
           "kernel-sum step time (estimate) | compiler FLOPs per step | command, commit |",
           "|---|---|---|---|---|---|---|---|"]
  with open(path, encoding="utf-8") as f:
    for rec in map(json.loads, f):
      lines.append(
          f"| `{rec['config']}` | {rec['target']} | {'yes' if rec['fits'] else 'no'} | "
          f"{rec['bytes_per_device'] / 2 ** 30:.2f} of {rec['hbm_bytes'] / 2 ** 30:.1f} GiB | "
          f"{rec['est_step_s'] * 1e3:.2f} ms (MFU bound {rec['mfu_bound']:.0%}) | "
          f"{_kernel_sum(rec)} | {rec['xla_flops_per_step']:.3g} | `{rec['command']}`, "
          f"`{rec['commit']}`, jax {rec['jax']} |")
  return "\n".join(lines)
