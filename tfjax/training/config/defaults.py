"""The full experiment config every `configs/*.py` starts from (`base_config`), and the default run.

`base_config()` is one ConfigDict with every key present. Sections: model
(tfjax.nn.config.ModelConfig), data (tfjax.data.datasets), optimizer
(tfjax.training.optim.optimizer), train (the loop, below), mesh (tfjax.training.parallel.sharding).
Config files change values, never add keys, so a typo in `--config.x.y=...` fails instead of being
silently ignored.

`get_config()` is the default run (a 2-layer decoder learning to reverse sequences; synthetic
data, no files): this file is `tfjax-train`'s default `--config`, so an installed package trains
without the repository's configs/ (configs/default.py returns the same config).
"""

from ml_collections import config_dict

from tfjax.nn.config import default_model_config
from tfjax.runtime import imports
from tfjax.data.datasets import default_data_config
from tfjax.training.optim.optimizer import default_optimizer_config


def default_train_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.num_steps = 1000            # optimizer updates
  c.batch_size = 32             # global batch (rows), split over processes and micro-batches
  c.eval_batch_size = 32        # -1: micro_batch_per_device rows on each batch shard
  c.micro_batch_per_device = 0  # rows per batch shard (device on data x fsdp) per micro-batch,
                                # for optimizer.grad_accum_steps / eval_batch_size = -1: resolved
                                # at setup from the mesh (run_config.resolve_per_device_batches)
  c.eval_batches = 8            # per eval group ('val', or one per synthetic test length)
  c.eval_every = 250
  c.eval_at_start = True        # nanoGPT also evaluates step 0
  c.log_every = 50
  c.steps_per_call = 1          # steps per jitted call (lax.fori_loop over K stacked batches);
                                # logs, evals, checkpoints still land on their steps
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  c.label_smoothing = 0.0
  c.sample_tokens = 0           # LM runs: greedy sample of this many tokens at each eval
  c.sample_prompt = ""
  c.peak_flops = 0.0            # per device, for MFU; 0 = look the device up
                                # (tfjax.training.accounting.flops)
  c.skip_nonfinite = False      # a NaN/inf loss or grad norm: False = stop the run there;
                                # True = skip that update and count it
                                # (tfjax/training/loop/divergence.py)
  c.cpu_fusion = "auto"         # XLA:CPU backward fusion boundary
                                # (tfjax/training/parallel/cpu_fusion.py):
                                # auto (on iff the backend is CPU) | on | off; same values
  return c


def default_mesh_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.data = -1                   # -1: all remaining devices
  c.fsdp = 1
  c.tensor = 1
  # Sequence (context) parallelism: every activation's length split over this many devices,
  # attention all-gathering K/V over them (tfjax/nn/sharded_attention.py; docs/scaling/context.md).
  c.context = 1
  # CPU-only hosts: split the CPU into this many XLA devices before JAX starts, so the 'data'
  # axis runs one batch shard per core (XLA:CPU runs a small matmul on ~1 core; see
  # tfjax.training.parallel.sharding.configure_cpu_devices). 0: leave JAX's default (1 device); -1:
  # one per core, capped to a count that divides the batch sizes. Applied by the entry points only.
  c.cpu_devices = 0
  return c


def base_config(task: str = "lm") -> config_dict.ConfigDict:
  """Every key of a run of `task` (a registered task, tfjax/training/tasks/): the text tasks'
  config.model is ModelConfig's keys; a task with a model of its own (vit, clip, whisper, funnel,
  funnel_classification) has that model's config fields there and adds its data keys to
  config.data. config.json records the task, so reading a run back builds the same sections."""
  # pylint: disable-next=import-outside-toplevel  (the task modules import the model code)
  from tfjax.training import tasks
  chosen = tasks.get_task(task)
  config = config_dict.ConfigDict()
  config.seed = 0
  config.task = task            # lm | mlm | seq2seq | classification | vit | clip | whisper |
                                # funnel | funnel_classification (tfjax/training/tasks/)
  config.model = chosen.model_section() or default_model_config()
  config.data = default_data_config()
  if chosen.own_model:
    config.data.name = "synthetic"  # the task's own sources (tasks.register_dataset)
  config.data.update(chosen.data_section())
  config.optimizer = default_optimizer_config()
  config.train = default_train_config()
  config.mesh = default_mesh_config()
  config.init_from = ""         # a run directory: start from its params and architecture
                                # (fine-tuning; tfjax/training/checkpointing/init_from.py)
  config.sharding_rules = ()    # () = tfjax.training.parallel.sharding.DEFAULT_RULES;
                                # else ((logical, mesh), ...)
  # The --import modules this process imported (code outside tfjax: a kind, a position), so
  # config.json records them and a run read back imports them again (tfjax/runtime/imports.py).
  config.imports = imports.loaded()
  return config


def refuse_argument(config_file: str, arg, takes: str = "no argument") -> None:
  """Raises ValueError when a config file is given an argument (`--config=FILE:ARG`) it does not
  take, so a typo never trains the default variant silently; `takes` names what it does take."""
  if arg not in (None, ""):
    raise ValueError(f"{config_file} takes {takes}, got {arg!r}")


def get_config(arg=None) -> config_dict.ConfigDict:
  """The default run: the reverse task, 600 steps; trains on lengths 1..16 and evaluates exact
  match at 8 and 16 (in distribution) and 24, 32 (length generalization).

    python experiments/train.py --workdir=runs/default      # no --workdir: runs/default-<time>/

  Expected at step 600: eval/exact_match@8 1.00 and @16 0.97-1.00 (float rounding changes the
  trajectory between versions: the non-finite-update guard's select moved it from 0.996 to 0.984),
  @24 and @32 0.
  Run times: docs/benchmarks/cpu_training.md.
  """
  refuse_argument("configs/default.py", arg)
  config = base_config()
  config.task = "lm"
  config.data.update(name="reverse", form="decoder", train_lengths=(1, 16),
                     test_lengths=(8, 16, 24, 32), num_symbols=16)
  config.model.update(
      family="decoder", vocab_size=0, d_model=128, num_layers=2, num_heads=4, d_ff=512,
      ffn="gelu", norm="layernorm", norm_placement="pre", position="rope", max_len=128,
      dropout=0.0)
  config.optimizer.update(name="adamw", lr=3e-3, b2=0.98, weight_decay=0.01, schedule="cosine",
                          warmup_steps=100, min_lr=1e-4, clip_norm=1.0)
  config.train.update(num_steps=600, batch_size=64, eval_batch_size=128, eval_batches=2,
                      eval_every=200, log_every=50, checkpoint_every=200)
  config.mesh.cpu_devices = -1  # CPU: one XLA device per core, the batch split over them
  return config
