"""Compile a config's step for hardware that is not attached, and say whether it fits. Any
registered task (tfjax/training/tasks/: the text tasks, vit, clip, whisper, funnel,
funnel_classification) compiles through its task plugin; --what=decode is the text decoders'.

  python -m tfjax.aot --config=configs/NAME.py[:ARG] --target=TARGET [--what=train|eval|decode]
      [--config.key=value ...]          (also the console script tfjax-aot)

Prints a table (memory per device against HBM, compiler vs analytic FLOPs, collectives against
the layout's minimum, a roofline step time and its MFU bound), then one JSON line. Exit status 0:
fits; 1: does not fit (the line before the JSON names the largest buffers and the switch that
helps); 2: a user error (unknown target, a mesh that does not divide its devices, ...).
--import=MODULE[,...] imports code outside tfjax first (a kind the config uses).
Needs `pip install -e ".[tpu-aot]"` (from the clone) for TPU targets, `".[cuda-aot]"` for GPU ones.
"""

import os
import sys

# Compile-only: JAX must never try to open a TPU or a GPU, whatever is installed.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu lets one process per host load it unless told otherwise: several compiles may run at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# pylint: disable=wrong-import-position
import time

from absl import flags

from tfjax.training.entry import cli

_CONFIG = cli.define_config_file("config", None, "Config file, e.g. configs/NAME.py[:ARG] "
                                 "(required).")
_TARGET = flags.DEFINE_string("target", None, "What to compile for: v4-N, v5p-N (TensorCores), "
                              "v5e-N, v6e-N (chips), h100, h100xN, h200xN, a100xN (required).")
_WHAT = flags.DEFINE_enum("what", "train", ["train", "eval", "decode"],
                          "The step to compile: train, eval, or one KV-cache decode step.")

DOES_NOT_FIT = 1


def main(argv) -> int:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every setting is a flag (see --help)")
  if _CONFIG is None or _CONFIG.value is None:
    cli.fail("--config is required, e.g. --config=configs/gpt2_small.py")
  if not _TARGET.value:
    cli.fail("--target is required, e.g. --target=v5e-8 or --target=h100x8")
  # pylint: disable=import-outside-toplevel
  import jax
  from tfjax.aot import devices, program as programs, report as reports, targets
  target = targets.parse_target(_TARGET.value)
  target_devices = devices.compile_only_devices(target)
  start = time.perf_counter()
  program = programs.build(_CONFIG.value, target_devices, _WHAT.value)
  try:
    compiled, kernels = programs.compile_with_kernels(program, target.platform, target.generation)
  except Exception as e:  # pylint: disable=broad-except
    if not reports.is_out_of_memory(e):
      raise
    verdict, line = reports.out_of_memory(program, target, e)
    print(verdict)
    print(line, flush=True)
    return DOES_NOT_FIT
  seconds = time.perf_counter() - start
  measured = reports.measure(compiled, target.platform, target.devices)
  report = reports.build_report(program, measured, target)
  mesh = ", ".join(f"{k}={v}" for k, v in program.placement.mesh.shape.items())
  header = (f"{flags.FLAGS['config'].config_filename} {_WHAT.value} step on {target.name}: "
            f"{target.devices} x {target_devices[0].device_kind} ({target.topology}), mesh "
            f"{mesh}; compiled in {seconds:.0f} s with jax {jax.__version__}")
  print(reports.table(report, program, header, kernels))
  print(report.json_line(), flush=True)
  return 0 if report.fits else DOES_NOT_FIT


def run() -> None:
  """Console script `tfjax-aot`."""
  def absl_main(argv):
    sys.exit(main(argv))
  cli.run_absl(absl_main, argv=sys.argv)


if __name__ == "__main__":
  run()
