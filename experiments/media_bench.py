"""What the real-data benchmarks of the modalities share (experiments/bench_digits.py,
bench_digits_clip.py, bench_spoken_digits.py): train a config through experiments/train.py in a
child process (timed), read its metrics.jsonl, stamp the results with the machine, JAX version
and date, and write OUT/NAME.json and OUT/NAME.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def train(config: str, workdir: str, overrides: list[str]) -> float:
  """Runs experiments/train.py; the wall seconds it took. A finished workdir returns at once
  (the loop resumes at its last step): then the seconds are not the training's, and
  `reused(workdir)` said so before the call."""
  command = [sys.executable, os.path.join(ROOT, "experiments", "train.py"), f"--config={config}",
             f"--workdir={workdir}"] + [f"--config.{o}" for o in overrides]
  print("$", " ".join(command), flush=True)
  start = time.perf_counter()
  subprocess.run(command, check=True)
  return time.perf_counter() - start


def reused(workdir: str) -> bool:
  """Whether `workdir` already holds a run (its timing is then not measured here)."""
  return os.path.exists(os.path.join(workdir, "metrics.jsonl"))


def metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def curve(rows: list[dict], key: str) -> list[tuple[int, float]]:
  """(step, value) of every metrics row holding `key`."""
  return [(row["step"], row[key]) for row in rows if key in row]


def stamp() -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  return {"date": datetime.date.today().isoformat(), "jax": jax.__version__,
          "device": f"{jax.devices()[0].platform.upper()} ({os.cpu_count()}-core "
                    f"{platform.machine()}, shared)",
          "python": platform.python_version()}


def write(out: str, name: str, result: dict, table: list[str]) -> None:
  """OUT/NAME.json (result) and OUT/NAME.md (the stamp's line, then the table's lines)."""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  s = result["stamp"]
  lines = [f"`{result['command']}`", "", f"{s['device']}, JAX {s['jax']}, {s['date']}", ""]
  with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines + table) + "\n")
  print("\n".join(lines + table))


def parse_and_train(argv, description: str, prepared_help: str, config: str):
  """The real-data benchmarks' shared command line (--prepared, --workdir, --config, --seed,
  --out, KEY=VALUE overrides) and their training run: (args, reused, train seconds)."""
  import argparse  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--prepared", required=True, help=prepared_help)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--config", default=config)
  parser.add_argument("--seed", type=int, default=0, help="config.seed (init) and data.seed")
  parser.add_argument("--out", default="bench_results")
  parser.add_argument("overrides", nargs="*", help="more --config.KEY=VALUE, without --config.")
  args = parser.parse_args(argv)
  overrides = [f"data.path={args.prepared}", f"seed={args.seed}", f"data.seed={args.seed}",
               *args.overrides]
  was_there = reused(args.workdir)
  return args, was_there, train(args.config, args.workdir, overrides)
