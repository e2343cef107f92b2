"""Reading back a finished (or interrupted) run directory: its config, tokenizer and parameters.

Used by generation, the sweep's extra evaluations and the attention maps, so that each reads a
run the same way: `config.json` -> the ConfigDict it was written from, the run's own tokenizer
(from the workdir), and the newest readable checkpoint restored onto this machine's devices.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
from ml_collections import config_dict

from tfjax import checkpoint, sharding, train
from tfjax.defaults import base_config


def config_from_json(values: Mapping[str, Any]) -> config_dict.ConfigDict:
  """The ConfigDict a run's config.json was written from (JSON lists become tuples again)."""
  config = base_config()

  def update(node, new, prefix):
    for key, value in new.items():
      if key not in node:
        raise ValueError(f"config.json has key {prefix}{key}, unknown to this version of tfjax")
      if isinstance(node[key], config_dict.ConfigDict):
        update(node[key], value, f"{prefix}{key}.")
      elif isinstance(value, list):
        node[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
      else:
        node[key] = value

  update(config, values, "")
  return config


def load_config(workdir: str) -> config_dict.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise ValueError(f"{workdir} has no config.json: not a tfjax training run directory")
  with open(path, encoding="utf-8") as f:
    return config_from_json(json.load(f))


def restore_run(workdir: str):
  """(config, experiment, step, params) of the newest readable checkpoint in `workdir`.

  The run is restored onto whatever devices this process has (a data-parallel mesh over all of
  them), not the mesh it was trained on: checkpoints restore onto any mesh.
  """
  config = load_config(workdir)
  config.mesh.update(data=-1, fsdp=1, tensor=1)
  exp = train.prepare(config, workdir)  # reads the run's saved tokenizer from the workdir
  mesh, rules = sharding.make_mesh(config.mesh), sharding.rules(config)
  # Only shapes and shardings are needed to restore into: never materialize a fresh state. Every
  # leaf carries its sharding on *this* mesh, so a run saved on other devices restores here.
  abstract = train.abstract_state(exp, mesh, rules)
  ckpt = checkpoint.Checkpointer(workdir, keep=config.train.keep_checkpoints)
  try:
    restored = ckpt.restore_latest(abstract)
  finally:
    ckpt.close()
  if restored is None:
    raise ValueError(f"{workdir} has no checkpoint yet")
  step, state, _ = restored
  return config, exp, step, jax.device_get(state.params)
