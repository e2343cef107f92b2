"""Why attention divides by sqrt(d_k) (Vaswani et al. 2017, section 3.2.1 and footnote 4).

  python experiments/sqrt_dk_demo.py [--dims=4,16,64,256,1024] [--out=runs/sqrt_dk]

If the components of q and k are independent with mean 0 and variance 1, q.k = sum_i q_i k_i has
mean 0 and variance d_k: logits grow with the head dimension, the softmax saturates towards one-hot
and its gradients vanish. Dividing by sqrt(d_k) keeps the variance at 1 for every d_k.

Measured here with standard normal q, k (NumPy, seeded): the variance of q.k with and without the
scaling, and, for one query against `keys` random keys, how peaked the softmax gets (mean largest
weight; 1/keys is uniform, 1 is one-hot). Prints a table and writes OUT/sqrt_dk.md and
OUT/sqrt_dk.png.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import numpy as np

from tfjax.training.entry import cli

DIMS = (4, 16, 64, 256, 1024)


def _softmax_max(scores: np.ndarray) -> float:
  shifted = scores - scores.max(axis=-1, keepdims=True)
  weights = np.exp(shifted)
  weights /= weights.sum(axis=-1, keepdims=True)
  return float(weights.max(axis=-1).mean())


def score_statistics(dims: Sequence[int] = DIMS, samples: int = 20000, keys: int = 64,
                     queries: int = 1000, seed: int = 0) -> list[dict]:
  """Per d_k: var of q.k (unscaled, scaled by 1/sqrt(d_k)) over `samples` independent (q, k) pairs,
  and the mean largest softmax weight of `queries` queries over `keys` keys, both ways."""
  rng = np.random.default_rng(seed)
  rows = []
  for d in dims:
    chunk = max(1, 4_000_000 // d)  # bounded memory for large d_k
    scores = []
    for start in range(0, samples, chunk):
      n = min(chunk, samples - start)
      q = rng.standard_normal((n, d), dtype=np.float32)
      k = rng.standard_normal((n, d), dtype=np.float32)
      scores.append(np.einsum("nd,nd->n", q, k, dtype=np.float64))
    scores = np.concatenate(scores)
    q = rng.standard_normal((queries, d))
    k = rng.standard_normal((keys, d))
    logits = q @ k.T
    rows.append({"d_k": d, "var_unscaled": float(scores.var()),
                 "var_scaled": float((scores / np.sqrt(d)).var()),
                 "max_weight_unscaled": _softmax_max(logits),
                 "max_weight_scaled": _softmax_max(logits / np.sqrt(d))})
  return rows


def markdown(rows: Sequence[dict], keys: int) -> str:
  lines = ["| d_k | var(q·k) | var(q·k / sqrt(d_k)) | max softmax weight, unscaled | "
           "max softmax weight, scaled |", "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['d_k']} | {r['var_unscaled']:.3g} | {r['var_scaled']:.3f} | "
                 f"{r['max_weight_unscaled']:.3f} | {r['max_weight_scaled']:.3f} |")
  lines.append(f"\nq, k ~ N(0, I); softmax over {keys} keys (uniform: {1 / keys:.3f}, one-hot: 1).")
  return "\n".join(lines)


def plot(rows: Sequence[dict], path: str, keys: int) -> str:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  d = [r["d_k"] for r in rows]
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  left.loglog(d, [r["var_unscaled"] for r in rows], "o-", label="q·k")
  left.loglog(d, [r["var_scaled"] for r in rows], "s-", label="q·k / sqrt(d_k)")
  left.loglog(d, d, "k:", label="d_k")
  left.set(xlabel="d_k", ylabel="variance of the score", title="score variance")
  right.semilogx(d, [r["max_weight_unscaled"] for r in rows], "o-", label="unscaled")
  right.semilogx(d, [r["max_weight_scaled"] for r in rows], "s-", label="scaled")
  right.axhline(1 / keys, color="k", ls=":", label="uniform")
  right.set(xlabel="d_k", ylabel="mean largest softmax weight", ylim=(0, 1.05),
            title=f"softmax over {keys} keys")
  for ax in (left, right):
    ax.legend()
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  rows = score_statistics([int(d) for d in f.dims], samples=f.samples, keys=f.keys)
  os.makedirs(f.out, exist_ok=True)
  table = markdown(rows, f.keys)
  with open(os.path.join(f.out, "sqrt_dk.md"), "w", encoding="utf-8") as out:
    out.write(table + "\n")
  png = plot(rows, os.path.join(f.out, "sqrt_dk.png"), f.keys)
  print(table)
  print(f"wrote {png}")


if __name__ == "__main__":
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  absl_flags.DEFINE_list("dims", [str(d) for d in DIMS], "Head dimensions d_k.")
  absl_flags.DEFINE_integer("samples", 20000, "Independent (q, k) pairs per d_k.")
  absl_flags.DEFINE_integer("keys", 64, "Keys per query for the softmax statistics.")
  absl_flags.DEFINE_string("out", "runs/sqrt_dk", "Output directory.")
  cli.run_absl(main)
