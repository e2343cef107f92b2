"""What the own-model tasks (ViT, CLIP, Whisper, Funnel) share: config.model from the model's
config dataclass, and synthetic datasets that honour the loop's data contract.

The data contract (tfjax/data/datasets.py): row r of training batch i is a pure function of
(data.seed, i, r), so any process builds only its rows, and a resumed run (which restores only
the batch index) sees exactly the batches an uninterrupted one would. `SyntheticRows` draws each
row from its own NumPy generator seeded by (seed, stream, i, r); the eval set is one group 'val'
from data.eval_seed, a stream training never draws.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import ml_collections
import numpy as np

from tfjax.training.tasks.registry import Task

TRAIN_STREAM, EVAL_STREAM = 0, 1


def section(instance) -> ml_collections.ConfigDict:
  """A config dataclass instance's fields as a ConfigDict (nested dataclasses nested)."""
  out = ml_collections.ConfigDict()
  for field in dataclasses.fields(instance):
    value = getattr(instance, field.name)
    out[field.name] = section(value) if dataclasses.is_dataclass(value) else value
  return out


class OwnModelTask(Task):
  """A task whose model is not a tfjax.nn.models family: config.model holds the fields of
  `config_class` (its defaults: `default_model`), validated by its `validated()`."""
  own_model = True
  config_class: type = None

  def default_model(self):
    return self.config_class()

  def model_section(self) -> ml_collections.ConfigDict:
    return section(self.default_model())

  def example_batch(self, model_cfg) -> Optional[dict]:
    """One row of zeros with the shapes the model's init reads, without the data (reading a run
    back: its data may be elsewhere or checked against other ids); None: one row of the data."""
    del model_cfg
    return None

  def model_config(self, config):
    values = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
    try:
      return self.config_class(**values).validated()
    except TypeError as e:  # a field of another model (e.g. a text config given task=vit)
      raise ValueError(
          f"config.model does not fit config.task={self.name!r} ({e}); start the config from "
          f"tfjax.training.config.defaults.base_config({self.name!r}), e.g. "
          f"configs/{self.family}_synthetic.py") from None


def boxed_param_shapes(task: Task, config, model_cfg, dataset=None):
  """The parameter tree of `config`'s model as ShapeDtypeStructs still boxed with their logical
  axes (nothing allocated), from one row of the task's data (`dataset`; without it the task's
  example_batch, else the data built)."""
  batch = None if dataset is not None else task.example_batch(model_cfg)
  if batch is None:
    dataset = task.make_dataset(config) if dataset is None else dataset
    batch = dataset.train_batch(0, 1)
  args, kwargs = task.model_inputs(batch)
  model = task.build_model(model_cfg)
  return jax.eval_shape(lambda rng: model.init(rng, *args, **kwargs)["params"],
                        jax.random.PRNGKey(0))


class SyntheticRows:
  """A dataset of rows drawn by `rows(rng, count) -> dict of [count, ...] arrays`, one
  generator per row (module docstring)."""

  def __init__(self, rows: Callable[[np.random.Generator, int], dict], seed: int,
               eval_seed: int):
    self._rows, self.seed, self.eval_seed = rows, int(seed), int(eval_seed)

  def _batch(self, seed: int, stream: int, index: int, batch_size: int, row_start: int,
             row_count: Optional[int]) -> dict:
    count = batch_size - row_start if row_count is None else row_count
    rows = [self._rows(np.random.default_rng([seed, stream, index, r]), 1)
            for r in range(row_start, row_start + count)]
    return {k: np.concatenate([row[k] for row in rows]) for k in rows[0]}

  def train_batch(self, index: int, batch_size: int, row_start: int = 0,
                  row_count: Optional[int] = None) -> dict:
    return self._batch(self.seed, TRAIN_STREAM, index, batch_size, row_start, row_count)

  def eval_batches(self, batch_size: int, num_batches: int, row_start: int = 0,
                   row_count: Optional[int] = None) -> list:
    return [("val", self._batch(self.eval_seed, EVAL_STREAM, i, batch_size, row_start,
                                row_count)) for i in range(num_batches)]
