"""Training tasks as registered plugins (tfjax/training/tasks/registry.py), one module each:

  text.py      lm, mlm, seq2seq, classification (the tfjax.nn.models families)
  vit.py       vit: image classification
  clip.py      clip: contrastive image-text
  whisper.py   whisper: speech to text
  funnel.py    funnel (masked LM) and funnel_classification
  own_model.py what the tasks with a model of their own share (config sections, synthetic rows)

A task outside the package registers the same way (`register_task(MyTask())` at import).
The functions below are the task-name spellings the loop and older callers use.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfjax.nn.choices import one_of
from tfjax.training.tasks import registry
from tfjax.training.tasks.registry import Task, get_task, register_dataset, register_task
from tfjax.training.tasks import text, vit, clip, whisper, funnel  # noqa: F401  (registering)
from tfjax.training.tasks.text import summed_statistics  # noqa: F401

# Task name -> the model family that serves it, for the tasks registered at import.
TASK_FAMILY = {name: task.family for name, task in registry.TASKS.items()}
TASKS = tuple(TASK_FAMILY)


def check_task(task: str, family: str | None = None) -> str:
  """`task` if it is a registered task (and, given `family`, that family serves it); else
  ValueError naming the key, the value and the choices."""
  one_of("config.task", task, tuple(registry.TASKS))
  wanted = registry.TASKS[task].family
  if family is not None and wanted != family:
    raise ValueError(f"config.task={task!r} needs model.family={wanted!r}, got {family!r}")
  return task


def model_inputs(batch: Mapping[str, Any], task: str) -> tuple[tuple, dict]:
  """(args, kwargs) that feed `batch` to the task's model: `model.apply(v, *args, **kwargs)` and
  `model.init(rng, *args, **kwargs)` alike. Keys a batch lacks are passed as None."""
  return get_task(task).model_inputs(batch)


def row_lengths(batch: Mapping[str, Any], task: str) -> tuple[int, int | None]:
  """(length of the rows the model predicts over: the decoder's for seq2seq, else the inputs',
  the encoder's length for seq2seq else None) of a batch."""
  return get_task(task).row_lengths(batch)


def logits_and_targets(model, variables, batch: Mapping[str, Any], task: str,
                       rngs: dict | None = None):
  """(logits_BxLxV, targets_BxL, weights_BxL) of a text task; classification has a length-1
  'sequence' axis (L = 1, V = classes)."""
  return get_task(task).logits_and_targets(model, variables, batch, rngs)


def forward(model, params, batch: Mapping[str, Any], task: str, label_smoothing: float = 0.0,
            rngs: dict | None = None) -> dict:
  """Summed loss statistics of one batch (tfjax/training/tasks/text.py)."""
  return get_task(task).forward(model, params, batch, label_smoothing, rngs)
