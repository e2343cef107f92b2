"""`tfjax-train` / `python experiments/train.py`: train any config with one command.

  python experiments/train.py --config=configs/NAME.py[:arg] --workdir=DIR [--config.key=value ...]

With no flags it trains the default config (tfjax/training/config/defaults.py, = configs/default.py)
into a fresh workdir under runs/. Running again with the same --workdir resumes from its latest
checkpoint.

--import=MODULE[,...] imports code outside tfjax first (an attention or position kind of one's own:
a module on PYTHONPATH or a .py file's path); config.json records it, so a resume, tfjax-generate
and sweep children import it again (tfjax/runtime/imports.py, docs/attention/README.md).

Exit status: 0 finished (last line `done: DIR eval/...`); 2 a user's mistake (one `error:` line,
nothing written); 4 diverged (a NaN/inf loss, tfjax/training/loop/divergence.py); 5 a checkpoint
could not be written (a full disk; tfjax/training/checkpointing/checkpoint.py); 128 + N stopped by
signal N (SIGTERM 143, SIGINT 130, SIGUSR1 138, SIGUSR2 140) after saving a checkpoint, last line
`stopped at step S by SIGTERM; resume with the same command`, or before the first step with
nothing written. A scheduler tells a preempted run from a finished one by that status.

Multi-process (multi-host) runs start the same command on every process. Under SLURM (`srun`) or
Open MPI (`mpirun`) nothing else is needed (jax.distributed auto-detects them); elsewhere give
--coordinator_address=HOST:PORT (process 0's host), --num_processes and --process_id, or the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment variables. See
docs/scaling/multihost.md.
"""

import datetime
import logging
import os
import sys

from absl import flags

from tfjax.training.config import defaults
from tfjax.training.entry import cli
from tfjax.runtime import stop_signals

# The default run ships inside the package (tfjax/training/config/defaults.py's get_config), so an
# installed `tfjax-train` works from any directory; configs/default.py is the same config.
DEFAULT_CONFIG = defaults.__file__

# --import=MODULE[,...] first (a kind defined outside tfjax), and a resumed run's recorded ones.
cli.define_import_flag(run_dir_flag="workdir")
_CONFIG = cli.define_config_file(
    "config", DEFAULT_CONFIG, "Config file, e.g. configs/shakespeare_char.py or ...py:cpu.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, TensorBoard). Default: a fresh "
    "runs/<config>-<time>.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "jax.distributed.initialize: auto = when the flags/environment below give settings or a "
    "SLURM/Open MPI launch with > 1 task is detected; on = always (auto-detect); off = never.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (default: $JAX_COORDINATOR_ADDRESS or "
    "auto-detected).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in the run (default: $JAX_NUM_PROCESSES or auto-detected).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index, 0..num_processes-1 (default: $JAX_PROCESS_ID or "
    "auto-detected).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", "", "Persistent XLA compilation cache: a rerun, a resume or another seed "
    "loads its programs instead of compiling them. Default $TFJAX_CACHE_DIR/xla or "
    "~/.cache/tfjax/xla; 'none' turns it off.")
_LOCAL_DEVICE_IDS = flags.DEFINE_list(
    "local_device_ids", None, "Accelerators this process uses, e.g. 0,1,2,3 (default: "
    "$JAX_LOCAL_DEVICE_IDS, or one per process as SLURM/Open MPI assign, or all).")


def fresh_workdir(config_path: str) -> str:
  """runs/<config name>-<time>; the package's default config is named 'default'."""
  path = config_path.split(":")[0]
  name = "default" if path == DEFAULT_CONFIG else os.path.splitext(os.path.basename(path))[0]
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{stamp}")


def main(argv):
  """User errors (ValueError naming a key, a missing file) end in one `error:` line, exit 2
  (tfjax.training.entry.cli); a run that diverges ends with exit 4 (divergence.Diverged); a signal
  ends it with 128 + the signal's number (module docstring)."""
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: every setting is a flag, e.g. "
             "--config.train.num_steps=100 (see --help)")
  from tfjax.runtime import compile_cache, distributed  # pylint: disable=g-import-not-at-top
  from tfjax.training.parallel import sharding
  # before anything touches a device
  sharding.configure_cpu_devices(_CONFIG.value)
  distributed.initialize(
      _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
      [int(i) for i in _LOCAL_DEVICE_IDS.value] if _LOCAL_DEVICE_IDS.value else None,
      mode=_DISTRIBUTED.value)
  compile_cache.enable(_COMPILATION_CACHE.value)
  # pylint: disable-next=g-import-not-at-top  (after flags: XLA_FLAGS etc.)
  from tfjax.runtime import workarounds
  from tfjax.training.loop import train
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1 and not _WORKDIR.value:  # each process would pick its own time stamp
    cli.fail("a multi-process run needs --workdir (on a filesystem all processes share)")
  if jax.process_index() != 0:  # one copy of the INFO lines; warnings still from every process
    logging.getLogger("tfjax").setLevel(logging.WARNING)
  workdir = _WORKDIR.value or fresh_workdir(flags.FLAGS["config"].config_filename)
  # after the imports, before tracing (see tfjax/runtime/workarounds.py)
  workarounds.freeze_startup_objects()
  final = train.train_and_evaluate(_CONFIG.value, workdir)
  if final.stopped is not None:  # a preempted run must not look like a finished one
    if jax.process_index() == 0:
      say_last_line(final.stopped.message)
    sys.exit(final.stopped.exit_status)
  summary = " ".join(f"{k}={v:.4g}" for k, v in sorted(final.items()) if k.startswith("eval/"))
  if jax.process_index() == 0:
    print(f"done: {workdir} {summary}")


def say_last_line(line: str) -> None:
  """Prints the run's last line on stdout; where stdout's reader is gone it goes to stderr.

  Ctrl-C on `python experiments/train.py | tee log` sends SIGINT to tee as well: tee exits at
  once, while the run saves its checkpoint and only then prints `stopped at step ...` into a pipe
  nobody reads (BrokenPipeError, the line lost). stderr still reaches the terminal unless it went
  through the same pipe (`2>&1 | tee`: use `tee -i`, which ignores the SIGINT, to keep the line)."""
  try:
    print(line, flush=True)
  except BrokenPipeError:
    # Nothing more can reach that stdout, and the interpreter's own flush at exit would fail
    # again (an "Exception ignored" message): point it at /dev/null.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print(line, file=sys.stderr, flush=True)


def run():
  """The `tfjax-train` console script.

  Until the training loop takes over the stop signals (checkpoint, then stop), SIGTERM / SIGINT
  end the start-up: one line, exit 128 + N, and a workdir this start created is removed
  (train.train_and_evaluate), so nothing is left behind (tfjax/runtime/stop_signals.py)."""
  with stop_signals.exits_on_stop():
    cli.run_absl(main)


if __name__ == "__main__":
  run()
