"""What verifying a checkpoint costs: restore time with and without the manifest check.

  python experiments/bench_checkpoint.py --out=bench_results/checkpoint          # GPT-2 small
  python experiments/bench_checkpoint.py --config=configs/default.py --out=/tmp/b  # small, quick

Builds the train state of --config (params and AdamW moments, random values: only the bytes
matter), saves it with tfjax.training.checkpointing.checkpoint.Checkpointer (which seals it with its
manifest), then times, --repeats times each and alternating: the restore the training loop does
(`restore_latest`: verify every file's size and CRC-32, then read), the bare orbax read of the
same step (no verification), and the verification alone. The files are in the page cache (they
were just written): the verification's share is largest there, a cold read pays the disk for the
orbax read too. Writes bench_checkpoint.json and bench_checkpoint.md.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from tfjax.training.checkpointing import checkpoint, checkpoint_manifest
from tfjax.training.entry import cli
from tfjax.training.loop import experiment
from tfjax.training.parallel import sharding
from tfjax.training.accounting import params as param_accounting
from tfjax.training.optim.optimizer import make_optimizer
from tfjax.training.loop.steps import TrainState


def parse_args(argv):
  parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/gpt2_small.py", help="config file (its model "
                      "and optimizer give the state's shapes)")
  parser.add_argument("--out", default="bench_results/checkpoint", help="directory for json + md")
  parser.add_argument("--dir", default=None, help="where the checkpoint is written (default: a "
                      "temporary directory, removed after)")
  parser.add_argument("--repeats", type=int, default=3)
  return parser.parse_args(argv)


def load_config(path: str):
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  return config_flags.config_flags._LoadConfigModule("bench", path).get_config()  # pylint: disable=protected-access


def random_state(config):
  """A TrainState of the config's shapes with random float values, on one device."""
  model_cfg = experiment.model_config(config)
  shapes = param_accounting.param_shapes(model_cfg)
  rng = np.random.default_rng(0)
  fill = lambda s: rng.standard_normal(s.shape, dtype=np.float32).astype(s.dtype)  # noqa: E731
  params = jax.tree.map(fill, shapes)
  optimizer, _ = make_optimizer(config.optimizer, config.train.num_steps, model_cfg.d_model)
  opt_state = jax.tree.map(lambda s: fill(s) if s.shape else np.zeros(s.shape, s.dtype),
                           jax.eval_shape(optimizer.init, params))
  device = sharding.replicated(sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}))
  state = TrainState(step=np.int32(1), params=params, opt_state=opt_state,
                     rng=np.asarray(jax.random.PRNGKey(0)))
  return jax.device_put(state, device), model_cfg


def timed(fn):
  """Seconds `fn()` takes, its arrays ready on the device."""
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready([x for x in jax.tree.leaves(dict(out) if hasattr(out, "keys") else out)
                         if isinstance(x, jax.Array)])
  return time.perf_counter() - start


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  config = load_config(args.config)
  state, model_cfg = random_state(config)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  workdir = args.dir or tempfile.mkdtemp(prefix="bench_checkpoint_")
  try:
    ckpt = checkpoint.Checkpointer(workdir, keep=1)
    save_s = timed(lambda: (ckpt.save(1, state, {"position": 1}, {}),
                            ckpt._manager.wait_until_finished()))  # pylint: disable=protected-access
    seal_s = timed(ckpt.wait)  # the manifest: read back every file, CRC-32, write atomically
    step_dir = ckpt.step_dir(1)
    files_bytes = sum(e["size"] for e in checkpoint_manifest.read_entries(step_dir).values())
    del state
    bare_args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                   data=ocp.args.JsonRestore())
    times = {"verified restore": [], "bare orbax restore": [], "verify only": []}
    for _ in range(args.repeats):
      times["bare orbax restore"].append(timed(lambda: ckpt._manager.restore(1, args=bare_args)))  # pylint: disable=protected-access
      times["verified restore"].append(timed(lambda: ckpt.restore_latest(abstract)))
      times["verify only"].append(timed(lambda: checkpoint_manifest.verify(step_dir)))
    ckpt.close()
  finally:
    if not args.dir:
      shutil.rmtree(workdir, ignore_errors=True)
  median = {k: statistics.median(v) for k, v in times.items()}
  overhead = median["verified restore"] / median["bare orbax restore"] - 1
  # Each repeat times both back to back: the median of their ratios is less exposed to a busy
  # machine's drift than the ratio of the medians.
  paired = statistics.median(v / b - 1 for v, b in zip(times["verified restore"],
                                                       times["bare orbax restore"]))
  meta = {"config": args.config, "params": param_accounting.analytic_count(model_cfg),
          "state_bytes": int(nbytes), "checkpoint_file_bytes": int(files_bytes),
          "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()}), "
                    f"{os.cpu_count()} CPU cores", "jax": jax.__version__,
          "orbax": getattr(ocp, "__version__", "?"), "python": platform.python_version(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
          "repeats": args.repeats}
  result = {"meta": meta, "save_s": save_s, "seal_manifest_s": seal_s, "times_s": times,
            "median_s": median, "verification_overhead": overhead,
            "verification_overhead_paired": paired,
            "verify_share_of_bare_restore": median["verify only"] / median["bare orbax restore"]}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_checkpoint.json"), "w") as f:
    json.dump(result, f, indent=1)
  lines = [f"checkpoint of {args.config}: {meta['params']:,} params, "
           f"{files_bytes / 2**30:.2f} GiB of files; {meta['device']}, jax {meta['jax']}, "
           f"{meta['date']}", "",
           "| what | median s | runs (s) |", "| --- | --- | --- |",
           f"| save (orbax, to finalize) | {save_s:.2f} | 1 |",
           f"| seal (manifest: read back + CRC-32C) | {seal_s:.2f} | 1 |"]
  lines += [f"| {k} | {median[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} |"
            for k, v in times.items()]
  lines += ["", f"verification overhead on restore: {100 * overhead:+.1f}% (ratio of medians), "
                f"{100 * paired:+.1f}% (median of paired runs); verify alone = "
                f"{100 * result['verify_share_of_bare_restore']:.1f}% of a bare restore"]
  with open(os.path.join(args.out, "bench_checkpoint.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  cli.guarded(main)()
