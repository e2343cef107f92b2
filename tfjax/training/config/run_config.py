"""A run's configuration: its config.json read back into the ConfigDict it was written from, and
the validated ModelConfig of a config (vocab_size=0 resolved from the data). Below both the
experiment setup and `config.init_from`, which read a source run's architecture with it."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ml_collections import config_dict

from tfjax.data import datasets
from tfjax.nn.config import ModelConfig, resolve_auto
from tfjax.runtime import files, imports
from tfjax.training.parallel import sharding
from tfjax.training.config.defaults import base_config

CONFIG_FILE = "config.json"


def config_from_json(values: Mapping[str, Any],
                     source: str = CONFIG_FILE) -> config_dict.ConfigDict:
  """The ConfigDict a run's config.json was written from (JSON lists become tuples again). The
  modules it records (config.imports, --import) are imported first: their kinds' keys are keys."""
  recorded = imports.load_recorded(values, source)
  task = values.get("task", "lm") if isinstance(values, Mapping) else "lm"
  config = base_config(task)

  def update(node, new, prefix):
    for key, value in new.items():
      if key not in node:
        raise ValueError(imports.unknown_key_message(f"{prefix}{key}", source, recorded))
      if isinstance(node[key], config_dict.ConfigDict):
        update(node[key], value, f"{prefix}{key}.")
      elif isinstance(value, list):
        node[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
      else:
        node[key] = value

  update(config, values, "")
  return config


def load_config(workdir: str) -> config_dict.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ValueError(f"{workdir} has no config.json: not a tfjax training run directory")
  values = files.read_json(path)
  _check_not_a_modality_run(workdir, values)
  return config_from_json(values, source=path)


def _check_not_a_modality_run(workdir: str, values) -> None:
  """A run of the old modality loop (experiments/train_modality.py before ViT, CLIP, Whisper and
  Funnel trained through tfjax-train) has a config.json of its own shape (train.learning_rate,
  params.msgpack); reading it as a run would name its first key as 'unknown to this version of
  tfjax', which it is not. Say what the run is and how to get one this version reads."""
  train = values.get("train") if isinstance(values, dict) else None
  if isinstance(train, dict) and "learning_rate" in train and values.get("task") in (
      "vit", "clip", "whisper", "funnel"):
    raise ValueError(
        f"{workdir} is a {values['task']!r} run of the removed modality loop (params.msgpack, "
        "train.learning_rate); train it again with python experiments/train.py "
        f"--config=configs/{values['task']}_synthetic.py --workdir=NEW_DIR, which writes "
        "checkpoints every command reads")


def model_config(config, dataset=None, *, workdir: str | None = None,
                 platform: str | None = None) -> ModelConfig:
  """The validated ModelConfig of an experiment config, vocab_size=0 resolved from the data
  (datasets.resolve_vocab_size: from `dataset` if built, else without building it), dtype /
  attention_impl 'auto' for `platform` (tfjax.nn.config.resolve_auto; None: this process's)."""
  # pylint: disable-next=import-outside-toplevel  (the task modules import the model code)
  from tfjax.training import tasks
  task = tasks.get_task(config.task)
  if task.own_model:  # ViT, CLIP, Whisper, Funnel: the task's own model config
    return task.model_config(config)
  model = dict(config.model)
  model["vocab_size"] = datasets.resolve_vocab_size(config, dataset, workdir=workdir)
  return ModelConfig.from_config(model, platform)


def resolve_platform_defaults(config, platform: str | None = None,
                              num_devices: int | None = None):
  """`config` with model.dtype / model.attention_impl 'auto' made concrete for `platform` and
  `num_devices` (tfjax.nn.config.resolve_auto; a copy when any was 'auto'), so config.json
  records what the run used."""
  # pylint: disable-next=import-outside-toplevel
  from tfjax.training import tasks
  if tasks.get_task(config.task).own_model:  # their models take no 'auto' values
    return config
  context = sharding.mesh_size(config.mesh, "context") if "mesh" in config else 1
  resolved = resolve_auto(dict(config.model), platform, num_devices, context=context)
  changed = {k: v for k, v in resolved.items() if config.model[k] != v}
  if not changed:
    return config
  config = config.copy_and_resolve_references()
  config.model.update(changed)
  return config


DERIVED = -1  # optimizer.grad_accum_steps / train.eval_batch_size: derive from the batch shards


def resolve_per_device_batches(config, batch_shards: int):
  """`config` with optimizer.grad_accum_steps and train.eval_batch_size given as -1 made concrete
  for `batch_shards` (the devices a batch splits over: data x fsdp under the default rules), so
  that every batch shard takes train.micro_batch_per_device rows per micro-batch and per eval
  batch: grad_accum_steps = batch_size / (micro_batch_per_device * batch_shards), eval_batch_size
  = micro_batch_per_device * batch_shards. A copy when any was -1 (config.json records the
  numbers the run used); explicit values are kept. Raises ValueError, one line naming the fix,
  when batch_size does not split so."""
  train, accum = config.train, config.optimizer.grad_accum_steps
  derived = [key for key, value in (("optimizer.grad_accum_steps", accum),
                                    ("train.eval_batch_size", train.eval_batch_size))
             if value == DERIVED]
  if not derived:
    return config
  rows = train.get("micro_batch_per_device", 0)
  if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
    raise ValueError(f"{' and '.join(derived)}=-1 take their size from "
                     f"train.micro_batch_per_device (rows per device per micro-batch), which is "
                     f"{rows!r}; set it to a positive integer or give {derived[0]} explicitly")
  batch, per_micro = train.batch_size, rows * batch_shards
  if accum == DERIVED and (batch < per_micro or batch % per_micro):
    raise ValueError(_no_split_message(batch, rows, batch_shards))
  config = config.copy_and_resolve_references()
  if accum == DERIVED:
    config.optimizer.grad_accum_steps = batch // per_micro
  if train.eval_batch_size == DERIVED:
    config.train.eval_batch_size = per_micro
  return config


def _no_split_message(batch: int, rows: int, shards: int) -> str:
  """The error of resolve_per_device_batches, with the fixes that work for these numbers: a
  smaller micro_batch_per_device that keeps the global batch, else the nearest global batches."""
  per_micro = rows * shards
  fixes = []
  smaller = [r for r in range(rows - 1, 0, -1) if batch % (r * shards) == 0]
  if smaller:
    fixes.append(f"set --config.train.micro_batch_per_device={smaller[0]} (keeps {batch} rows "
                 "a step)")
  nearest = sorted({n for n in (batch // per_micro * per_micro, -(-batch // per_micro) * per_micro)
                    if n > 0}, key=lambda n: (abs(n - batch), n))
  fixes.append(f"set --config.train.batch_size={' or '.join(str(n) for n in nearest)} "
               f"(a multiple of {rows} x {shards})")
  if batch % rows == 0:
    fixes.append(f"run on a number of batch shards that divides {batch // rows}")
  return (f"train.batch_size={batch} rows do not split into micro-batches of "
          f"train.micro_batch_per_device={rows} rows on each of {shards} batch shards "
          f"({per_micro} rows a micro-batch): {', or '.join(fixes)}")
