"""A run directory: writing its config.json, and reading a finished (or interrupted) run back.

Reading is used by generation, the sweep's extra evaluations and the attention maps, so that each
reads a run the same way: `config.json` -> the ConfigDict it was written from, the model with the
run's own vocabulary, and the params of the newest readable checkpoint on this machine's devices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
from typing import Any, Mapping

import flax.linen as nn
import jax
from ml_collections import config_dict

from tfjax.training import tasks
from tfjax.training.checkpointing import checkpoint
from tfjax.training.loop import experiment
from tfjax.training.parallel import sharding
from tfjax.training.tasks import own_model
from tfjax.data import datasets
from tfjax.runtime import files
from tfjax.training.accounting import params as param_accounting
from tfjax.nn.config import ModelConfig
from tfjax.training.config.run_config import (CONFIG_FILE, config_from_json,  # noqa: F401
                                              load_config)

HISTORY_FILE = "config_history.jsonl"  # {step, key, old, new} per setting a resume changed
# <run>/hf/: the Hugging Face source of a run imported by tfjax/hf/importer.py (its config.json,
# generation config and tokenizer files, which export writes back). A fine-tune
# (config.init_from) carries its source's, so the fine-tuned run exports as that architecture.
ORIGIN_DIR = "hf"
_log = logging.getLogger(__name__)


def check_same_run(workdir: str, config) -> None:
  """Raises ValueError if `workdir` holds a run of another model or task (writes nothing)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return
  previous, current = files.read_json(path), json.loads(config.to_json_best_effort())
  if previous.get("model") != current.get("model") or previous.get("task") != current.get("task"):
    raise ValueError(
        f"{workdir} holds a run with a different model or task (see {path}); resuming would "
        "mix them. Use a new --workdir, or restore the original config.")


def config_changes(workdir: str, config) -> list[tuple[str, Any, Any]]:
  """[(dotted key, value in the run's config.json, value now)] for every setting a resume of
  `workdir` with `config` changes (none for a new workdir), in key order."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return []
  before, after = _flat(files.read_json(path)), _flat(json.loads(config.to_json_best_effort()))
  return [(k, before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
          if before.get(k) != after.get(k)]


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def record_config_changes(workdir: str, changes: list[tuple[str, Any, Any]], step: int) -> None:
  """Prints each change a resume makes (one line each) and appends them to
  DIR/config_history.jsonl as {step, key, old, new}: config.json then holds the new values, and
  the history says from which step each one applies."""
  if not changes or jax.process_index() != 0:
    return
  for key, old, new in changes:
    if key == "train.num_steps":
      _log.warning("resuming at step %d: train.num_steps %s -> %s (the run %s)", step, old, new,
                   "is extended" if (new or 0) > (old or 0) else "ends earlier")
    else:
      _log.warning("resuming at step %d with a changed config: %s %r -> %r", step, key, old, new)
  with open(os.path.join(workdir, HISTORY_FILE), "a", encoding="utf-8") as f:
    for key, old, new in changes:
      f.write(json.dumps({"step": step, "key": key, "old": old, "new": new}) + "\n")


def prepare_workdir(workdir: str, config) -> None:
  """Creates the workdir and writes its config.json, or checks that an existing run there is the
  same model and task (resuming would mix two runs otherwise). Other changes are allowed (the
  checkpoint restore refuses a changed optimizer state); record_config_changes logs them."""
  check_same_run(workdir, config)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, CONFIG_FILE)
  current = json.loads(config.to_json_best_effort())
  if jax.process_index() == 0:  # one writer on a shared filesystem
    files.write_json_atomic(path, current, indent=2, sort_keys=True)
    carry_origin(config, workdir)


def carry_origin(config, workdir: str) -> None:
  """Copies the ORIGIN_DIR of config.init_from's run (if it has one) into `workdir` (if it has
  none): a fine-tune of an imported model keeps what `python -m tfjax.hf export` needs."""
  source = config.get("init_from", "") if hasattr(config, "get") else ""
  origin, own = os.path.join(source or "", ORIGIN_DIR), os.path.join(workdir, ORIGIN_DIR)
  if source and os.path.isdir(origin) and not os.path.exists(own):
    shutil.copytree(origin, own)


@dataclasses.dataclass(frozen=True)
class RestoredRun:
  """A run read back: its config, model, the step of the checkpoint read and its params."""
  workdir: str
  config: config_dict.ConfigDict
  model_config: ModelConfig  # or the task's own model config (ViT, CLIP, Whisper, Funnel)
  step: int
  params: Any  # host (NumPy) arrays

  @functools.cached_property
  def dataset(self):
    """The run's dataset, built on first use (text: with the tokenizer saved in the workdir)."""
    task = tasks.get_task(self.config.task)
    if task.own_model:
      return task.make_dataset(self.config, self.workdir)
    return datasets.make_dataset(self.config.data, self.config.task, workdir=self.workdir)


def restore_run(workdir: str) -> RestoredRun:
  """The params of the newest readable checkpoint in `workdir`, with the run's config and model.

  Only the params are read, onto whatever devices this process has (replicated over them), not
  the mesh the run trained on: checkpoints restore onto any mesh. Neither the dataset nor the
  optimizer is built (RestoredRun.dataset builds the data when a caller first reads it).
  """
  config = load_config(workdir)
  model_cfg = experiment.model_config(config, workdir=workdir)
  replicated = sharding.replicated(sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}))
  task = tasks.get_task(config.task)
  shapes = (nn.meta.unbox(own_model.boxed_param_shapes(task, config, model_cfg))
            if task.own_model else param_accounting.param_shapes(model_cfg))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                          shapes)
  restored = checkpoint.newest_params(workdir, abstract)
  if restored is None:
    raise ValueError(f"{workdir} has no readable checkpoint of this model yet")
  step, params = restored
  return RestoredRun(workdir, config, model_cfg, step, jax.device_get(params))
