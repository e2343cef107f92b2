"""`config.init_from = RUN`: start a run from another run's params (fine-tuning).

The new run takes RUN's architecture: every model key comes from RUN's config.json (vocab size
resolved), except the execution keys below, which stay as this config sets them (a fine-tune
usually wants its own dropout). Its tokenizer, when its own workdir has none yet, is RUN's (so a
char, BPE or Hugging Face vocabulary carries over). Step 0's params are RUN's newest checkpoint's,
restored straight into this run's shardings; optimizer state, step and data position start fresh.
A run resumed from its own checkpoint ignores init_from.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from tfjax.data.tokenizers import TOKENIZER_FILE
from tfjax.nn.config import ModelConfig
from tfjax.training.checkpointing import checkpoint
from tfjax.training.config import run_config

# Model keys a fine-tune may set differently from the run it starts from (they change how the
# model runs, not its parameters).
OWN_KEYS = ("dropout", "attention_dropout", "remat", "attention_impl", "dtype")


def source(config) -> Optional[str]:
  path = config.get("init_from", "") if hasattr(config, "get") else ""
  return path or None


def resolve(config):
  """`config` with its model section replaced by the init_from run's (a copy; unchanged when
  init_from is empty). ValueError if that run directory is unreadable."""
  path = source(config)
  if path is None:
    return config
  if not os.path.isdir(path):
    raise ValueError(f"config.init_from={path!r} is not a run directory")
  source_config = run_config.load_config(path)
  model = run_config.model_config(source_config, workdir=path)
  resolved = config.copy_and_resolve_references()
  if not isinstance(model, ModelConfig):  # a task's own model (ViT, CLIP, Whisper, Funnel)
    if source_config.task != config.task:
      raise ValueError(f"config.init_from={path!r} is a {source_config.task!r} run, this config "
                       f"trains config.task={config.task!r}; start from a run of the same task")
    resolved.model.update(source_config.model.to_dict())  # every model key from that run
    return resolved
  for key, value in model.to_flat().items():
    if key not in OWN_KEYS and key not in ("deterministic", "decode"):
      resolved.model[key] = value
  return resolved


def tokenizer_dir(config, workdir: Optional[str]) -> Optional[str]:
  """Where the data's tokenizer is loaded from: the run's own workdir once it holds one, else
  the init_from run's if that holds one, else the workdir (built there)."""
  path = source(config)
  own = workdir is not None and os.path.exists(os.path.join(workdir, TOKENIZER_FILE))
  if not own and path is not None and os.path.exists(os.path.join(path, TOKENIZER_FILE)):
    return path
  return workdir


def load_params(path: str, abstract_params: Any) -> Any:
  """The params of the newest readable checkpoint of run `path`, placed as `abstract_params`
  (ShapeDtypeStructs with shardings) say; ValueError if none fits."""
  restored = checkpoint.newest_params(path, abstract_params)
  if restored is None:
    raise ValueError(f"config.init_from={path!r} has no checkpoint whose params fit this model")
  return restored[1]
