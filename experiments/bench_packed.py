"""Points per hour of ablation variants' seeds: packed into one program vs separate processes.

  python experiments/bench_packed.py --config=configs/ablations/ffn.py --scale=medium \
      [--arm=0] [--arms=1] [--seeds=0] [--steps=60] [--parallel=2] [--out=bench_results]

Takes `arms` variants of the sweep from the `arm`-th on (each with its first `seeds` seeds; 0:
all), shortens training to `steps` steps (0: the config's own; one eval and one checkpoint, at
the end), and runs them twice through experiments/sweep.py, each into a fresh workdir with its
own compilation cache: separately (--parallel=N child processes, today's way on a few cores)
and packed (--pack_seeds=auto --parallel=N: one group per variant, N groups at a time, as a
packed section runs). Times are whole sweep commands (start-up,
compilation, training, evaluation, report), so points/hour is what a user of the command gets;
`steady_tokens_per_sec` is the per-seed rate the points logged after their first log row.
Memory: each command's peak RSS (the largest process) and the memory plan's bytes of the packed
group with the group size `auto` chose. Writes OUT/bench_packed.json and OUT/bench_packed.md
stamped with the device, the load average before and after, and the date: a shared machine's
other processes slow both modes, so compare only numbers of one run.
"""

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from absl import app, flags
import jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = flags.DEFINE_string("config", "configs/ablations/ffn.py", "Ablation sweep module.")
_SCALE = flags.DEFINE_string("scale", "medium", "Its scale.")
_ARM = flags.DEFINE_integer("arm", 0, "The first variant (index among the sweep's variants).")
_ARMS = flags.DEFINE_integer("arms", 1, "How many variants, from --arm on.")
_SEEDS = flags.DEFINE_integer("seeds", 0, "Seeds per variant (its first ones); 0: all.")
_STEPS = flags.DEFINE_integer("steps", 60, "Training steps per point (0: the config's own).")
_PARALLEL = flags.DEFINE_integer("parallel", 2, "Child processes of the separate mode.")
_OUT = flags.DEFINE_string("out", "bench_results", "Output directory.")

_MODULE = '''
from tfjax.research import sweep
_base = sweep.load_module({path!r})

def get_config(scale=None):
  config = _base.get_config(scale)
  steps = {steps} or config.train.num_steps
  config.train.update(num_steps=steps, eval_every=steps, checkpoint_every=steps,
                      log_every=max(steps // 3, 1), eval_at_start=False)
  return config

def get_sweep(scale=None):
  return {points!r}
'''


def _arm_points(path: str, scale: str, arm: int, arms: int, seeds: int) -> list[dict]:
  from tfjax.research import sweep, sweep_packed  # pylint: disable=import-outside-toplevel
  loaded = sweep.load_sweep(path, scale)
  variants = sweep_packed.groups(loaded.points, len(loaded.points))[arm:arm + arms]
  if len(variants) < arms:
    raise SystemExit(f"{path} has no {arms} variants from variant {arm} on")
  return [dict(p.overrides) for members in variants for p in members[:seeds or None]]


def _run(cmd: list[str], log: str) -> dict:
  """Wall seconds and peak RSS (MiB, largest process of the command's tree) of `cmd`."""
  start = time.time()
  with open(log, "w", encoding="utf-8") as out:
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
  if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit(f"{' '.join(cmd)} failed; see {log}")
  return {"seconds": round(time.time() - start, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024)}


def _steady_rate(root: str, names: list[str]) -> float:
  rates = []
  for name in names:
    with open(os.path.join(root, name, "metrics.jsonl"), encoding="utf-8") as f:
      rows = [json.loads(line) for line in f]
    rates += [r["train/tokens_per_sec"] for r in rows if "train/tokens_per_sec" in r][1:]
  return round(statistics.median(rates)) if rates else float("nan")


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  from tfjax.research import sweep, sweep_packed, sweep_results
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  path = os.path.abspath(_CONFIG.value)
  points = _arm_points(path, _SCALE.value, _ARM.value, _ARMS.value, _SEEDS.value)
  module = os.path.join(out, "bench_packed_sweep.py")
  with open(module, "w", encoding="utf-8") as f:
    f.write(_MODULE.format(path=path, steps=_STEPS.value, points=points))
  loaded = sweep.load_sweep(module, _SCALE.value)
  names = [p.name for p in loaded.points]
  group_size, plan = sweep_packed.auto_size(loaded, loaded.points)
  load_before = os.getloadavg()
  parallel = f"--parallel={_PARALLEL.value}"
  if _ARMS.value > 1 and _PARALLEL.value > 1:  # N groups at a time: each fits 1/N of the plan's
    group_size = max(1, min(group_size, plan["budget_bytes"] // _PARALLEL.value  # budget
                            // max(plan["per_seed_bytes"], 1)))
    modes = {"separate": [parallel], "packed": [f"--pack_seeds={group_size}", parallel]}
  else:
    modes = {"separate": [parallel], "packed": ["--pack_seeds=auto"]}
  result = {"config": _CONFIG.value, "scale": _SCALE.value, "points": names,
            "variants": _ARMS.value, "steps": loaded.base_config.train.num_steps,
            "device": sweep_results.device_name(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "command": " ".join(["python", *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "memory_plan": plan, "modes": {}}
  for mode, flags_ in modes.items():
    root = os.path.join(out, f"bench_packed_{mode}")
    if os.path.exists(root):
      raise SystemExit(f"{root} exists: remove it (or pass another --out) for a fresh run")
    cmd = [sys.executable, "experiments/sweep.py", f"--config={module}",
           f"--scale={_SCALE.value}", f"--workdir={root}", *flags_]
    measured = _run(cmd, os.path.join(out, f"bench_packed_{mode}.log"))
    measured["points_per_hour"] = round(len(names) * 3600 / measured["seconds"], 1)
    measured["steady_tokens_per_sec_per_seed"] = _steady_rate(root, names)
    result["modes"][mode] = measured
    print(mode, measured, flush=True)
  result["load_average_before_after"] = [list(load_before), list(os.getloadavg())]
  sep, pack = result["modes"]["separate"], result["modes"]["packed"]
  result["ratio_points_per_hour"] = round(pack["points_per_hour"] / sep["points_per_hour"], 2)
  with open(os.path.join(out, "bench_packed.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(out, "bench_packed.md"), "w", encoding="utf-8") as f:
    f.write(_markdown(result, group_size))
  print(_markdown(result, group_size))


def _markdown(result: dict, group_size: int) -> str:
  plan = result["memory_plan"]
  variants, points = result.get("variants", 1), len(result["points"])
  lines = [f"{result['config']} --scale={result['scale']}, {points} points "
           f"({variants} variant{'s' * (variants > 1)} x {points // variants} seeds), "
           f"{result['steps']} steps each, {result['device']}, {result['date']}; load "
           f"average before/after {result['load_average_before_after'][0][0]:.1f}/"
           f"{result['load_average_before_after'][1][0]:.1f} (a shared machine); jax "
           f"{result.get('jax', '?')}", "", f"`{result.get('command', '')}`", "",
           "| mode | wall s | points/hour | steady tokens/s per seed | peak RSS MiB |",
           "|---|---:|---:|---:|---:|"]
  for mode, m in result["modes"].items():
    lines.append(f"| {mode} | {m['seconds']} | {m['points_per_hour']} | "
                 f"{m['steady_tokens_per_sec_per_seed']} | {m['peak_rss_mib']} |")
  lines += ["", f"packed / separate points per hour: {result['ratio_points_per_hour']}x; "
            f"group size (the memory plan's, for --parallel groups at a time): {group_size} (plan "
            f"{plan['per_seed_bytes'] / 2**20:.1f} MiB per seed, {plan['group_bytes'] / 2**20:.1f}"
            f" MiB per group, budget {plan['budget_bytes'] / 2**30:.1f} GiB)", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main)
