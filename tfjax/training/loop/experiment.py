"""Experiment setup: validate a config, build its data, model and optimizer, lay out the sharded
train state, and jit the steps with their shardings.

Everything here happens before a run touches its workdir, so a bad config fails with nothing
written. The loop (tfjax/training/loop/train.py), the benchmarks and the tests all set up through
this module; reading a finished run back (tfjax/training/checkpointing/runs.py) uses only
`model_config` and `state_layout`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfjax.training import tasks
from tfjax.training.checkpointing import init_from
from tfjax.training.loop import steps
from tfjax.training.parallel import cpu_fusion, sharding
from tfjax.data import datasets
from tfjax.runtime import workarounds
from tfjax.nn.choices import one_of
from tfjax.nn import attention_kinds, ops, positions
from tfjax.nn.config import AUTO, ModelConfig, platform_kind, xla_only_attention
from tfjax.nn.models import build_model
from tfjax.training.optim.optimizer import make_optimizer
from tfjax.training.config.run_config import (model_config, resolve_per_device_batches,
                                              resolve_platform_defaults)
from tfjax.training.parallel.sharding import BatchPlacement
from tfjax.training.loop.steps import TrainState

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class Experiment:
  """Everything a run needs, built and validated before the workdir is touched."""
  config: Any
  model_config: ModelConfig
  dataset: Any
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule

  @property
  def task(self) -> tasks.Task:
    """The registered task of config.task (tfjax/training/tasks/)."""
    return tasks.get_task(self.config.task)


def build_task_model(experiment: Experiment, deterministic: bool = True) -> nn.Module:
  """The experiment's model: a tfjax.nn.models family for the text tasks, the task's own model
  (ViT, CLIP, Whisper, Funnel) otherwise; `deterministic=False` is the training model (dropout)."""
  cfg = experiment.model_config
  if experiment.task.own_model:
    return experiment.task.build_model(cfg, deterministic)
  return build_model(cfg if deterministic else cfg.replace(deterministic=False))


def prepare(config, workdir: str | None = None, num_devices: int | None = None,
            platform: str | None = None, dataset=None) -> Experiment:
  """Validates the whole config and builds the data; raises ValueError naming any bad key.

  `num_devices` is the device count the mesh is checked against and `platform` the one model
  'auto' values are resolved for (run_config.resolve_platform_defaults): the local devices' by
  default, a target's when compiling ahead of time for hardware that is not attached (tfjax.aot),
  which also passes a `dataset` of the right batch shapes that reads no corpus
  (tfjax/aot/shapes.py). The returned config holds the resolved values, also those of
  optimizer.grad_accum_steps / train.eval_batch_size -1 (run_config.resolve_per_device_batches:
  from the batch shards of the mesh on `num_devices`)."""
  task = tasks.get_task(config.task)
  config = init_from.resolve(config)  # config.init_from: the source run's architecture
  num_devices = jax.device_count() if num_devices is None else num_devices
  config = resolve_platform_defaults(config, platform, num_devices)
  # grad_accum_steps / eval_batch_size -1: from the batch shards of this mesh (config.json
  # records the numbers, so a resume on the same devices is the same run)
  config = resolve_per_device_batches(config, _batch_shards(config, num_devices))
  # An existing workdir keeps its tokenizer (resume); a new one is written only after validation.
  existing = workdir if workdir and os.path.isdir(workdir) else None
  if task.own_model:  # ViT, CLIP, Whisper, Funnel: the task's model, data and checks
    model_cfg = model_config(config)
    task.check(config, model_cfg)
    if dataset is None:
      dataset = task.make_dataset(config, existing)
  else:
    if dataset is None:
      dataset = datasets.make_dataset(config.data, config.task,
                                      workdir=init_from.tokenizer_dir(config, existing))
    model_cfg = model_config(config, dataset, platform=platform)
    tasks.check_task(config.task, model_cfg.family)
    _check_init_from_length(config, model_cfg, dataset)
    if model_cfg.vocab_size < dataset.vocab_size:
      raise ValueError(
          f"model.vocab_size={model_cfg.vocab_size} is smaller than the data's vocabulary "
          f"({dataset.vocab_size}); set model.vocab_size=0 to use the data's")
  _check_loop_counts(config.train)
  _check_batches(config, num_devices)
  _check_context(config, model_cfg, num_devices)
  _check_cpu_devices(config)
  # Set once, before any step is traced (jit caches what it traced).
  cpu_fusion.install(one_of("train.cpu_fusion", config.train.cpu_fusion, cpu_fusion.POLICIES))
  optimizer, schedule = make_optimizer(config.optimizer, config.train.num_steps,
                                       getattr(model_cfg, "d_model", None))
  return Experiment(config, model_cfg, dataset, optimizer, schedule)


def execution_summary(experiment: Experiment, platform: str | None = None) -> str:
  """One line saying how the model computes on `platform` (None: this process's): its compute
  dtype and the attention implementation, with the reason when an 'auto' choice is not the
  platform's kernel. The loop prints it at start; config.json holds the same values."""
  cfg, kind = experiment.model_config, platform_kind(platform)
  if experiment.task.own_model:
    return (f"model on {kind}: {type(cfg).__name__} (config.task={experiment.config.task!r}), "
            "params and optimizer state float32")
  impl = cfg.attention_impl
  if impl == AUTO:  # only left 'auto' where an xla-only feature is on (resolve_auto)
    reason = xla_only_attention(cfg.to_flat())
    seq_len = cfg.max_len
    # pylint: disable-next=protected-access  (tfjax.nn.ops' own auto rule, not a copy of it)
    impl = f"{ops._resolve(AUTO, seq_len, seq_len, xla_only=reason is not None)} ({reason})"
  return (f"model on {kind}: compute {cfg.dtype}, params and optimizer state float32; "
          f"attention: {impl}")


def _check_cpu_devices(config) -> None:
  wanted = sharding.cpu_device_count(config)
  user_set = sharding.HOST_DEVICES_FLAG in os.environ.get("XLA_FLAGS", "")  # the user's wins
  if wanted and not user_set and jax.default_backend() == "cpu" and (
      jax.local_device_count() != wanted):
    _log.warning("config.mesh.cpu_devices asks for %d CPU devices but JAX has %d: it must be "
                 "applied before JAX starts (experiments/train.py does; elsewhere call "
                 "tfjax.training.parallel.sharding.configure_cpu_devices first or set "
                 "XLA_FLAGS=%s=%d). "
                 "Results are the same up to float rounding, only slower", wanted,
                 jax.local_device_count(), sharding.HOST_DEVICES_FLAG, wanted)


def _check_init_from_length(config, model_cfg: ModelConfig, dataset) -> None:
  """Rows no longer than the learned position table of the init_from run.

  Why here: init_from takes model.max_len from that run (a model.max_len set in this config is
  replaced), so the model's own message ("raise model.max_len") names a fix that does nothing;
  shortening the data is the one that works."""
  source = init_from.source(config)
  if source is None or not positions.has_learned_table(model_cfg):
    return
  lengths = tasks.row_lengths(dataset.train_batch(0, 1), config.task)
  longest = max(n for n in lengths if n is not None)
  if longest <= model_cfg.max_len:
    return
  fix = (f"lower data.seq_len (now {config.data.seq_len}) to {model_cfg.max_len} or less"
         if config.data.name in datasets.TEXT_DATASETS + ("prepared",) and "seq_len" in config.data
         else f"make the data's rows at most {model_cfg.max_len} tokens long")
  raise ValueError(
      f"rows of {longest} tokens exceed the learned position table of config.init_from="
      f"{source!r} (its model.max_len={model_cfg.max_len}; init_from takes every model key from "
      f"that run, so model.max_len cannot be raised here): {fix}")


def _check_context(config, model_cfg: ModelConfig, num_devices: int) -> None:
  """A context axis (the sequence split over devices) only under an attention kind that is
  exact there; any other is refused by name, not left to the SPMD partitioner."""
  context = sharding.mesh_shape(config.mesh, num_devices)[sharding.MESH_AXES.index("context")]
  if context > 1 and not isinstance(model_cfg, ModelConfig):
    raise ValueError(f"mesh.context={context}: config.task={config.task!r} has no "
                     "context-parallel form (its model is not a tfjax.nn.models family); set "
                     "mesh.context=1 (split the batch over data/fsdp instead)")
  if context <= 1 and not isinstance(model_cfg, ModelConfig):
    return
  kind = attention_kinds.attention_kind(model_cfg)
  if context > 1 and not kind.context_parallel:
    usable = sorted(k.name for k in attention_kinds.ATTENTION_KINDS.values()
                    if k.context_parallel)
    raise ValueError(
        f"model.attention_kind={kind.name!r} over mesh.context={context}: its attention mixes "
        f"the whole sequence in its own way and has no context-parallel form (those with one: "
        f"{usable}); set mesh.context=1 (split the batch over data/fsdp instead)")


def _check_loop_counts(train_cfg) -> None:
  for key in ("num_steps", "batch_size", "eval_batch_size", "eval_every", "log_every",
              "checkpoint_every", "steps_per_call"):
    value = train_cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"train.{key}={value!r} must be a positive integer")


def _batch_shards(config, num_devices: int) -> int:
  """Into how many row blocks config's mesh on `num_devices` devices splits a batch."""
  return sharding.batch_shards(sharding.mesh_shape(config.mesh, num_devices),
                               sharding.rules(config))


def _check_batches(config, num_devices: int) -> None:
  """Batches split evenly into micro-batches, and every (micro-)batch over its batch shards."""
  batch, accum = config.train.batch_size, config.optimizer.grad_accum_steps
  if batch % accum:
    raise ValueError(f"train.batch_size={batch} does not divide into optimizer.grad_accum_steps="
                     f"{accum} micro-batches; use a multiple of {accum}")
  sizes = sharding.mesh_shape(config.mesh, num_devices)
  shards = _batch_shards(config, num_devices)
  micro = batch // accum
  per_device = config.train.get("micro_batch_per_device", 0)
  for key, rows, derived in (
      ("train.batch_size / optimizer.grad_accum_steps", micro, "optimizer.grad_accum_steps"),
      ("train.eval_batch_size", config.train.eval_batch_size, "train.eval_batch_size")):
    if rows % shards:
      derive = (f", or {derived}=-1 ({per_device} rows per batch shard: "
                "train.micro_batch_per_device)" if per_device else "")
      raise ValueError(
          f"{key} = {rows} rows do not split over the {shards} batch shards of mesh "
          f"{dict(zip(sharding.MESH_AXES, sizes))} (rules put 'batch' on "
          f"{dict(sharding.rules(config)).get('batch')}); use a multiple of {shards}{derive}")


# ---------------------------------------------------------------------------------------------
# The sharded train state
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StateLayout:
  """The train state's layout on a mesh, known without building the state.

  abstract:  TrainState of ShapeDtypeStructs, each with its sharding: what a checkpoint restores
             into (any mesh, any device count);
  shardings: TrainState of NamedShardings (the jitted steps' in/out shardings);
  init:      () -> the seeded TrainState, created directly in that layout (never whole on one
             device).
  """
  abstract: Any
  shardings: Any
  init: Callable[[], TrainState]


def state_layout(experiment: Experiment, placement: BatchPlacement) -> StateLayout:
  """The StateLayout of `experiment` on `placement.mesh` (traces the init, allocates nothing)."""
  model = build_task_model(experiment)
  args, kwargs = experiment.task.model_inputs(experiment.dataset.train_batch(0, 1))
  optimizer, mesh = experiment.optimizer, placement.mesh

  # Jitted so that the shape queries below and the real init share one trace of the model.
  @jax.jit
  def init_boxed(rng):  # params still wrapped in their logical-axis metadata
    return model.init(rng, *args, **kwargs)["params"]

  @jax.jit
  def init_fn(rng):
    params_rng, train_rng = jax.random.split(rng)
    params = nn.meta.unbox(init_boxed(params_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=train_rng)

  rng = jax.random.PRNGKey(experiment.config.seed)
  param_shardings = sharding.logical_shardings(mesh, jax.eval_shape(init_boxed, rng),
                                               placement.rules)
  # Optimizer moments shaped like params share the params' sharding (ZeRO-3 over fsdp).
  shapes = jax.eval_shape(init_fn, rng)
  shardings = sharding.follow_params(shapes, param_shardings, placement.replicated())
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          shapes, shardings)

  def init() -> TrainState:  # out_shardings alone place the state: no mesh context is needed
    return workarounds.call_once(jax.jit(init_fn, out_shardings=shardings), rng)

  return StateLayout(abstract, shardings, init)


# ---------------------------------------------------------------------------------------------
# The jitted steps
# ---------------------------------------------------------------------------------------------
def _train_step(experiment: Experiment, placement: BatchPlacement) -> Callable:
  """The (unjitted) train step of this experiment on `placement.mesh`."""
  config = experiment.config
  train_model = build_task_model(experiment, deterministic=False)
  sum_over_shards = None
  # A loss whose rows depend on each other (CLIP's negatives) cannot be summed per shard.
  if experiment.task.rows_independent and cpu_fusion.flat_all_reduce_applies(
      placement.mesh, experiment.model_config):
    sum_over_shards = functools.partial(cpu_fusion.summed_over_shards, mesh=placement.mesh,
                                        batch_spec=placement.sharding.spec)
  return steps.make_train_step(train_model, experiment.optimizer, experiment.schedule,
                               config.task, config.train.label_smoothing,
                               config.optimizer.grad_accum_steps, sum_over_shards)


def jit_train_step(experiment: Experiment, placement: BatchPlacement, state_shardings):
  """(state, batch) -> (state, metrics), jitted with its shardings; donates the state. Call it
  (and the other jitted steps) inside `placement.axis_rules()` so activation constraints apply."""
  return jax.jit(_train_step(experiment, placement),
                 in_shardings=(state_shardings, placement.sharding),
                 out_shardings=(state_shardings, placement.replicated()), donate_argnums=(0,))


def jit_multi_step(experiment: Experiment, placement: BatchPlacement, state_shardings):
  """steps.make_multi_step of the train step, jitted: (state, batches [K, B, ...] from
  placement.put_stacked, np.int32 num_steps) -> (state, the last step's metrics)."""
  return jax.jit(steps.make_multi_step(_train_step(experiment, placement)),
                 in_shardings=(state_shardings, placement.stacked_sharding,
                               placement.replicated()),
                 out_shardings=(state_shardings, placement.replicated()), donate_argnums=(0,))


def jit_eval_step(experiment: Experiment, placement: BatchPlacement, state_shardings):
  """(params, batch) -> summed eval statistics (steps.make_eval_step), jitted."""
  return jax.jit(steps.make_eval_step(build_task_model(experiment), experiment.config.task),
                 in_shardings=(state_shardings.params, placement.sharding),
                 out_shardings=placement.replicated())


def stack_batches(batches: list[dict], size: int) -> dict:
  """[batch dicts] -> one dict of [size, B, ...] arrays; rows past len(batches) are zeros (the
  multi-step never reads them: its step count says how many are real)."""
  def stacked(key):
    leaves = [np.asarray(b[key]) for b in batches]
    return np.stack(leaves + [np.zeros_like(leaves[0])] * (size - len(leaves)))
  return {key: stacked(key) for key in batches[0]}


@dataclasses.dataclass(frozen=True)
class StepRunner:
  """Runs the next training steps on the iterator's next batches: `run(state, n)` -> (state, the
  last step's metrics). `program` is the jitted function it calls and `abstract_args` that
  program's arguments as shapes with shardings, to compile it ahead of the first call.

  train.steps_per_call = 1: one train-step call per batch; K > 1: one multi-step call on K
  stacked batches. The training loop and the benchmarks both step through it.

  `prefetch(n)` prepares the batches of the next `run(state, n)` and starts their copy to the
  devices now (the loop calls it right after dispatching a call, so the host builds and copies
  batch k+1 while step k runs); `data_state()` is the iterator state after the batches `run`
  consumed, not counting a prefetched one: what a checkpoint must save for an exact resume."""
  run: Callable[[TrainState, int], tuple[TrainState, dict]]
  program: Any
  abstract_args: tuple
  prefetch: Callable[[int], None] = lambda num_steps: None
  data_state: Callable[[], dict] | None = None


class _Prefetched:
  """At most one call's batches, placed on the devices ahead of the call that consumes them."""

  def __init__(self, iterator: datasets.DataIterator, make: Callable[[int], Any]):
    self._iterator, self._make = iterator, make
    self._ahead = None  # (num_steps, placed batches, iterator state before them)

  def prefetch(self, num_steps: int) -> None:
    if self._ahead is None:
      before = self._iterator.state()
      self._ahead = (num_steps, self._make(num_steps), before)

  def take(self, num_steps: int):
    """The placed batches of the next `num_steps` steps: the prefetched ones, else made now."""
    ahead, self._ahead = self._ahead, None
    if ahead is not None and ahead[0] == num_steps:
      return ahead[1]
    if ahead is not None:  # prefetched for another step count: give its batches back
      self._iterator.restore(ahead[2])
    return self._make(num_steps)

  def data_state(self) -> dict:
    return self._iterator.state() if self._ahead is None else self._ahead[2]


def make_step_runner(experiment: Experiment, placement: BatchPlacement, layout: StateLayout,
                     iterator: datasets.DataIterator) -> StepRunner:
  train_cfg = experiment.config.train
  per_call = train_cfg.steps_per_call
  one_row = experiment.dataset.train_batch(0, 1)

  if per_call == 1:
    train_step = jit_train_step(experiment, placement, layout.shardings)
    ahead = _Prefetched(iterator, lambda num_steps: placement.put(iterator.next()))

    def run_one(state, num_steps):
      assert num_steps == 1, num_steps
      return train_step(state, ahead.take(1))
    return StepRunner(run_one, train_step,
                      (layout.abstract, placement.abstract(one_row, train_cfg.batch_size)),
                      ahead.prefetch, ahead.data_state)

  multi_step = jit_multi_step(experiment, placement, layout.shardings)

  def stacked(num_steps):
    batches = stack_batches([iterator.next() for _ in range(num_steps)], per_call)
    return placement.put_stacked(batches)
  ahead = _Prefetched(iterator, stacked)

  def run_stacked(state, num_steps):
    return multi_step(state, ahead.take(num_steps), np.int32(num_steps))
  return StepRunner(run_stacked, multi_step, (
      layout.abstract, placement.abstract(one_row, train_cfg.batch_size, stacked=per_call),
      jax.ShapeDtypeStruct((), jnp.int32)), ahead.prefetch, ahead.data_state)
