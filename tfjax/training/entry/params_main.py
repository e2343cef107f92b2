"""`tfjax-params` / `python -m tfjax.params --config=configs/NAME.py [--mesh=D,F,T[,C]]
[--seq_len=L]`:
the parameter breakdown of tfjax/training/accounting/params.py (last line `total: N`) and, with
--mesh, the per-device memory plan of tfjax/training/parallel/memory_plan.py before that line. A
config of a task with a model of its own (config.task vit, clip, whisper, funnel,
funnel_classification: tfjax/training/tasks/) prints that model's breakdown; the memory plan does
not cover those models (its activation terms are the text families').
--import=MODULE[,...] imports code outside tfjax first (a kind the config uses)."""

from __future__ import annotations

import logging
import sys

from absl import flags

from tfjax.data import datasets
from tfjax.training import tasks
from tfjax.training.accounting import params
from tfjax.training.config import run_config
from tfjax.training.entry import cli
from tfjax.training.loop import experiment
from tfjax.training.parallel import memory_plan, sharding
from tfjax.training.tasks import own_model
from tfjax.training.optim.optimizer import make_optimizer


def _sequence_lengths(config) -> tuple[int, int | None]:
  """(decoder/LM row length, encoder length or None) of the config's training batches: built
  from the data for synthetic tasks (cheap), else data.seq_len."""
  if config.data.name in datasets.TEXT_DATASETS + (datasets.PREPARED,):
    return int(config.data.seq_len), None
  batch = datasets.make_dataset(config.data, config.task).train_batch(0, 1)
  return tasks.row_lengths(batch, config.task)


def parse_mesh(text: str) -> tuple[int, int, int, int]:
  """DATA,FSDP,TENSOR[,CONTEXT] (context 1 when left out)."""
  try:
    sizes = tuple(int(t) for t in text.replace("x", ",").split(","))
  except ValueError:
    sizes = ()
  if len(sizes) not in (3, 4) or any(n < 1 for n in sizes):
    raise ValueError(f"--mesh={text!r}: give three or four positive sizes "
                     "DATA,FSDP,TENSOR[,CONTEXT], e.g. 1,8,1 or 1,2,1,4")
  return sizes + (1,) * (4 - len(sizes))


def _print_modality(config, mesh: str | None, seq_len: int | None) -> None:
  if mesh or seq_len:
    raise ValueError(f"--mesh/--seq_len: the memory plan covers the text families only, not "
                     f"config.task={config.task!r} (a model of its own); drop --mesh and "
                     "--seq_len for its parameter count")
  # The task checks the config and initializes the model as training does.
  task = tasks.get_task(config.task)
  model_cfg = task.model_config(config)
  task.check(config, model_cfg)
  print(params.modality_report(own_model.boxed_param_shapes(task, config, model_cfg)))


def _plan_and_print(config, mesh: str | None, seq_len: int | None) -> None:
  if tasks.get_task(config.task).own_model:
    _print_modality(config, mesh, seq_len)
    return
  dataset = None
  # a char/BPE vocabulary is known once the text is read
  text_data = config.data.name in datasets.TEXT_DATASETS and config.data.tokenizer != "byte"
  if config.model.get("vocab_size") in (0, None) and text_data:
    dataset = datasets.make_dataset(config.data, config.task)
  cfg = experiment.model_config(config, dataset)
  text = params.report(cfg)
  if mesh:
    sizes = parse_mesh(mesh)
    data_len, enc_len = _sequence_lengths(config)
    seq_len = seq_len or data_len
    # optimizer.grad_accum_steps -1: the count this mesh gives (as training resolves it)
    config = run_config.resolve_per_device_batches(
        config, sharding.batch_shards(sizes, sharding.rules(config)))
    accum = config.optimizer.grad_accum_steps
    optimizer, _ = make_optimizer(config.optimizer, config.train.num_steps, cfg.d_model)
    plan = memory_plan.memory_plan(cfg, sizes, batch_size=config.train.batch_size,
                                   seq_len=seq_len, optimizer=optimizer,
                                   rules=sharding.rules(config), grad_accum_steps=accum,
                                   enc_len=enc_len)
    body, last = text.rsplit("\n", 1)
    text = "\n".join([body, memory_plan.format_plan(plan, sizes, config.train.batch_size,
                                                    seq_len, accum, cfg.remat),
                      last])  # `total: N` stays the last line
  print(text)


def main() -> None:
  """`tfjax-params` / `python -m tfjax.params --config=FILE [--mesh=D,F,T[,C]] [--seq_len=L]`.
  A bad flag, config or mesh ends in one `error:` line, exit 2 (tfjax/training/entry/cli.py)."""
  config_flag = cli.define_config_file("config", None, "Config file, e.g. configs/NAME.py[:ARG] "
                                       "(required).")
  mesh_flag = flags.DEFINE_string(
      "mesh", None, "DATA,FSDP,TENSOR[,CONTEXT] mesh sizes (e.g. 1,8,1): also print per-device "
      "memory on that mesh (simulated; no devices needed).")
  seq_len_flag = flags.DEFINE_integer(
      "seq_len", None, "Row length for the activation estimate (default: the config's data).")

  def run(argv):
    if len(argv) > 1:
      cli.fail(f"unexpected arguments {argv[1:]}: every setting is a flag (see --help)")
    if config_flag is None or config_flag.value is None:
      cli.fail("--config is required, e.g. --config=configs/gpt2_small.py")
    # The output is the breakdown: the INFO line tracing the model logs (the attention
    # implementation) would come before it, or before an `error:` line.
    logging.getLogger("tfjax").setLevel(logging.WARNING)
    _plan_and_print(config_flag.value, mesh_flag.value, seq_len_flag.value)

  cli.run_absl(run, argv=sys.argv)


if __name__ == "__main__":
  main()
