"""ViT, CLIP (and CLIPVisionModel), Whisper and Funnel checkpoints as run directories.

`python -m tfjax.hf import` of these model types (tfjax/hf/importer.py hands them here) writes
what experiments/train.py writes for their tasks (tfjax/training/tasks/): RUN/config.json (the
task, config.model = the model's config fields, the task's data keys), RUN/checkpoints/0 (params
only), RUN/tokenizer.json when the source has a tokenizer.json, and RUN/hf/:

  config.json, generation_config.json, tokenizer and preprocessor files   the source's
  import.json     {model_type, hf_class, prefix}: which transformers class the tensors were
  kept.safetensors  stored tensors the model derives (Whisper's encoder sinusoids), so that an
                    export writes the source's own bits rather than a recomputation

so the main loop fine-tunes it (`--config.init_from=RUN`, which carries hf/), evaluates it and
`python -m tfjax.hf export` writes it back as the class it came from: an import -> export round
trip reproduces every tensor bit for bit (tests/hf/test_hf_task_runs.py).

Task of each class: ViTForImageClassification, ViTModel, CLIPVisionModel -> vit; CLIPModel ->
clip; Whisper* -> whisper; FunnelForSequenceClassification -> funnel_classification; the other
Funnel classes -> funnel (FunnelModel / FunnelBaseModel have no head to train: their runs
round-trip, and fine-tuning them says so).
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np

from tfjax.data import tokenizers
from tfjax.hf import mapping, modalities, reader
from tfjax.hf.mapping import UnsupportedError
from tfjax.runtime import files
from tfjax.training.checkpointing import checkpoint, runs
from tfjax.training.config.defaults import base_config
from tfjax.training.tasks.own_model import section

IMPORT_FILE = "import.json"        # in RUN/hf/
KEPT_FILE = "kept.safetensors"     # in RUN/hf/
# The source's files kept in RUN/hf/ and written back by export (besides config.json).
SIDE_FILES = reader.METADATA_FILES[1:] + (
    "preprocessor_config.json", "vocab.json", "merges.txt", "added_tokens.json",
    "normalizer.json")
# config.json fields an export takes from the source (token ids, names of the labels).
KEPT_FIELDS = mapping.KEPT_FIELDS + ("id2label", "label2id")
# The family of each task, for a run trained from scratch (no hf/import.json).
TASK_MODEL_TYPE = {"vit": "vit", "clip": "clip", "whisper": "whisper", "funnel": "funnel",
                   "funnel_classification": "funnel"}


def task_of(loaded: modalities.Loaded) -> str:
  if loaded.model_type in ("vit", "clip_vision_model"):
    return "vit"
  if loaded.model_type == "funnel":
    return "funnel_classification" if loaded.cfg.num_classes else "funnel"
  return loaded.model_type


def run_config(loaded: modalities.Loaded):
  """The experiment config of the imported run: its task's base config with the model's
  fields, and the data keys that must agree with the model (classes)."""
  task = task_of(loaded)
  config = base_config(task)
  config.model = section(loaded.cfg)
  classes = getattr(loaded.cfg, "num_classes", 0)
  if "classes" in config.data and classes:
    config.data.classes = classes
  return config


def import_run(hf_dir: str, workdir: str, *, dtype: str = "float32"):
  """Writes run `workdir` from the Hugging Face directory `hf_dir`; returns modalities.Loaded."""
  if dtype != "float32":
    raise ValueError(f"--dtype={dtype}: ViT / CLIP / Whisper / Funnel runs import as float32 "
                     "(their config's dtype sets the compute dtype of a fine-tune)")
  loaded = modalities.read(hf_dir)
  config = run_config(loaded)
  runs.prepare_workdir(workdir, config)
  meta = os.path.join(workdir, runs.ORIGIN_DIR)
  os.makedirs(meta, exist_ok=True)
  for name in ("config.json",) + SIDE_FILES:
    if os.path.exists(os.path.join(hf_dir, name)):
      shutil.copy(os.path.join(hf_dir, name), os.path.join(meta, name))
  files.write_json_atomic(os.path.join(meta, IMPORT_FILE),
                          {"model_type": loaded.model_type, "hf_class": loaded.hf_class,
                           "prefix": loaded.prefix}, indent=2, sort_keys=True)
  if loaded.kept:
    from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
    save_file({k: np.ascontiguousarray(v) for k, v in loaded.kept.items()},
              os.path.join(meta, KEPT_FILE))
  tokenizer_path = os.path.join(hf_dir, "tokenizer.json")
  if os.path.exists(tokenizer_path):
    generation_path = os.path.join(hf_dir, "generation_config.json")
    generation = reader.read_json(generation_path) if os.path.exists(generation_path) else {}
    tokenizers.HFTokenizer.from_file(tokenizer_path,
                                     mapping.special_ids(loaded.source, generation)).save(workdir)
  params = jax.tree.map(jax.numpy.asarray, loaded.params)
  writer = checkpoint.Checkpointer(workdir, use_ocdbt=False)
  try:
    writer.save(0, {"params": params}, {"index": 0}, json.loads(config.to_json_best_effort()),
                force=True)
    writer.wait()
  finally:
    writer.close()
  return loaded


def origin(workdir: str) -> dict:
  """RUN/hf/import.json ({} for a run not imported, nor fine-tuned from an import)."""
  path = os.path.join(workdir, runs.ORIGIN_DIR, IMPORT_FILE)
  return reader.read_json(path) if os.path.exists(path) else {}


def _kept(workdir: str) -> dict:
  path = os.path.join(workdir, runs.ORIGIN_DIR, KEPT_FILE)
  if not os.path.exists(path):
    return {}
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  return load_file(path)


def _source_fields(workdir: str, cfg) -> dict:
  """KEPT_FIELDS of the source's config.json (label names only while the class count holds)."""
  path = os.path.join(workdir, runs.ORIGIN_DIR, "config.json")
  source = reader.read_json(path) if os.path.exists(path) else {}
  out = {k: source[k] for k in KEPT_FIELDS if k in source}
  if len(out.get("id2label") or {}) != getattr(cfg, "num_classes", -1):
    out.pop("id2label", None)
    out.pop("label2id", None)
  return out


def export_run(run, hf_dir: str, *, model_type=None, dtype=None,
               max_shard_size="5GB") -> dict:
  """Writes the restored run `run` (tfjax.training.checkpointing.runs.RestoredRun of an own-model
  task) as a Hugging Face directory: the class it was imported as, else `model_type`'s default
  class."""
  if dtype not in (None, "float32"):
    raise ValueError(f"--dtype={dtype}: ViT / CLIP / Whisper / Funnel export as float32")
  task = run.config.task
  if task not in TASK_MODEL_TYPE:
    raise UnsupportedError(f"run {run.workdir} trains task {task!r}, which has no Hugging Face "
                           f"class; export takes {sorted(TASK_MODEL_TYPE)} runs and text runs")
  source = origin(run.workdir)
  model_type = model_type or source.get("model_type") or TASK_MODEL_TYPE[task]
  same = source.get("model_type") == model_type
  config = modalities.export(
      run.model_config, run.params, hf_dir, max_shard_size, model_type=model_type,
      hf_class=source.get("hf_class") if same else None,
      prefix=source.get("prefix") if same else None,
      kept=_kept(run.workdir) if same else None,
      extra=_source_fields(run.workdir, run.model_config) if same else None)
  meta = os.path.join(run.workdir, runs.ORIGIN_DIR)
  copied = False
  for name in SIDE_FILES if same else ():
    if os.path.exists(os.path.join(meta, name)):
      shutil.copy(os.path.join(meta, name), os.path.join(hf_dir, name))
      copied = True
  if not copied and os.path.exists(os.path.join(run.workdir, tokenizers.TOKENIZER_FILE)):
    tok = tokenizers.load_tokenizer(run.workdir)
    if isinstance(tok, tokenizers.HFTokenizer):
      with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_str())
  return config
