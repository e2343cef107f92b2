"""The registry of training tasks: the one list of `config.task` values.

A task says what a run trains: which model it builds, how a batch feeds that model, what is
scored (summed statistics, never means: tfjax/training/tasks/text.py), where its data comes from
and what its parameters' logical axes are (the model's own, tfjax/nn/axes.py). One module
registers one task family (`register_task`), and the loop (tfjax/training/loop/train.py), the setup
(experiment.py), packed seeds, tfjax-params and tfjax-aot ask the registry, so every feature of
the loop works for every task.

Two kinds of task:
  text tasks (lm, mlm, seq2seq, classification): config.model is tfjax.nn.config.ModelConfig's
    flat keys and `family` names the ModelConfig family that serves the task;
  own-model tasks (own_model=True: vit, clip, whisper, funnel, funnel_classification): the task
    builds a model of its own (ViT, CLIP, Whisper, Funnel), config.model holds that model's
    config fields (`model_section`), config.data adds the task's data keys (`data_section`).

Data is pluggable per task: `register_dataset(task, name, factory)` adds a `config.data.name`
value (the synthetic sources are registered with the tasks; tfjax-prepare's folders register
the same way).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import ml_collections

from tfjax.nn.choices import one_of


class Task:
  """One `config.task` value. Subclasses override what differs; the defaults are the text
  tasks' (tfjax/training/tasks/text.py).

  name: the config.task value. family: the model family that serves it (text: a ModelConfig
  family; own-model tasks: the model's name). own_model: config.model is the task's own model
  config (model_section), not ModelConfig's keys. rows_independent: the batch's loss is a sum of
  per-row terms, so micro-batches and per-shard sums add up to the whole batch's (False for a
  contrastive loss, whose negatives are the whole batch: gradient accumulation is refused and the
  CPU's per-shard gradient sum is not used). eval_ratios: ((metric, numerator, denominator), ...)
  of summed statistics `forward` returns beyond the loss and accuracy, reported as `eval/metric`.
  datasets: {config.data.name: factory(config, workdir) -> dataset} (own-model tasks).
  """
  name: str = ""
  family: str = ""
  own_model: bool = False
  rows_independent: bool = True
  eval_ratios: tuple = ()
  datasets: dict

  def __init__(self):
    self.datasets = {}

  # --- config ------------------------------------------------------------------------------
  def model_section(self) -> Optional[ml_collections.ConfigDict]:
    """config.model with every key and its default (None: ModelConfig's, the text tasks')."""
    return None

  def data_section(self) -> dict:
    """The task's config.data keys beyond tfjax.data.datasets.default_data_config()'s."""
    return {}

  def model_config(self, config) -> Any:
    """The validated model config of `config` (own-model tasks)."""
    raise NotImplementedError

  def check(self, config, model_cfg) -> None:
    """The task's own checks of a config (ValueError naming the key and the fix)."""

  # --- model and batches -------------------------------------------------------------------
  def build_model(self, model_cfg, deterministic: bool = True):
    """The flax module (own-model tasks; text tasks build through tfjax.nn.models)."""
    raise NotImplementedError

  def make_dataset(self, config, workdir: Optional[str] = None):
    """The dataset config.data.name names, from this task's registered sources."""
    name = config.data.name
    one_of(f"data.name (config.task={self.name!r})", name, tuple(self.datasets))
    return self.datasets[name](config, workdir)

  def model_inputs(self, batch) -> tuple[tuple, dict]:
    """(args, kwargs) feeding `batch` to the model: `apply(v, *args, **kwargs)` and init."""
    raise NotImplementedError

  def row_lengths(self, batch) -> tuple[int, Optional[int]]:
    """(length of the rows the model predicts over, the encoder's length or None)."""
    raise NotImplementedError

  def tokens_per_row(self, model_cfg, batch) -> int:
    """Positions a row runs through the model (the throughput's 'tokens')."""
    return self.row_lengths(batch)[0]

  def forward(self, model, params, batch, label_smoothing: float = 0.0,
              rngs: Optional[dict] = None) -> dict:
    """Summed statistics of one batch: loss_sum, weight_sum, correct_sum, row_correct [B],
    row_count [B], and the sums `eval_ratios` name."""
    raise NotImplementedError

  def after_update(self, params):
    """The params after an optimizer update (CLIP clips its temperature here)."""
    return params

  # --- ahead-of-time compiling (tfjax-aot, tfjax/aot/) -------------------------------------
  def compute_dtype(self, model_cfg) -> str:
    """The dtype the model's matmuls run in (which peak FLOP/s a roofline uses): the config's
    `dtype`; for a config of sub-configs (CLIP's two towers) theirs, float32 if they differ
    (the slower peak)."""
    if hasattr(model_cfg, "dtype"):
      return model_cfg.dtype
    dtypes = {part.dtype for part in vars(model_cfg).values() if hasattr(part, "dtype")}
    return dtypes.pop() if len(dtypes) == 1 else "float32"

  def train_flops_per_row(self, model_cfg, batch) -> Optional[float]:
    """Training FLOPs (forward and backward) of one row shaped like `batch`'s, counted from the
    architecture; None where the task has no such count (tfjax-aot then says 'unknown' rather
    than guess)."""
    return None


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
  """Adds `task` under task.name (a module registers its tasks at import)."""
  if not task.name or task.name in TASKS:
    raise ValueError(f"task name {task.name!r} is empty or already registered")
  TASKS[task.name] = task
  return task


def register_dataset(task: str, name: str, factory: Callable) -> None:
  """Adds `config.data.name = name` for `task`: factory(config, workdir) -> a dataset with
  train_batch(index, batch_size, row_start=0, row_count=None) and eval_batches(batch_size,
  num_batches, row_start=0, row_count=None) (tfjax/data/datasets.py's contract)."""
  get_task(task).datasets[name] = factory


def get_task(name: str) -> Task:
  """The registered task `name`; ValueError naming config.task and the choices otherwise."""
  one_of("config.task", name, tuple(TASKS))
  return TASKS[name]
