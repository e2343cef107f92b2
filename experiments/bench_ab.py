"""Step time of two variants of one config, measured side by side in one process.

  python experiments/bench_ab.py --config=configs/shakespeare_char.py:cpu \
      --b=model.attention_impl=chunked [--a=KEY=VALUE,...] [--rounds=30] [--out=bench_results]

Why: on a shared machine the speed of the same program drifts over minutes by more than the few
percent a code change makes (docs/benchmarks/cpu_training.md), so two runs one after the other
cannot resolve it.
Here both variants are compiled in one process, then timed in alternation, one call
(train.steps_per_call steps) of A, one of B, `rounds` times; the median of the paired ratios B/A
cancels the drift.
Batches are made and copied inside the timed calls, as in training. Writes OUT/bench_ab.json
and OUT/bench_ab.md stamped with the device, JAX version and date.
"""

import ast
import datetime
import json
import os
import platform
import statistics
import sys
import time

from absl import flags

from tfjax.training.entry import cli

_CONFIG = cli.define_config_file("config", None, "Config file both variants start from.")
_A = flags.DEFINE_string("a", "", "Variant A: comma-separated KEY=VALUE overrides (may be empty).")
_B = flags.DEFINE_string("b", "", "Variant B: comma-separated KEY=VALUE overrides.")
_ROUNDS = flags.DEFINE_integer("rounds", 30, "Timed calls of each variant, alternated.")
_OUT = flags.DEFINE_string("out", "bench_results", "Output directory.")


def parse_overrides(spec: str) -> dict:
  """'a.b=1,c=x' -> {'a.b': 1, 'c': 'x'}: values parse as Python literals, else as text."""
  overrides = {}
  for item in filter(None, (s.strip() for s in spec.split(","))):
    key, sep, text = item.partition("=")
    if not sep:
      raise ValueError(f"override {item!r} is not KEY=VALUE")
    try:
      overrides[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      overrides[key] = text
  return overrides


def main(argv):
  del argv
  from tfjax.training.parallel import sharding
  from tfjax.research import sweep  # pylint: disable=import-outside-toplevel
  base = _CONFIG.value
  try:  # the sweep launcher's overrides: unknown keys and wrong types are named, with a fix
    variants = {name: sweep.apply_overrides(base, parse_overrides(spec))
                for name, spec in (("a", _A.value), ("b", _B.value))}
  except ValueError as e:
    cli.fail(str(e))
  if _ROUNDS.value < 1:
    cli.fail("--rounds must be at least 1")
  sharding.configure_cpu_devices(base)  # before JAX starts; both variants share the devices
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment

  runs = {}
  for name, config in variants.items():
    exp = experiment.prepare(config)
    placement = sharding.BatchPlacement.for_config(config)
    layout = experiment.state_layout(exp, placement)
    state = layout.init()
    iterator = datasets.DataIterator(exp.dataset, config.train.batch_size)
    runner = experiment.make_step_runner(exp, placement, layout, iterator)
    with placement.axis_rules():
      start = time.perf_counter()
      runner.program.lower(*runner.abstract_args).compile()  # its cache serves the calls
      compile_s = time.perf_counter() - start
      state, metrics = runner.run(state, config.train.steps_per_call)  # warm-up call
      jax.block_until_ready((state, metrics))
    runs[name] = dict(runner=runner, state=state, placement=placement, compile_s=compile_s,
                      steps=config.train.steps_per_call, step_ms=[])

  for _ in range(_ROUNDS.value):
    for run in runs.values():
      with run["placement"].axis_rules():
        start = time.perf_counter()
        run["state"], metrics = run["runner"].run(run["state"], run["steps"])
        jax.block_until_ready((run["state"], metrics))
        run["step_ms"].append((time.perf_counter() - start) / run["steps"] * 1e3)

  ratios = [b / a for a, b in zip(runs["a"]["step_ms"], runs["b"]["step_ms"])]
  quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
  result = {
      "config": flags.FLAGS["config"].config_filename, "a": _A.value, "b": _B.value,
      "rounds": _ROUNDS.value, "device": jax.devices()[0].device_kind,
      "num_devices": jax.device_count(), "jax": jax.__version__, "cpu_count": os.cpu_count(),
      "host": platform.processor() or platform.machine(),
      "date": datetime.datetime.now().isoformat(timespec="seconds"), "command": " ".join(sys.argv),
      "ratio_b_over_a_median": statistics.median(ratios),
      "ratio_b_over_a_quartiles": [quartiles[0], quartiles[2]],
  }
  for name, run in runs.items():
    result[f"{name}_compile_s"] = run["compile_s"]
    result[f"{name}_step_ms_median"] = statistics.median(run["step_ms"])
    result[f"{name}_step_ms"] = run["step_ms"]
  result["ratios"] = ratios
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_ab.json"), "w") as f:
    json.dump(result, f, indent=2)
  rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
          for k, v in result.items() if not isinstance(v, list)]
  with open(os.path.join(_OUT.value, "bench_ab.md"), "w") as f:
    f.write("| metric | value |\n| --- | --- |\n" + "\n".join(rows) + "\n")
  print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, indent=2))


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=import-outside-toplevel
  setup_logging()
  cli.run_absl(main)
