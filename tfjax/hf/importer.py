"""Hugging Face model directory -> tfjax run directory (config.json, checkpoints/, tokenizer).

The run is the same as one experiments/train.py writes, so generation, parameter accounting,
sweeps and fine-tuning (`config.init_from`) read it unchanged. Checkpoint step 0 holds the params
only (no optimizer state: a fine-tune starts its own).

Memory: tensors stream one at a time from the memory-mapped safetensors files; each is converted
(transposed / split into heads), cast to --dtype (its one copy) and placed at once on the devices
with the sharding the run's mesh gives it (FSDP over all devices by default), then dropped from
host memory. The host holds one tensor in flight plus whatever of the model lives on host devices
(on a CPU-only machine, the whole model once); the checkpoint is written array by array (no
OCDBT), so the write adds a fraction of the model to the peak (measured by
experiments/bench_hf_import.py: docs/benchmarks/hf_import.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Optional

import jax
import numpy as np
from flax import traverse_util

from tfjax.hf import reader, registry
# special_ids lived here; importer.special_ids still names it.
from tfjax.hf.mapping import Fields, UnsupportedError, special_ids  # noqa: F401
from tfjax.nn.config import DTYPES, ModelConfig
from tfjax.training.checkpointing import checkpoint, runs
from tfjax.training.parallel import sharding
from tfjax.data import tokenizers
from tfjax.training.accounting import params as param_accounting
from tfjax.training.config.defaults import base_config

_log = logging.getLogger(__name__)

HF_METADATA_DIR = runs.ORIGIN_DIR  # <run>/hf/: the source's config.json, tokenizer files (export)


def model_config_from_hf(ckpt: reader.HFCheckpoint, dtype: str = "float32"):
  """(Architecture, ModelConfig) of an opened checkpoint; UnsupportedError names what tfjax
  cannot express."""
  arch = registry.architecture(ckpt.config.get("model_type"))
  fields = Fields(ckpt.config, arch.model_type, arch.ignored)
  values = arch.config_from_hf(arch.model_type, fields, ckpt.names)
  fields.finish()
  return arch, ModelConfig.from_flat({**values, "dtype": dtype}).validated()


def run_config(model_cfg: ModelConfig, task: str):
  """The experiment config of an imported run: the model, its task, text data through the HF
  tokenizer (data.path is the user's to set for a fine-tune)."""
  config = base_config()
  for key, value in model_cfg.to_flat().items():
    config.model[key] = value
  config.task = task
  config.data.update(name="text", tokenizer="hf",
                     seq_len=min(256, model_cfg.max_len) if task != "seq2seq" else 256)
  return config


def check_coverage(rules, cfg: ModelConfig, names: set, droppable) -> dict:
  """{path: ShapeDtypeStruct} of the model's params, after checking that the rules produce every
  parameter exactly once and read only tensors the checkpoint has, and that the checkpoint holds
  no tensor the rules leave unread (other than ones the model derives)."""
  shapes = traverse_util.flatten_dict(param_accounting.param_shapes(cfg))
  produced = [p for r in rules for p in r.tfjax]
  duplicates = sorted({p for p in produced if produced.count(p) > 1})
  missing_params = sorted(set(shapes) - set(produced))
  unknown_params = sorted(set(produced) - set(shapes))
  if duplicates or missing_params or unknown_params:
    raise AssertionError(f"mapping bug: parameters produced twice {duplicates[:3]}, never "
                         f"{missing_params[:3]}, unknown {unknown_params[:3]}")
  wanted = {n for r in rules for n in r.hf}
  absent = sorted(wanted - names)
  if absent:
    raise UnsupportedError(f"the checkpoint lacks tensor(s) {absent[:5]}"
                           f"{' ...' if len(absent) > 5 else ''} that this model needs")
  unused = sorted(n for n in names - wanted if not droppable(cfg, n))
  if unused:
    raise UnsupportedError(
        f"the checkpoint has tensor(s) {unused[:5]}{' ...' if len(unused) > 5 else ''} that the "
        "tfjax model has no place for; importing without them would give a different model")
  return shapes


def read_params(ckpt: reader.HFCheckpoint, arch, cfg: ModelConfig, *, dtype: str = "float32",
                mesh: tuple = (1, -1, 1)) -> dict:
  """The model's params {path: array} from an opened checkpoint, tensor by tensor: each is
  converted, cast to `dtype` and placed with the sharding `mesh` (data, fsdp, tensor) gives it
  before the next is read."""
  rules = arch.rules(cfg, ckpt.names)
  shapes = check_coverage(rules, cfg, ckpt.names, arch.droppable)
  mesh_ = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh)))
  shardings = traverse_util.flatten_dict(sharding.logical_shardings(
      mesh_, param_accounting.boxed_param_shapes(cfg), sharding.DEFAULT_RULES))
  store = DTYPES[dtype]
  params = {}
  for rule in rules:
    outs = rule.to_tfjax([ckpt.get(n) for n in rule.hf])
    for path, value in zip(rule.tfjax, outs):
      if tuple(value.shape) != tuple(shapes[path].shape):
        raise UnsupportedError(
            f"tensor(s) {list(rule.hf)} give {'/'.join(path)} shape {tuple(value.shape)}, but "
            f"the config implies {tuple(shapes[path].shape)}")
      params[path] = jax.device_put(np.asarray(value).astype(store), shardings[path])
    del outs
  return params


def load(hf_dir: str, *, dtype: str = "float32", mesh: tuple = (1, -1, 1)):
  """(ModelConfig, params) of a Hugging Face model directory, in memory (nothing written)."""
  with reader.HFCheckpoint(hf_dir) as ckpt:
    arch, cfg = model_config_from_hf(ckpt, dtype)
    params = read_params(ckpt, arch, cfg, dtype=dtype, mesh=mesh)
  return cfg, traverse_util.unflatten_dict(params)


def import_model(hf_dir: str, workdir: str, *, dtype: str = "float32",
                 mesh: tuple = (1, -1, 1)):
  """Writes the run directory `workdir` from the Hugging Face model in `hf_dir`; returns its
  ModelConfig (ViT / CLIP / Whisper / Funnel: the model's own config, their run written by
  tfjax/hf/task_runs.py). `dtype` is the compute dtype and the dtype the params are stored in;
  `mesh` (data, fsdp, tensor) places each tensor as it is read."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"--dtype={dtype!r}: choose float32 or bfloat16")
  if os.path.exists(os.path.join(workdir, runs.CONFIG_FILE)) or os.path.exists(
      os.path.join(workdir, "checkpoints")):
    raise ValueError(f"{workdir} already holds a run; import into a new directory")
  config_path = os.path.join(hf_dir, "config.json")
  if os.path.exists(config_path) and reader.read_json(config_path).get(
      "model_type") in registry.MODALITIES:
    from tfjax.hf import task_runs  # pylint: disable=import-outside-toplevel
    return task_runs.import_run(hf_dir, workdir, dtype=dtype).cfg
  with reader.HFCheckpoint(hf_dir) as ckpt:
    arch, cfg = model_config_from_hf(ckpt, dtype)
    params = read_params(ckpt, arch, cfg, dtype=dtype, mesh=mesh)
    generation = ckpt.generation_config()
    tokenizer_path = ckpt.tokenizer_path()
    config = run_config(cfg, arch.task)
    runs.prepare_workdir(workdir, config)
    meta_dir = os.path.join(workdir, HF_METADATA_DIR)
    os.makedirs(meta_dir, exist_ok=True)
    for name in reader.METADATA_FILES:
      if os.path.exists(os.path.join(hf_dir, name)):
        shutil.copy(os.path.join(hf_dir, name), os.path.join(meta_dir, name))
    if tokenizer_path is not None:
      tokenizers.HFTokenizer.from_file(
          tokenizer_path, special_ids(ckpt.config, generation)).save(workdir)
    else:
      _log.warning("%s has no tokenizer.json: generate with --prompt_ids", hf_dir)
  params = traverse_util.unflatten_dict(params)
  # Not OCDBT: its single database keeps every array's write buffers until the commit (peak
  # host memory 1.9x the model's size instead of 1.2x on a 1B model, docs/hf.md).
  ckpt_writer = checkpoint.Checkpointer(workdir, use_ocdbt=False)
  try:
    ckpt_writer.save(0, {"params": params}, {"index": 0},
                     json.loads(config.to_json_best_effort()), force=True)
    ckpt_writer.wait()
  finally:
    ckpt_writer.close()
  return cfg


def hf_metadata(workdir: str, name: str = "config.json") -> Optional[dict]:
  """The source's `name` (config.json, generation_config.json) kept by import, if any."""
  path = os.path.join(workdir, HF_METADATA_DIR, name)
  return reader.read_json(path) if os.path.exists(path) else None
