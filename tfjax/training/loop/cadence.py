"""When the training loops (train.py, packed.py) log, evaluate, checkpoint and stop, and how fast
they go: shared so a packed group acts at the same steps as its separate runs would."""

from __future__ import annotations

import jax

from tfjax.training import tasks
from tfjax.training.accounting import flops
from tfjax.training.loop import metrics


def due(step: int, every: int, train_cfg) -> bool:
  """Whether an event happening every `every` steps (and at the last step) happens at `step`."""
  return step % every == 0 or step == train_cfg.num_steps


def steps_this_call(step: int, train_cfg, stop_after_step: int | None) -> int:
  """Steps the next call runs: up to train.steps_per_call, ending at the next step that logs,
  evaluates, checkpoints or stops, so those happen at the same steps whatever steps_per_call is."""
  ends = [train_cfg.num_steps] + [step + every - step % every for every in (
      train_cfg.log_every, train_cfg.eval_every, train_cfg.checkpoint_every)]
  if stop_after_step is not None:
    ends.append(max(stop_after_step, step + 1))
  return max(1, min(min(ends) - step, train_cfg.steps_per_call))


class Throughput:
  """Tokens per second of the steps since the last reset, and MFU when the peak is known.

  `tokens_per_step`, `flops_per_token` and `peak` (FLOP/s per device, 0 or None: unknown) are
  what `for_experiment` reads from a run; `timer` measures the wall clock (metrics.Timer)."""

  def __init__(self, tokens_per_step: int, flops_per_token: float, peak: float | None,
               timer: metrics.Timer | None = None):
    self._tokens_per_step = tokens_per_step
    self._flops_per_token = flops_per_token
    self._peak = peak
    self._timer = timer or metrics.Timer()

  @classmethod
  def for_experiment(cls, experiment) -> Throughput:
    train_cfg = experiment.config.train
    task = tasks.get_task(experiment.config.task)
    seq_len = task.tokens_per_row(experiment.model_config, experiment.dataset.train_batch(0, 1))
    # The FLOPs count covers the tfjax.nn.models families; a task's own model has no MFU.
    per_token = (None if task.own_model
                 else flops.flops_per_token(experiment.model_config, seq_len))
    return cls(train_cfg.batch_size * seq_len, per_token, flops.peak_flops(train_cfg.peak_flops))

  def add_steps(self, num_steps: int) -> None:
    self._timer.steps += num_steps

  def reset(self) -> None:
    self._timer.reset()

  def metrics(self) -> dict:
    rate = self._timer.rate(self._tokens_per_step)
    out = {"train/tokens_per_sec": rate}
    if self._peak and self._flops_per_token is not None:
      out["train/mfu"] = rate * self._flops_per_token / (self._peak * jax.device_count())
    return out
