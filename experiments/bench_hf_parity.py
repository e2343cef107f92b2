"""Measured parity of every Hugging Face family tfjax imports, on the tiny random models of
tests/hf/test_hf.py: max |tfjax logits - transformers logits| / max |transformers logits| (fp32),
and the seconds `tfjax.hf.importer.load` took (read, map, place; nothing written).

  python experiments/bench_hf_parity.py [--out=bench_results] [--names=llama3,phi]

Writes OUT/bench_hf_parity.json and .md stamped with the machine, JAX version and date.
"""

# pylint: disable=protected-access  (the shared helpers of tests/hf/test_hf.py)
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="bench_results")
  parser.add_argument("--names", default="", help="comma-separated test_hf.FACTORIES names "
                      "(default: all)")
  args = parser.parse_args(argv)
  import jax  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  import test_hf as parity  # pylint: disable=import-outside-toplevel
  from tfjax.hf import importer  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel
  names = [n for n in args.names.split(",") if n] or sorted(parity.FACTORIES)
  unknown = sorted(set(names) - set(parity.FACTORIES))
  if unknown:
    parser.error(f"--names: unknown {unknown}; choose from {sorted(parity.FACTORIES)}")
  rows = []
  scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench_hf_parity_"))
  for name in names:
    model, hf_dir = parity._hf_dir(scratch, name)
    start = time.time()
    cfg, params = importer.load(hf_dir)
    seconds = time.time() - start
    ids = parity._ids()
    if name == "roberta":
      ids[ids == model.config.pad_token_id] = 0
    dec = parity._ids(seed=3, length=7) if name in parity.SEQ2SEQ else None
    inputs = (ids,) if dec is None else (ids, dec)
    out = build_model(cfg).apply({"params": params}, *[a.astype(np.int32) for a in inputs])
    ours = np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)
    ref = parity._hf_logits(model, ids, dec)
    rel = float(np.abs(ours - ref).max() / np.abs(ref).max())
    rows.append(dict(name=name, model_type=model.config.model_type,
                     params=sum(int(np.size(p)) for p in jax.tree.leaves(params)),
                     max_rel_diff=rel, load_s=round(seconds, 2)))
    print(rows[-1], flush=True)
  meta = dict(machine=f"{platform.node()} {os.cpu_count()} CPUs", jax=jax.__version__,
              date=datetime.date.today().isoformat(),
              command="python experiments/bench_hf_parity.py " + " ".join(
                  sys.argv[1:] if argv is None else argv))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_hf_parity.json"), "w", encoding="utf-8") as f:
    json.dump(dict(meta, rows=rows), f, indent=2)
  lines = [f"`{meta['command']}` on {meta['machine']}, JAX {meta['jax']}, {meta['date']}", "",
           "| test model | model_type | params | max rel. logit diff | load |",
           "| --- | --- | --- | --- | --- |"]
  lines += [f"| {r['name']} | `{r['model_type']}` | {r['params']:,} | {r['max_rel_diff']:.1e} | "
            f"{r['load_s']} s |" for r in rows]
  with open(os.path.join(args.out, "bench_hf_parity.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
