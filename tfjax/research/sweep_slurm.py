"""Sweep points as jobs through submitit: one SLURM job array, resumable, the same results files.

`launch(sweep, root, points, launcher=...)` submits every unfinished point as a job:

  slurm           one SLURM job array (submitit's SlurmExecutor.submit_array), resources from
                  `Resources` (the sweep config's SLURM dict, overridden by --slurm.* flags);
  submitit_local  submitit's LocalExecutor: the same submission, pickling, signal and requeue
                  machinery, each job a local process (`parallel` at a time). What the tests use.

Each job runs `PointJob`, which calls sweep.run_point with the point's config, exactly as
--launcher=local does in its own process: a point's metrics do not depend on the launcher.

Preemption and time limits. SLURM sends SIGUSR2 `signal_delay_s` before the time limit (submitit
asks for it with --signal), SIGUSR1 where a site or --slurm.sbatch=signal=USR1@T asks for that, and
SIGTERM when it preempts or cancels a job. Inside the training loop each of these sets the loop's
stop flag (tfjax.training.loop.train.STOP_SIGNALS): it checkpoints at the next step boundary and
returns. After SIGUSR1 / SIGUSR2 PointJob hands the job to submitit's checkpoint-and-requeue handler
(the one submitit installs for SIGUSR2), which pickles `PointJob.checkpoint()` (the same point: its
state is the checkpoint on disk) and requeues the job (`scontrol requeue`; the local executor
restarts it); the requeued job resumes from the checkpoint. A SIGUSR1 / SIGUSR2 outside the loop
(startup, evaluation) goes to that handler at once: the job restarts from the newest checkpoint.
After SIGTERM (or SIGINT) the job only checkpoints and ends: `scancel` must stop it, and SLURM
requeues a job it preempts by itself where the cluster is configured so (PreemptMode=REQUEUE). After
`max_requeues` time-outs submitit stops requeueing. A point stopped without a requeue resumes
from its checkpoint when the sweep runs again.

Multi-host points (nodes > 1 or tasks_per_node > 1): SLURM starts one task per process, each runs
PointJob, and jax.distributed is initialized from SLURM's environment
(tfjax/training/distributed.py) before anything touches a device. Only task 0 requeues.

Files. ROOT/.submitit/ holds submitit's pickles, sbatch scripts and the job logs
(<job id>_<task>_log.out / .err); ROOT/<name>/SWEEP_JOB.json names the point's job and logs.
A job that fails writes SWEEP_FAILED.json (sweep.run_point); one that died before it could (killed,
out of memory, a broken environment) gets it from the launcher, with submitit's error and the log.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
import signal
import subprocess
import time
from typing import Any, Mapping, Optional, Sequence

from tfjax.research import sweep as sweep_lib
from tfjax.runtime import imports

_log = logging.getLogger(__name__)

LAUNCHERS = ("local", "slurm", "submitit_local")
SUBMITIT_DIR = ".submitit"


# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Resources:
  """What each point's job asks SLURM for (one job array: every point gets the same)."""
  partition: Optional[str] = None
  nodes: int = 1
  gpus_per_node: int = 0
  tasks_per_node: Optional[int] = None  # default: one process per GPU, at least one
  cpus_per_task: Optional[int] = None
  mem_gb: Optional[float] = None
  time: str = "4:00:00"                 # minutes, H:MM:SS or D-H:MM:SS, as sbatch --time takes
  array_parallelism: int = 256          # array tasks running at once
  signal_delay_s: int = 120             # SIGUSR2 this long before the time limit
  max_requeues: int = 3                 # time-outs requeued before the job gives up
  job_name: str = "tfjax-sweep"
  sbatch: dict = dataclasses.field(default_factory=dict)   # more sbatch options: account, qos, ...
  setup: tuple = ()                     # shell lines run before the job (module load, venv, ...)

  HELP = {  # the --slurm.* flags (experiments/sweep.py)
      "partition": "SLURM partition of every point's job.",
      "nodes": "Nodes per point (> 1: multi-host training in the job via jax.distributed).",
      "gpus_per_node": "GPUs per node.",
      "tasks_per_node": "Processes per node (default: one per GPU, at least one).",
      "cpus_per_task": "CPUs per process.",
      "mem_gb": "Memory per node in GB.",
      "time": "Time limit per job: minutes, H:MM:SS or D-H:MM:SS. Jobs checkpoint shortly before "
              "it and are requeued.",
      "array_parallelism": "Array tasks (points) running at once.",
      "signal_delay_s": "Seconds before the time limit when SLURM signals the job to checkpoint.",
      "max_requeues": "Time-outs after which a point's job is not requeued any more.",
      "job_name": "SLURM job name.",
  }

  @property
  def minutes(self) -> int:
    return time_minutes(self.time)

  @property
  def processes_per_node(self) -> int:
    return self.tasks_per_node or max(1, self.gpus_per_node)

  @classmethod
  def from_sources(cls, config: Mapping[str, Any], flags: Mapping[str, Any]) -> "Resources":
    """The sweep config's SLURM dict, then the flags that were given (None = not given).
    Unknown keys and values of the wrong type are ValueErrors naming the key."""
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for source, items in (("the sweep config's SLURM", config), ("--slurm", flags)):
      for key, value in items.items():
        if key not in known:
          close = difflib.get_close_matches(key, known, n=1)
          raise ValueError(f"{source}: unknown key {key!r}"
                           + (f"; did you mean {close[0]!r}?" if close else "")
                           + f" (keys: {', '.join(known)})")
        if value is None or (key in ("sbatch", "setup") and not value):
          continue
        values[key] = _coerce(cls, key, value, source)
    resources = cls(**values)
    resources.minutes  # pylint: disable=pointless-statement  (checks the time format now)
    for key in ("nodes", "array_parallelism", "max_requeues", "gpus_per_node"):
      if getattr(resources, key) < (0 if key in ("gpus_per_node", "max_requeues") else 1):
        raise ValueError(f"slurm.{key}={getattr(resources, key)} is out of range")
    return resources


def _coerce(cls, key: str, value, source: str):
  if key == "sbatch":
    return parse_sbatch(value)
  if key == "setup":
    return (value,) if isinstance(value, str) else tuple(value)
  kind = {f.name: f.type for f in dataclasses.fields(cls)}[key]
  target = int if "int" in str(kind) else float if "float" in str(kind) else str
  try:
    if target is int and isinstance(value, float) and not value.is_integer():
      raise ValueError
    return target(value)
  except (TypeError, ValueError):
    raise ValueError(f"{source}: {key}={value!r} is not a valid {target.__name__}") from None


def parse_sbatch(value) -> dict:
  """Extra sbatch options: a dict, or 'KEY=VALUE' strings ('--' and a bare flag allowed):
  ['account=proj', '--qos=high', 'exclusive'] -> {'account': 'proj', 'qos': 'high',
  'exclusive': True}."""
  if isinstance(value, Mapping):
    return {str(k).lstrip("-"): v for k, v in value.items()}
  out = {}
  for item in [value] if isinstance(value, str) else value:
    key, eq, val = str(item).lstrip("-").partition("=")
    if not key:
      raise ValueError(f"--slurm.sbatch={item!r}: give KEY=VALUE, e.g. account=myproject")
    out[key] = val if eq else True
  return out


_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_minutes(value) -> int:
  """Minutes (rounded up) of a SLURM time: 90, '90', '1:30:00', '2-00:00:00', '2-12'."""
  text = str(value).strip()
  match = _TIME.match(text)
  if not match:
    raise ValueError(f"slurm time {value!r} is invalid: give minutes, H:MM:SS or D-H:MM:SS")
  days, first, second, third = match.groups()
  if days is not None:  # D-H, D-H:M, D-H:M:S
    hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    total = int(days) * 1440 + hours * 60 + minutes + seconds / 60
  elif third is not None:  # H:M:S
    total = int(first) * 60 + int(second) + int(third) / 60
  elif second is not None:  # M:S
    total = int(first) + int(second) / 60
  else:
    total = int(first)
  if total <= 0:
    raise ValueError(f"slurm time {value!r} must be positive")
  return math.ceil(total)


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------
class PointJob:
  """One point's job: `run_point` inside a submitit job, requeued when a signal stops training.

  Picklable by value (paths and names only); `checkpoint` is what submitit pickles for the
  requeued job (submitit's Checkpointable protocol)."""

  def __init__(self, config_path: str, scale: Optional[str], root: str, name: str,
               compilation_cache: Optional[str] = None,
               import_modules: Optional[Sequence[str]] = None):
    self.config_path = os.path.abspath(config_path)
    self.scale, self.root, self.name = scale, os.path.abspath(root), name
    self.compilation_cache = os.path.abspath(compilation_cache) if compilation_cache else None
    # the submitting process's --import modules (a kind the points use), imported in the job
    self.import_modules = tuple(imports.loaded() if import_modules is None else import_modules)

  def __call__(self) -> str:
    # pylint: disable=import-outside-toplevel  (jax only inside the job)
    from tfjax.runtime import compile_cache, distributed
    from tfjax.training.loop import metrics
    metrics.setup_logging()
    distributed.initialize()  # multi-task SLURM jobs: coordinator etc. from SLURM's environment
    imports.load(getattr(self, "import_modules", ()))  # (a job pickled before the attribute)
    sweep = sweep_lib.load_sweep(self.config_path, self.scale)
    if self.compilation_cache:
      compile_cache.enable(self.compilation_cache)
    previous = {signal.SIGUSR1: signal.signal(signal.SIGUSR1, _requeue_handler)}
    try:
      status = sweep_lib.run_point(sweep, sweep.point(self.name), self.root)
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
    if status == "interrupted":
      from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
      stopped_by = train.stop_signal()
      if stopped_by in (signal.SIGTERM, signal.SIGINT):  # scancel, preemption, Ctrl-C: not ours
        _log.warning("point %s checkpointed after %s; the job ends (a preempted job is requeued "
                     "by SLURM, a cancelled one resumes when the sweep runs again)", self.name,
                     signal.Signals(stopped_by).name)
        _mark_job(os.path.join(self.root, self.name),
                  stopped=f"{train.stop_message()} (cancelled or preempted)")
        return status
      _log.warning("point %s checkpointed after a signal; handing the job to submitit to requeue",
                   self.name)
      try:
        _requeue_handler(stopped_by or _submitit_signal(), None)  # exits when it requeues
      except Exception as e:  # no requeue (cancelled, timed out too often): resumable by hand
        _mark_job(os.path.join(self.root, self.name), stopped=f"{type(e).__name__}: {e}")
        raise
    return status

  def checkpoint(self, *args, **kwargs):
    """The job to requeue: the same point (its progress is the checkpoint in its workdir)."""
    del args, kwargs
    import submitit  # pylint: disable=import-outside-toplevel
    return submitit.helpers.DelayedSubmission(
        PointJob(self.config_path, self.scale, self.root, self.name, self.compilation_cache,
                 getattr(self, "import_modules", ())))


def _submitit_signal() -> int:
  from submitit import JobEnvironment  # pylint: disable=import-outside-toplevel
  return getattr(signal, "SIG" + JobEnvironment.USR_SIG)  # USR2 unless SUBMITIT_PREEMPT_SIGNAL


def _requeue_handler(signum, frame):
  """Hands a stop signal to submitit's checkpoint-and-requeue handler (installed by submitit for
  its own signal when the job started)."""
  handler = signal.getsignal(_submitit_signal())
  if not callable(handler) or handler is _requeue_handler:
    raise RuntimeError(f"signal {signum} outside a submitit job: nothing can requeue this point")
  handler(signum, frame)


def _mark_job(workdir: str, **fields) -> None:
  path = os.path.join(workdir, sweep_lib.JOB_FILE)
  if os.path.exists(path):
    sweep_lib.write_json(path, {**sweep_lib.read_json(path), **fields})


# ---------------------------------------------------------------------------------------------
# Submitting and waiting
# ---------------------------------------------------------------------------------------------
def make_executor(launcher: str, folder: str, resources: Resources):
  """A submitit executor for `launcher` ('slurm' | 'submitit_local') with the resources set."""
  try:
    import submitit  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError(f"--launcher={launcher} needs submitit: pip install 'tfjax[cluster]' "
                     "(or pip install submitit)") from None
  if launcher == "submitit_local":
    if resources.nodes > 1 or resources.processes_per_node > 1:
      raise ValueError("--launcher=submitit_local runs one process per point; multi-process "
                       f"points (nodes={resources.nodes}, tasks_per_node="
                       f"{resources.processes_per_node}) need --launcher=slurm")
    executor = submitit.LocalExecutor(folder, max_num_timeout=resources.max_requeues)
    executor.update_parameters(timeout_min=resources.minutes,
                               signal_delay_s=resources.signal_delay_s,
                               gpus_per_node=resources.gpus_per_node,
                               setup=list(resources.setup))
    return executor
  if launcher != "slurm":
    raise ValueError(f"launcher {launcher!r} does not submit jobs; choose slurm or submitit_local")
  try:
    executor = submitit.SlurmExecutor(folder, max_num_timeout=resources.max_requeues)
  except RuntimeError as e:  # no srun on PATH
    raise ValueError(f"--launcher=slurm: {e} (run this on a SLURM login node; "
                     "--launcher=submitit_local runs the same jobs as local processes)") from None
  params = dict(job_name=resources.job_name, nodes=resources.nodes,
                ntasks_per_node=resources.processes_per_node, time=resources.minutes,
                array_parallelism=resources.array_parallelism,
                signal_delay_s=resources.signal_delay_s, setup=list(resources.setup) or None,
                additional_parameters=dict(resources.sbatch) or None)
  if resources.partition:
    params["partition"] = resources.partition
  if resources.gpus_per_node:
    params["gpus_per_node"] = resources.gpus_per_node
  if resources.cpus_per_task:
    params["cpus_per_task"] = resources.cpus_per_task
  if resources.mem_gb:
    params["mem"] = f"{int(resources.mem_gb * 1024)}MB"
  executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
  return executor


def launch(sweep: sweep_lib.Sweep, root: str, points: Sequence[sweep_lib.Point], *,
           launcher: str, resources: Optional[Resources] = None,
           compilation_cache: Optional[str] = None, parallel: int = 1, wait: bool = True,
           poll_s: float = 2.0) -> dict[str, str]:
  """Submits the unfinished `points` as jobs; returns {name: status} like sweep.run_sweep
  ('skipped' | 'done' | 'failed' | 'interrupted', or 'submitted' when not waiting).

  slurm submits all of them as one job array (SLURM runs array_parallelism at once);
  submitit_local keeps `parallel` local jobs running."""
  resources = resources or Resources.from_sources(sweep.slurm, {})
  root = os.path.abspath(root)
  executor = make_executor(launcher, os.path.join(root, SUBMITIT_DIR), resources)
  sweep_lib.write_sweep_file(sweep, root)
  statuses = {p.name: "skipped" for p in points if sweep_lib.is_done(os.path.join(root, p.name))}
  queue = sweep_lib.seeds_last([p for p in points if p.name not in statuses])
  limit = len(queue) if launcher == "slurm" or not wait else max(1, parallel)
  running: dict[str, Any] = {}
  gone = _GoneFromQueue()
  while queue or running:
    if queue and len(running) < limit:
      batch, queue = queue[:limit - len(running)], queue[limit - len(running):]
      jobs = executor.submit_array([PointJob(sweep.config_path, sweep.scale, root, p.name,
                                             compilation_cache) for p in batch])
      for point, job in zip(batch, jobs):
        _record_job(root, point.name, job, launcher)
        running[point.name] = job
      _log.info("submitted %d point(s) as %s job(s) %s (%d waiting)", len(batch), launcher,
                ", ".join(j.job_id for j in jobs), len(queue))
    if not wait:
      statuses.update({name: "submitted" for name in running})
      return statuses
    try:
      time.sleep(poll_s)
    except KeyboardInterrupt:
      if launcher == "slurm":
        _log.warning("stopped waiting; %d job(s) go on in SLURM (scancel %s stops them): "
                     "--status --workdir=%s follows them", len(running),
                     " ".join(sorted({j.job_id.split("_")[0] for j in running.values()})), root)
      raise
    for name, job in list(running.items()):
      if job.done() or (launcher == "slurm" and gone.seen(job.job_id)):
        statuses[name] = _finished(root, name, job)
        del running[name]
  return statuses


class _GoneFromQueue:
  """Jobs that left SLURM's queue without a result (killed: out of memory, node failure, scancel
  --signal=KILL). submitit learns a job's end from its result file or from `sacct`; where sacct has
  no accounting database, squeue is what still knows. A job counts as gone after `polls`
  consecutive polls that find it absent or in a final state."""

  FINAL = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
           "OUT_OF_MEMORY", "TIMEOUT"}

  def __init__(self, polls: int = 3):
    self.polls, self.count = polls, {}

  def seen(self, job_id: str) -> bool:
    try:
      out = subprocess.run(["squeue", "-h", "-o", "%T", "-j", job_id], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
      return False
    states = set(out.stdout.split())
    absent = (out.returncode == 0 and not states) or "Invalid job id" in out.stderr
    if absent or (states and states <= self.FINAL):
      self.count[job_id] = self.count.get(job_id, 0) + 1
    else:
      self.count[job_id] = 0
    return self.count[job_id] >= self.polls


def _record_job(root: str, name: str, job, launcher: str) -> None:
  workdir = os.path.join(root, name)
  os.makedirs(workdir, exist_ok=True)
  sweep_lib.write_json(os.path.join(workdir, sweep_lib.JOB_FILE), {
      "launcher": launcher, "job_id": job.job_id, "stdout": str(job.paths.stdout),
      "stderr": str(job.paths.stderr), "submitted": time.strftime("%Y-%m-%d %H:%M:%S")})


def _finished(root: str, name: str, job) -> str:
  """A finished job's point status; writes SWEEP_FAILED.json for a job that died without it."""
  workdir = os.path.join(root, name)
  if sweep_lib.is_done(workdir):
    _log.info("done %s (job %s)", name, job.job_id)
    return "done"
  failed = os.path.join(workdir, sweep_lib.FAILED_FILE)
  if job.paths.result_pickle.exists() or not isinstance(job, _slurm_job_class()):
    error = job.exception()
    if error is None:  # the job returned without finishing the point (no requeue possible)
      return "interrupted"
    message, details = job_error(error), str(error)
  else:  # left SLURM's queue without a result file (job.exception() would wait forever)
    message = (f"job {job.job_id} ended without a result (killed: out of memory, node failure or "
               "scancel?); see its log")
    details = message
    running = os.path.join(workdir, sweep_lib.RUNNING_FILE)
    if os.path.exists(running):  # its process is gone: the attempt is over
      os.remove(running)
  if not os.path.exists(failed):
    sweep_lib.write_json(failed, {"error": message, "job": job.job_id,
                                  "log": str(job.paths.stderr), "details": details})
  _log.error("point %s failed (job %s): %s; log: %s", name, job.job_id,
             sweep_lib.read_json(failed).get("error"), job.paths.stderr)
  return "failed"


def _slurm_job_class():
  from submitit.slurm.slurm import SlurmJob  # pylint: disable=import-outside-toplevel
  return SlurmJob


def job_error(error: Exception) -> str:
  """The line that says what went wrong: the last line of the job's traceback (submitit wraps it
  in a FailedJobError between dashed lines), else the error's first line."""
  text = str(error)
  parts = re.split(r"^-{10,}$", text, flags=re.M)
  trace = parts[1] if len(parts) >= 3 else ""
  lines = [line for line in trace.strip().splitlines() if line.strip()]
  if lines:
    return lines[-1].strip()
  first = text.strip().splitlines()
  return f"{type(error).__name__}: {first[0] if first else ''}"
