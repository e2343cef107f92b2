"""One training step of an ablation variant: K seeds packed into one vmapped program vs one seed.

  python experiments/bench_packed_step.py [--configs=norm,ffn,heads] [--seeds=4] [--calls=10] \
      [--out=bench_results]

For each sweep (configs/ablations/<name>.py at --scale) it builds the first point's experiment,
times `calls` jitted steps after one warm-up call, in this one process: the one-seed train step
(as train.py runs it) and tfjax.training.loop.packed's step of `seeds` stacked copies. It reports ms
per step, ms per seed-step (packed / K) and the model FLOP rate of the one-seed step
(tfjax.training.accounting.flops). Packing pays on a device only where the per-seed step leaves the
device idle (per-op overhead, a small grid); ms per seed-step equal to the one-seed step's means
no gain beyond start-up and compilation. Writes OUT/bench_packed_step.json and .md stamped with
the device, jax version, load average and date (a shared machine slows both modes).
"""

import datetime
import json
import os
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

_CONFIGS = flags.DEFINE_list("configs", ["norm", "ffn", "heads"], "Sweeps under configs/ablations.")
_SCALE = flags.DEFINE_string("scale", "medium", "Their scale.")
_SEEDS = flags.DEFINE_integer("seeds", 4, "Seeds packed into one program.")
_CALLS = flags.DEFINE_integer("calls", 10, "Timed calls (after one warm-up call).")
_OUT = flags.DEFINE_string("out", "bench_results", "Output directory.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timed(fn, args, calls):
  """Seconds per call of `fn(*args)` -> (state, ...), feeding each call the previous state."""
  out = fn(*args)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(calls):
    out = fn(out[0], *args[1:])
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def measure(name: str, scale: str, seeds: int, calls: int, workdir: str) -> dict:
  # pylint: disable=import-outside-toplevel
  from tfjax.data import datasets
  from tfjax.nn.models import build_model
  from tfjax.research import sweep
  from tfjax.training import tasks
  from tfjax.training.accounting import flops
  from tfjax.training.loop import experiment, packed, steps
  from tfjax.training.parallel.sharding import BatchPlacement
  loaded = sweep.load_sweep(os.path.join(REPO, "configs", "ablations", f"{name}.py"), scale)
  config = loaded.config_for(loaded.points[0])
  exp = experiment.prepare(config, workdir)
  layout = experiment.state_layout(exp, BatchPlacement.for_config(config))
  batch = datasets.DataIterator(exp.dataset, config.train.batch_size).next()
  model = build_model(exp.model_config.replace(deterministic=False))
  one = jax.jit(steps.make_train_step(model, exp.optimizer, exp.schedule, config.task,
                                      config.train.label_smoothing, 1), donate_argnums=(0,))
  single = _timed(one, (layout.init(), batch), calls)
  step = packed.make_packed_step(exp, stop_on_nonfinite=True)
  stacked = experiment.stack_batches([experiment.stack_batches([batch] * seeds, seeds)], 1)

  def packed_call(state, batches):
    new_state, _, out = step(state, jnp.ones(seeds, bool), batches, np.int32(1))
    return new_state, out
  group = _timed(packed_call, (packed.stack_seeds([layout.init() for _ in range(seeds)]),
                               stacked), calls)
  seq_len, _ = tasks.row_lengths(exp.dataset.train_batch(0, 1), config.task)
  step_flops = flops.flops_per_token(exp.model_config, seq_len) * config.train.batch_size * seq_len
  return {"config": name, "point": loaded.points[0].name, "seeds": seeds,
          "one_seed_ms": round(single * 1e3, 1), "packed_ms": round(group * 1e3, 1),
          "packed_ms_per_seed": round(group * 1e3 / seeds, 1),
          "per_seed_speedup": round(single * seeds / group, 2),
          "one_seed_gflops": round(step_flops / single / 1e9, 1)}


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  from tfjax.research import sweep_results
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  load_before = os.getloadavg()
  rows = [measure(name, _SCALE.value, _SEEDS.value, _CALLS.value, os.path.join(out, "wd"))
          for name in _CONFIGS.value]
  result = {"scale": _SCALE.value, "device": sweep_results.device_name(), "jax": jax.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average_before_after": [list(load_before), list(os.getloadavg())],
            "calls": _CALLS.value, "rows": rows}
  with open(os.path.join(out, "bench_packed_step.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  lines = [f"--scale={result['scale']}, {result['device']}, jax {result['jax']}, {result['date']}; "
           f"load average before/after {load_before[0]:.1f}/{os.getloadavg()[0]:.1f}; "
           f"{result['calls']} calls after a warm-up", "",
           "| config (first point) | one-seed step ms | one-seed GFLOP/s | K | packed step ms | "
           "packed ms per seed | per-seed speedup |", "|---|---:|---:|---:|---:|---:|---:|"]
  lines += [f"| {r['config']} (`{r['point']}`) | {r['one_seed_ms']} | {r['one_seed_gflops']} | "
            f"{r['seeds']} | {r['packed_ms']} | {r['packed_ms_per_seed']} | "
            f"{r['per_seed_speedup']}x |" for r in rows]
  with open(os.path.join(out, "bench_packed_step.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
