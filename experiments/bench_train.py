"""Training throughput: compile time, steady-state step time, tokens/s, FLOPs per token and MFU.

  python experiments/bench_train.py --config=configs/shakespeare_char.py:cpu --out=bench_results
  python experiments/bench_train.py --config=configs/shakespeare_char.py:cpu --full_run
      # also times the whole recipe (all steps, evals included) through train_and_evaluate
  ... --compilation_cache=DIR  # twice: the second run loads its programs, as a rerun of
      # experiments/train.py does (its cache is on by default; here it is off by default)

Writes OUT/bench_train.json and OUT/bench_train.md stamped with device, JAX version and date.
MFU = tokens/s x FLOPs/token / (peak FLOP/s x devices); the peak comes from --peak_flops or the
table in tfjax/training/accounting/params.py (none for CPUs: MFU is then omitted).
"""

import datetime
import json
import os
import platform
import sys
import tempfile
import time

from absl import flags

from tfjax.training.entry import cli

_CONFIG = cli.define_config_file("config", None, "Config file to benchmark.")
_STEPS = flags.DEFINE_integer("steps", 50, "Timed steps after warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 5, "Untimed steps after compilation.")
_PEAK = flags.DEFINE_float("peak_flops", 0.0, "Per-device peak FLOP/s (0: look up the device).")
_FULL_RUN = flags.DEFINE_bool("full_run", False, "Also time the whole run (train_and_evaluate).")
_OUT = flags.DEFINE_string("out", "bench_results", "Output directory.")
_PROFILE = flags.DEFINE_integer(
    "profile_steps", 0, "After timing, trace this many steps with jax.profiler and add the device "
    "time per kernel category (tfjax/aot/kernel_profile.py) to the JSON; also writes the trace "
    "(OUT/trace) and the compiled step's optimized HLO (OUT/step_hlo.txt.gz).")
_CACHE = flags.DEFINE_string(
    "compilation_cache", "none", "Persistent XLA compilation cache directory ('' = the default "
    "one train.py uses). Default none: compile times are a first run's.")


def measure_steps(config, steps: int, warmup: int, profile_steps: int = 0, out: str = "") -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from tfjax.data import datasets
  from tfjax.training import tasks
  from tfjax.training.accounting import flops, params as accounting
  from tfjax.training.loop import experiment
  from tfjax.training.parallel import sharding
  from tfjax.runtime import workarounds

  exp = experiment.prepare(config)
  placement = sharding.BatchPlacement.for_config(config)
  layout = experiment.state_layout(exp, placement)
  state = layout.init()
  # Steps run as in the training loop (experiment.make_step_runner): one step per call, or
  # train.steps_per_call steps per call on stacked batches (then `steps` rounds up to whole
  # calls); batches are made and copied inside the timed loop.
  per_call = config.train.steps_per_call
  calls, warmup_calls = -(-steps // per_call), -(-warmup // per_call)
  iterator = datasets.DataIterator(exp.dataset, config.train.batch_size)
  runner = experiment.make_step_runner(exp, placement, layout, iterator)
  with placement.axis_rules():
    start = time.perf_counter()
    compiled = runner.program.lower(*runner.abstract_args).compile()  # serves the calls below
    compile_s = time.perf_counter() - start
    memory = compiled_memory(compiled)
    host_lead = workarounds.HostLeadLimiter()  # several CPU devices deadlock if the host runs ahead
    for _ in range(1 + warmup_calls):
      state, metrics = runner.run(state, per_call)
      host_lead.wait_if_ahead(metrics)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(calls):
      state, metrics = runner.run(state, per_call)
      host_lead.wait_if_ahead(metrics)
    jax.block_until_ready((state, metrics))
    step_s = (time.perf_counter() - start) / (calls * per_call)
    profile = trace_steps(runner, state, host_lead, -(-profile_steps // per_call), per_call,
                          compiled, out) if profile_steps else None
  seq_len, _ = tasks.row_lengths(exp.dataset.train_batch(0, 1), config.task)
  tokens_per_s = config.train.batch_size * seq_len / step_s
  flops_per_token = flops.flops_per_token(exp.model_config, seq_len)
  peak = flops.peak_flops(_PEAK.value)
  return {
      "params": accounting.analytic_count(exp.model_config),
      "batch_size": config.train.batch_size, "seq_len": int(seq_len),
      "steps_per_call": per_call, "timed_steps": calls * per_call,
      "compile_s": compile_s, "step_ms": step_s * 1e3, "tokens_per_s": tokens_per_s,
      "flops_per_token": flops_per_token,
      "mfu": tokens_per_s * flops_per_token / (peak * jax.device_count()) if peak else None,
      "peak_flops_per_device": peak or None,
      **memory, "device_peak_bytes": device_peak_bytes(),
      **({"profile": profile} if profile else {}),
  }


def trace_steps(runner, state, host_lead, calls: int, per_call: int, compiled, out: str) -> dict:
  """`calls` more calls under jax.profiler.trace: device time per kernel category, the kernels
  launched and the device's idle time per step (what a roofline estimate leaves out)."""
  import gzip  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.aot import kernel_profile  # pylint: disable=import-outside-toplevel
  trace_dir = os.path.join(out, "trace")
  with jax.profiler.trace(trace_dir):
    for _ in range(calls):
      state, metrics = runner.run(state, per_call)
      host_lead.wait_if_ahead(metrics)
    jax.block_until_ready((state, metrics))
  xspace = kernel_profile.load_xspace(trace_dir)
  busy, span = kernel_profile.busy_span_ns(xspace)
  with gzip.open(os.path.join(out, "step_hlo.txt.gz"), "wt") as f:
    f.write(compiled.as_text())
  return kernel_profile.summarize(kernel_profile.kernel_rows(xspace), calls * per_call, busy, span)


def compiled_memory(compiled) -> dict:
  """XLA's memory analysis of the compiled step (per device): what the ahead-of-time estimate
  predicts, to compare with the device's own peak."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  fields = ("argument", "output", "temp", "alias", "generated_code")
  memory = {f"{f}_bytes": int(getattr(analysis, f"{f}_size_in_bytes", 0)) for f in fields}
  memory["compiled_total_bytes"] = (memory["argument_bytes"] + memory["output_bytes"]
                                    + memory["temp_bytes"] - memory["alias_bytes"])
  return memory


def device_peak_bytes():
  """The first device's peak bytes in use so far (None where the backend does not report it)."""
  import jax  # pylint: disable=import-outside-toplevel
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def measure_full_run(config) -> dict:
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    final = train.train_and_evaluate(config, workdir)
    wall = time.perf_counter() - start
  return {"full_run_s": wall, "num_steps": config.train.num_steps,
          "final_eval_loss": final.get("eval/loss")}


def main(argv):
  del argv
  from tfjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding
  config = _CONFIG.value
  sharding.configure_cpu_devices(config)  # before JAX starts, as experiments/train.py does
  compile_cache.enable(_CACHE.value)
  import jax  # pylint: disable=import-outside-toplevel
  result = {
      "config": flags.FLAGS["config"].config_filename,
      "device": jax.devices()[0].device_kind, "num_devices": jax.device_count(),
      "backend": jax.default_backend(), "jax": jax.__version__, "cpu_count": os.cpu_count(),
      "host": platform.processor() or platform.machine(),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": " ".join(sys.argv), "compilation_cache": _CACHE.value,
  }
  os.makedirs(_OUT.value, exist_ok=True)
  result.update(measure_steps(config, _STEPS.value, _WARMUP.value, _PROFILE.value, _OUT.value))
  if _FULL_RUN.value:
    result.update(measure_full_run(config))
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "bench_train.json"), "w") as f:
    json.dump(result, f, indent=2)
  rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
          for k, v in result.items() if k != "profile"]
  with open(os.path.join(_OUT.value, "bench_train.md"), "w") as f:
    f.write("| metric | value |\n| --- | --- |\n" + "\n".join(rows) + "\n")
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=import-outside-toplevel
  setup_logging()
  cli.run_absl(main)
