"""tfjax run directory -> Hugging Face model directory (config.json, model.safetensors or
shards with an index above --max_shard_size, tokenizer files) that `transformers`
`AutoModel*.from_pretrained` loads. A directory that already holds weights is refused (export
into a new one), so an export never mixes with or replaces earlier files.

The architecture is the one the run was imported from (kept in <run>/hf/config.json) or
`model_type`. Before anything is written, the config is translated to config.json and back: a
tfjax switch the architecture cannot express (e.g. ALiBi in a LLaMA export) is an error naming the
key, never a checkpoint that loads but computes something else.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import numpy as np
from flax import traverse_util

from tfjax.hf import importer, mapping, reader, registry, shards
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig
from tfjax.training import tasks
from tfjax.training.checkpointing import runs
from tfjax.data import tokenizers

# ModelConfig keys that change how a model runs or is initialized, not what it computes.
EXECUTION_KEYS = ("dropout", "attention_dropout", "init", "init_std", "position_init_std",
                  "scaled_residual_init",
                  "scan_layers", "remat", "attention_impl", "dtype", "deterministic", "decode")
# Config fields export copies from the imported source (token ids and bookkeeping).
KEPT_FIELDS = mapping.KEPT_FIELDS


def architecture_config(cfg: ModelConfig) -> dict:
  values = cfg.to_flat()
  return {k: v for k, v in values.items() if k not in EXECUTION_KEYS}


def hf_config(arch: registry.Architecture, cfg: ModelConfig, names: set) -> dict:
  """config.json fields of `cfg` as `arch`, checked by translating them back."""
  out = arch.config_to_hf(arch.model_type, cfg)
  fields = Fields(out, arch.model_type, arch.ignored)
  back = ModelConfig.from_flat(arch.config_from_hf(arch.model_type, fields, names)).validated()
  fields.finish()
  want, got = architecture_config(cfg), architecture_config(back)
  differ = {k: want[k] for k in want if want[k] != got[k]}
  if differ:
    raise UnsupportedError(
        f"model_type {arch.model_type!r} cannot express this run's model config {differ}")
  return out


def export_model(workdir: str, hf_dir: str, *, model_type: Optional[str] = None,
                 dtype: Optional[str] = None,
                 max_shard_size=shards.DEFAULT_MAX_SHARD_SIZE) -> dict:
  """Writes `hf_dir` from the newest checkpoint of run `workdir`; returns the config.json dict.
  `dtype` (float32 | bfloat16; default: the run's params dtype, float32) is the stored dtype;
  weights above `max_shard_size` (bytes, or "500MB", "5GB", ...) are written as shards."""
  shards.parse_size(max_shard_size)  # a bad size stops here, before anything is read
  present = shards.existing_weights(hf_dir)
  if present:
    raise ValueError(f"{hf_dir} already holds weights {present[:3]}; export into a new "
                     "directory")
  source = importer.hf_metadata(workdir) or {}
  run_task = runs.load_config(workdir).task
  if tasks.get_task(run_task).own_model:  # ViT, CLIP, Whisper, Funnel (tfjax/hf/task_runs.py)
    from tfjax.hf import task_runs  # pylint: disable=import-outside-toplevel
    return task_runs.export_run(runs.restore_run(workdir), hf_dir, model_type=model_type,
                                dtype=dtype, max_shard_size=max_shard_size)
  model_type = model_type or source.get("model_type")
  if model_type is None:
    raise ValueError(f"{workdir} was not imported from Hugging Face: name the architecture with "
                     f"--model_type (one of {sorted(registry.ARCHITECTURES)})")
  arch = registry.architecture(model_type)
  run = runs.restore_run(workdir)
  cfg = run.model_config
  rules = arch.rules(cfg, None)
  names = {n for r in rules for n in r.hf}
  config = hf_config(arch, cfg, names)
  config.update({k: source[k] for k in KEPT_FIELDS if k in source})
  store = np.dtype(dtype or "float32") if dtype != "bfloat16" else None
  if dtype == "bfloat16":
    import ml_dtypes  # pylint: disable=import-outside-toplevel
    store = np.dtype(ml_dtypes.bfloat16)
  config.update(architectures=[arch.hf_class], dtype=str(dtype or "float32"))
  params = traverse_util.flatten_dict(run.params)
  tensors = {}
  for rule in rules:
    for name, value in zip(rule.hf, rule.to_hf([np.asarray(params[p]) for p in rule.tfjax])):
      tensors[name] = np.ascontiguousarray(value.astype(store))
  os.makedirs(hf_dir, exist_ok=True)
  shards.write(tensors, hf_dir, max_shard_size)
  with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  _write_tokenizer(workdir, hf_dir)
  return config


def _write_tokenizer(workdir: str, hf_dir: str) -> None:
  """The source's tokenizer and generation files if imported, else an `hf` tokenizer's JSON."""
  meta = os.path.join(workdir, importer.HF_METADATA_DIR)
  copied = False
  for name in reader.METADATA_FILES[1:]:
    if os.path.exists(os.path.join(meta, name)):
      shutil.copy(os.path.join(meta, name), os.path.join(hf_dir, name))
      copied = True
  if not copied and os.path.exists(os.path.join(workdir, tokenizers.TOKENIZER_FILE)):
    tok = tokenizers.load_tokenizer(workdir)
    if isinstance(tok, tokenizers.HFTokenizer):
      with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str())
