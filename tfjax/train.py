"""Training and evaluation: state, the jitted steps, and the loop around them.

The step is `jax.jit` with in/out shardings over the device mesh (pjit in today's JAX); the state is
initialized already sharded. Resuming is exact: batch k is a pure function of (seed, k), dropout
keys are fold_in(rng, step), and checkpoints hold params, optimizer state, step, rng and the data
position.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfjax import checkpoint, compile_cache, cpu_fusion, data, decode, metrics, sharding, tasks
from tfjax import params as param_accounting
from tfjax.config import ModelConfig
from tfjax.models import build_model
from tfjax.optimizer import make_optimizer

_log = logging.getLogger(__name__)


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


# ---------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------
def make_train_step(model, optimizer, schedule, task: str, label_smoothing: float,
                    grad_accum_steps: int, sum_over_shards=None):
  """state, batch -> state, metrics. With k micro-batches, gradients of the summed loss are added
  up under lax.scan and divided once by the total weight, so k steps of B/k equal one step of B.
  `sum_over_shards` (cpu_fusion.summed_over_shards) optionally wraps the gradient sums."""

  def summed_loss(params, batch, rng):
    stats = tasks.forward(model, params, batch, task, label_smoothing, rngs={"dropout": rng})
    return stats["loss_sum"], _scalars(stats)

  grad_fn = jax.grad(summed_loss, has_aux=True)

  def summed_gradients(params, batch, rng):
    """(gradient of the summed loss, summed loss/weight/correct counts) over `batch`."""
    if grad_accum_steps == 1:
      return grad_fn(params, batch, rng)
    micro = jax.tree.map(
        lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]),
        batch)

    def accumulate(carry, inputs):
      index, micro_batch = inputs
      sums = grad_fn(params, micro_batch, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, sums), None

    zeros = jax.tree.map(jnp.zeros_like, (params, jax.eval_shape(
        summed_loss, params, jax.tree.map(lambda x: x[0], micro), rng)[1]))
    sums, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
    return sums

  if sum_over_shards is not None:
    summed_gradients = sum_over_shards(summed_gradients)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, stats = summed_gradients(state.params, batch, rng)
    weight = jnp.maximum(stats["weight_sum"], 1.0)
    grads = jax.tree.map(lambda g: g / weight, grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1,
                              params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state)
    out = {"train/loss": stats["loss_sum"] / weight,
           "train/accuracy": stats["correct_sum"] / weight,
           "train/grad_norm": optax.global_norm(grads), "train/lr": schedule(state.step)}
    return new_state, out

  return train_step


def make_multi_step(train_step):
  """(state, batches, num_steps) -> (state after `num_steps` steps, the last step's metrics).

  `batches` stacks K batches ([K, B, ...] leaves); a lax.fori_loop runs `train_step` on the first
  `num_steps` <= K of them inside one program. Why: on nanoGPT's CPU recipe a call per step costs
  ~1.8 ms of dispatch and device synchronization on top of the ~30 ms step, and a host-to-device
  copy per batch another ~1.1 ms (docs/benchmarks.md); one call and one copy per K steps removes
  both. The step math is the same; `num_steps` is traced, so one program serves every count."""

  # Why jit: the metrics' shapes come from tracing the step once (eval_shape), and a jitted
  # function keeps that trace, so the loop body reuses it instead of tracing the model again.
  train_step = jax.jit(train_step)

  def multi_step(state, batches, num_steps):
    def one_step(i, carry):
      batch = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), batches)
      return train_step(carry[0], batch)

    first_batch = jax.tree.map(lambda x: x[0], batches)
    metric_shapes = jax.eval_shape(train_step, state, first_batch)[1]
    no_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    return jax.lax.fori_loop(0, num_steps, one_step, (state, no_metrics))

  return multi_step


def _scalars(stats):
  return {k: v for k, v in stats.items() if k in ("loss_sum", "weight_sum", "correct_sum")}


def make_eval_step(model, task: str):
  def eval_step(params, batch):
    stats = tasks.forward(model, params, batch, task)
    return {"loss_sum": stats["loss_sum"], "weight_sum": stats["weight_sum"],
            "correct_sum": stats["correct_sum"],
            "exact_sum": jnp.sum(stats["row_correct"]), "row_sum": jnp.sum(stats["row_count"])}
  return eval_step


def evaluate(eval_step, params, eval_batches) -> dict:
  """Loss, perplexity, accuracy over all groups; exact_match@L per synthetic test length.

  `eval_batches`: [(group name, batch already on the devices)]; the eval set is fixed, so it is
  placed once per run rather than copied from the host at every evaluation."""
  totals, out = {}, {}
  for name, batch in eval_batches:
    stats = jax.device_get(eval_step(params, batch))
    group = totals.setdefault(name, {k: 0.0 for k in stats})
    for key, value in stats.items():
      group[key] += float(value)
  overall = {k: sum(g[k] for g in totals.values()) for k in ("loss_sum", "weight_sum",
                                                             "correct_sum")}
  loss = overall["loss_sum"] / max(overall["weight_sum"], 1.0)
  out["eval/loss"] = loss
  out["eval/perplexity"] = float(np.exp(min(loss, 50.0)))
  out["eval/accuracy"] = overall["correct_sum"] / max(overall["weight_sum"], 1.0)
  for name, group in totals.items():
    if name.startswith("len_"):
      out[f"eval/exact_match@{name[4:]}"] = group["exact_sum"] / max(group["row_sum"], 1.0)
  return out


# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Experiment:
  """Everything the loop needs, built and validated before the workdir is touched."""
  config: Any
  model_config: ModelConfig
  dataset: Any
  optimizer: Any
  schedule: Any


def prepare(config, workdir: str | None = None) -> Experiment:
  """Validates the whole config and builds the data; raises ValueError naming any bad key."""
  # An existing workdir keeps its tokenizer (resume); a new one is written only after validation.
  existing = workdir if workdir and os.path.isdir(workdir) else None
  dataset = data.make_dataset(config.data, config.task, workdir=existing)
  model_cfg = dict(config.model)
  if model_cfg["vocab_size"] in (0, None):  # 0 = take the vocabulary size from the data
    model_cfg["vocab_size"] = dataset.vocab_size
  model_config = ModelConfig.from_config(model_cfg)
  tasks.check_task(config.task, model_config.family)
  if model_config.vocab_size < dataset.vocab_size:
    raise ValueError(
        f"model.vocab_size={model_config.vocab_size} is smaller than the data's vocabulary "
        f"({dataset.vocab_size}); set model.vocab_size=0 to use the data's")
  _check_loop_counts(config.train)
  _check_batches(config)
  _check_cpu_devices(config)
  optimizer, schedule = make_optimizer(config.optimizer, config.train.num_steps,
                                       model_config.d_model)
  return Experiment(config, model_config, dataset, optimizer, schedule)


def _check_cpu_devices(config) -> None:
  wanted = sharding.cpu_device_count(config)
  user_set = sharding.HOST_DEVICES_FLAG in os.environ.get("XLA_FLAGS", "")  # the user's wins
  if wanted and not user_set and jax.default_backend() == "cpu" and (
      jax.local_device_count() != wanted):
    _log.warning("config.mesh.cpu_devices asks for %d CPU devices but JAX has %d: it must be "
                 "applied before JAX starts (experiments/train.py does; elsewhere call "
                 "tfjax.sharding.configure_cpu_devices first or set XLA_FLAGS=%s=%d). Results "
                 "are the same up to float rounding, only slower", wanted, jax.local_device_count(),
                 sharding.HOST_DEVICES_FLAG, wanted)


def _check_loop_counts(train_cfg) -> None:
  for key in ("num_steps", "batch_size", "eval_batch_size", "eval_every", "log_every",
              "checkpoint_every", "steps_per_call"):
    value = train_cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"train.{key}={value!r} must be a positive integer")


def _check_batches(config) -> None:
  """Batches split evenly into micro-batches, and every (micro-)batch over its batch shards."""
  batch, accum = config.train.batch_size, config.optimizer.grad_accum_steps
  if batch % accum:
    raise ValueError(f"train.batch_size={batch} does not divide into optimizer.grad_accum_steps="
                     f"{accum} micro-batches; use a multiple of {accum}")
  sizes = sharding.mesh_shape(config.mesh, jax.device_count())
  shards = sharding.batch_shards(sizes, sharding.rules(config))
  micro = batch // accum
  for key, rows in (("train.batch_size / optimizer.grad_accum_steps", micro),
                    ("train.eval_batch_size", config.train.eval_batch_size)):
    if rows % shards:
      raise ValueError(
          f"{key} = {rows} rows do not split over the {shards} batch shards of mesh "
          f"{dict(zip(sharding.MESH_AXES, sizes))} (rules put 'batch' on "
          f"{dict(sharding.rules(config)).get('batch')}); use a multiple of {shards}")


def _state_builder(exp: Experiment, mesh, rules):
  """(make_state() -> the seeded TrainState in its sharded layout, its ShapeDtypeStructs with
  their shardings, the shardings), without building it."""
  model = build_model(exp.model_config)
  args, kwargs = _model_inputs(exp.dataset.train_batch(0, 1), exp.config.task)

  # Jitted so that the shape queries below and the real init share one trace of the model.
  @jax.jit
  def init_boxed(rng):  # params still wrapped in their logical-axis metadata
    return model.init(rng, *args, **kwargs)["params"]

  @jax.jit
  def init_fn(rng):
    params_rng, train_rng = jax.random.split(rng)
    params = nn.meta.unbox(init_boxed(params_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=exp.optimizer.init(params), rng=train_rng)

  rng = jax.random.PRNGKey(exp.config.seed)
  param_shardings = sharding.logical_shardings(mesh, jax.eval_shape(init_boxed, rng), rules)
  # Optimizer moments shaped like params share the params' sharding (ZeRO-3 over fsdp).
  shapes = jax.eval_shape(init_fn, rng)
  state_shardings = sharding.follow_params(shapes, param_shardings, sharding.replicated(mesh))
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          shapes, state_shardings)

  def make_state():  # out_shardings alone place the state: no mesh context is needed for init
    init = jax.jit(init_fn, out_shardings=state_shardings)
    if jax.default_backend() != "cpu":
      return init(rng)
    # Why: this program is one random draw per parameter; XLA:CPU takes ~1.9 s to compile it for
    # nanoGPT's CPU recipe and milliseconds to run it. Unoptimized it compiles in ~1.1 s and
    # draws the same values to float rounding (max |difference| 7e-9 there).
    return init.lower(rng).compile(compile_cache.UNOPTIMIZED)(rng)

  return make_state, abstract, state_shardings


def init_state(exp: Experiment, mesh, rules):
  """TrainState created directly in its sharded layout (never whole on one device)."""
  make_state, _, state_shardings = _state_builder(exp, mesh, rules)
  return make_state(), state_shardings


def abstract_state(exp: Experiment, mesh, rules):
  """ShapeDtypeStructs of the TrainState, each with its sharding on `mesh`: what a checkpoint
  restores into (any mesh, any device count), without materializing a state."""
  return _state_builder(exp, mesh, rules)[1]


def _model_inputs(batch, task):
  """(args, kwargs) for model.init from a sample batch."""
  if task == "seq2seq":
    return (batch["encoder_inputs"], batch["decoder_inputs"]), {}
  kwargs = {"segment_ids": batch.get("segment_ids")}
  if task in ("mlm", "classification"):
    kwargs["token_type_ids"] = batch.get("token_type_ids")
  else:
    kwargs["positions"] = batch.get("positions")
  return (batch["inputs"],), kwargs


def _train_step(exp: Experiment, mesh, rules):
  """The (unjitted) train step of this experiment on `mesh`."""
  config = exp.config
  train_model = build_model(exp.model_config.replace(deterministic=False))
  sum_over_shards = None
  if cpu_fusion.flat_all_reduce_applies(mesh, exp.model_config):
    sum_over_shards = functools.partial(cpu_fusion.summed_over_shards, mesh=mesh,
                                        batch_spec=sharding.batch_sharding(mesh, rules).spec)
  return make_train_step(train_model, exp.optimizer, exp.schedule, config.task,
                         config.train.label_smoothing, config.optimizer.grad_accum_steps,
                         sum_over_shards)


def jit_steps(exp: Experiment, mesh, rules, state_shardings):
  """(train_step, eval_step) jitted with their in/out shardings; the train step donates the
  state. Call them inside `sharding.axis_rules(mesh, rules)` so activation constraints apply."""
  batch_shardings = sharding.batch_sharding(mesh, rules)  # one sharding for every batch leaf
  train_step = jax.jit(_train_step(exp, mesh, rules),
                       in_shardings=(state_shardings, batch_shardings),
                       out_shardings=(state_shardings, sharding.replicated(mesh)),
                       donate_argnums=(0,))
  eval_step = jax.jit(make_eval_step(build_model(exp.model_config), exp.config.task),
                      in_shardings=(state_shardings.params, batch_shardings),
                      out_shardings=sharding.replicated(mesh))
  return train_step, eval_step


def jit_multi_step(exp: Experiment, mesh, rules, state_shardings):
  """make_multi_step of this experiment's train step, jitted: (state, batches [K, B, ...] from
  global_batch_putter(..., stacked=True), np.int32 num_steps) -> (state, last metrics)."""
  return jax.jit(make_multi_step(_train_step(exp, mesh, rules)),
                 in_shardings=(state_shardings, stacked_batch_sharding(mesh, rules),
                               sharding.replicated(mesh)),
                 out_shardings=(state_shardings, sharding.replicated(mesh)), donate_argnums=(0,))


def stacked_batch_sharding(mesh, rules):
  """K stacked batches [K, B, ...]: rows split as in a batch, the stacking axis on every device."""
  spec = sharding.batch_sharding(mesh, rules).spec
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, *spec))


def global_batch_putter(mesh, rules, stacked: bool = False):
  """Host batch (this process's rows) -> global jax.Array sharded over the data axes.
  `stacked`: the leaves are K batches [K, rows, ...] (jit_multi_step's input)."""
  batch_sharding = sharding.batch_sharding(mesh, rules)
  target = stacked_batch_sharding(mesh, rules) if stacked else batch_sharding
  row_axis = 1 if stacked else 0

  def put(local_batch):
    def one(x):
      x = np.asarray(x)
      if jax.process_count() == 1:
        return jax.device_put(x, target)
      rows = sharding.global_rows(batch_sharding, x.shape[row_axis])
      global_shape = x.shape[:row_axis] + (rows,) + x.shape[row_axis + 1:]
      return jax.make_array_from_process_local_data(target, x, global_shape)
    return {k: one(v) for k, v in local_batch.items()}

  return put


def stack_batches(batches, size: int):
  """[batch dicts] -> one dict of [size, B, ...] arrays; rows past len(batches) are zeros (the
  multi-step never reads them: its step count says how many are real)."""
  def stacked(key):
    leaves = [np.asarray(b[key]) for b in batches]
    return np.stack(leaves + [np.zeros_like(leaves[0])] * (size - len(leaves)))
  return {key: stacked(key) for key in batches[0]}


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
class StepPacer:
  """Keeps the host at most `ahead` steps in front of the devices: call it with each step's
  (not donated) metrics.

  Why: with several XLA:CPU devices (config.mesh.cpu_devices) the gradient all-reduce deadlocks
  once the host has queued a few dozen steps (jax 0.10.2, 2 devices: a hang, then an abort after
  40 s, past ~25-75 queued steps; tests/test_train.py reproduces it). One step of lead is all
  the host needs to keep the devices busy, so waiting on the step `ahead` back costs nothing.
  """

  def __init__(self, ahead: int = 4):
    self._ahead = ahead
    self._pending = collections.deque()

  def __call__(self, step_metrics):
    self._pending.append(step_metrics)
    if len(self._pending) > self._ahead:
      jax.block_until_ready(self._pending.popleft())


@contextlib.contextmanager
def _compiling_in_background(jobs, mesh, rules):
  """Compiles each (jitted fn, abstract args) of `jobs` on its own thread; yields their futures.
  On exit, also when the run fails, it waits for every compile to end: none outlives the run
  (a leftover one would go on using the CPU, and logging, during whatever the caller does next).

  Why: a run compiles its state init, train step, eval step and greedy sampler (~1.1, ~2.8, ~0.5
  and ~1.2 s for nanoGPT's CPU recipe, each alone). The train and eval steps need only shapes and
  shardings, so they compile while this thread initializes (or restores) the state and runs the
  step-0 evaluation and sample; the jitted functions' caches then serve the real calls. One XLA
  compile already keeps ~1.5 cores busy, so on 2 cores this saves little (docs/benchmarks.md).
  A resumed run restores instead of initializing (no init compile) while the steps compile."""

  def compile_(fn, args):
    with sharding.axis_rules(mesh, rules):  # thread-local: enter them on this thread too
      fn.lower(*args).compile()

  with concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="tfjax-compile") as pool:
    yield [pool.submit(compile_, fn, args) for fn, args in jobs]


class _StopRequested:
  """SIGTERM/SIGINT set a flag; the loop saves a checkpoint at the next step boundary and exits."""

  def __init__(self):
    self.signum = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. tests running the loop in a thread)
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.signum = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def train_and_evaluate(config, workdir: str, *, stop_after_step: int | None = None) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns the last metrics.

  `stop_after_step` behaves like a SIGTERM arriving during that step (checkpoint, then return): it
  is how tests and the sweep launcher interrupt a run deterministically.
  """
  exp = prepare(config, workdir)  # everything validated before anything is written
  _prepare_workdir(workdir, config, exp)
  tokenizer = getattr(exp.dataset, "tokenizer", None)
  if tokenizer is not None and jax.process_index() == 0:
    tokenizer.save(workdir)  # generate.py and resumed runs read it back
  train_cfg = config.train
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules(config)
  _log.info("mesh %s over %d %s devices", dict(mesh.shape), mesh.size, jax.default_backend())
  make_state, abstract, state_shardings = _state_builder(exp, mesh, rules)
  _, eval_step = jit_steps(exp, mesh, rules, state_shardings)
  put = global_batch_putter(mesh, rules)
  batch_shardings = sharding.batch_sharding(mesh, rules)  # one sharding for every batch leaf
  eval_rows = sharding.process_rows(batch_shardings, train_cfg.eval_batch_size)
  eval_batches = [(name, put(batch)) for name, batch in exp.dataset.eval_batches(
      train_cfg.eval_batch_size, train_cfg.eval_batches, row_start=eval_rows[0],
      row_count=eval_rows[1])]
  ckpt = checkpoint.Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  row_start, row_count = sharding.process_rows(batch_shardings, train_cfg.batch_size)
  iterator = data.DataIterator(exp.dataset, train_cfg.batch_size, row_start=row_start,
                               row_count=row_count)

  advance, train_program, train_args = make_advancer(exp, mesh, rules, abstract,
                                                     state_shardings, iterator)
  # One eval batch per distinct shape (synthetic tasks have one per test length).
  eval_shapes = {tuple((k, v.shape, v.dtype) for k, v in b.items()): b for _, b in eval_batches}
  jobs = [(train_program, train_args)] + [(eval_step, (abstract.params, b))
                                         for b in eval_shapes.values()]
  with _compiling_in_background(jobs, mesh, rules) as (compiling_train, *compiling_eval):
    restored = ckpt.restore_latest(abstract)
    if restored is None:
      state = make_state()
    else:
      step, state, data_state = restored
      iterator.restore(data_state)
      _log.info("resumed from step %d in %s", step, workdir)

    tokens_per_step = train_cfg.batch_size * _sequence_length(exp.dataset.train_batch(0, 1),
                                                              config.task)
    flops_per_token = param_accounting.flops_per_token(exp.model_config, tokens_per_step //
                                                       train_cfg.batch_size)
    peak = param_accounting.peak_flops(train_cfg.peak_flops)

    start_step = int(jax.device_get(state.step))
    writer = metrics.MetricsWriter(workdir, train_cfg.num_steps, start_step)
    config_json = json.loads(config.to_json_best_effort())
    timer, last, pace = metrics.Timer(), {}, StepPacer()
    sampler = (_GreedySampler(exp, mesh) if config.task == "lm"
               and train_cfg.sample_tokens > 0
               and getattr(exp.dataset, "tokenizer", None) is not None else None)
    with sharding.axis_rules(mesh, rules), _StopRequested() as stop, (
        sampler or contextlib.nullcontext()):
      for future in compiling_eval:  # each is done before its function is first called (a call
        future.result()               # meanwhile would compile again); re-raises compile errors
      if start_step == 0 and train_cfg.eval_at_start:
        last.update(_eval_and_sample(eval_step, state, eval_batches, writer, 0, sampler))
      compiling_train.result()
      step = start_step
      while step < train_cfg.num_steps:
        num_steps = _steps_this_call(step, train_cfg, stop_after_step)
        state, step_metrics = advance(state, num_steps)
        pace(step_metrics)
        step += num_steps
        timer.steps += num_steps
        if step % train_cfg.log_every == 0 or step == train_cfg.num_steps:
          logged = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
          rate = timer.rate(tokens_per_step)
          logged["train/tokens_per_sec"] = rate
          if peak:
            logged["train/mfu"] = rate * flops_per_token / (peak * jax.device_count())
          writer.write(step, logged)
          writer.progress(step, logged["train/loss"], logged["train/lr"], rate)
          timer.reset()
          last.update(logged)
        if step % train_cfg.eval_every == 0 or step == train_cfg.num_steps:
          last.update(_eval_and_sample(eval_step, state, eval_batches, writer, step, sampler))
          timer.reset()
        if stop_after_step is not None and step >= stop_after_step:
          stop.signum = stop.signum or signal.SIGTERM
        if (step % train_cfg.checkpoint_every == 0 or step == train_cfg.num_steps
            or stop.signum is not None):
          ckpt.save(step, state, iterator.state(), config_json, force=stop.signum is not None)
        if stop.signum is not None:
          _log.warning("signal %d: checkpoint saved at step %d, exiting", stop.signum, step)
          break
    ckpt.wait()
    ckpt.close()
    writer.close()
  return last


def make_advancer(exp: Experiment, mesh, rules, abstract, state_shardings, iterator):
  """(advance(state, n) -> (state, last metrics) after n steps on the iterator's next n batches,
  the jitted program it calls, that program's abstract arguments for compiling ahead).
  train.steps_per_call = 1: one train_step call per batch; K > 1: jit_multi_step on K batches.
  The training loop and experiments/bench_train.py both advance through it."""
  train_cfg = exp.config.train
  per_call = train_cfg.steps_per_call
  one_row = exp.dataset.train_batch(0, 1)

  def batch_shapes(*stacking):
    where = (stacked_batch_sharding(mesh, rules) if stacking
             else sharding.batch_sharding(mesh, rules))
    return {k: jax.ShapeDtypeStruct(stacking + (train_cfg.batch_size,) + v.shape[1:], v.dtype,
                                    sharding=where) for k, v in one_row.items()}

  if per_call == 1:
    train_step, _ = jit_steps(exp, mesh, rules, state_shardings)
    put = global_batch_putter(mesh, rules)

    def advance(state, num_steps):
      assert num_steps == 1, num_steps
      return train_step(state, put(iterator.next()))
    return advance, train_step, (abstract, batch_shapes())

  multi_step = jit_multi_step(exp, mesh, rules, state_shardings)
  put_stacked = global_batch_putter(mesh, rules, stacked=True)

  def advance(state, num_steps):
    batches = stack_batches([iterator.next() for _ in range(num_steps)], per_call)
    return multi_step(state, put_stacked(batches), np.int32(num_steps))
  num_steps_shape = jax.ShapeDtypeStruct((), jnp.int32)
  return advance, multi_step, (abstract, batch_shapes(per_call), num_steps_shape)


def _steps_this_call(step: int, train_cfg, stop_after_step: int | None) -> int:
  """Steps the next call runs: up to train.steps_per_call, ending at the next step that logs,
  evaluates, checkpoints or stops, so those happen at the same steps whatever steps_per_call is."""
  ends = [train_cfg.num_steps] + [step + every - step % every for every in (
      train_cfg.log_every, train_cfg.eval_every, train_cfg.checkpoint_every)]
  if stop_after_step is not None:
    ends.append(max(stop_after_step, step + 1))
  return max(1, min(min(ends) - step, train_cfg.steps_per_call))


def _eval_and_sample(eval_step, state, eval_batches, writer, step, sampler):
  out = evaluate(eval_step, state.params, eval_batches)
  writer.write(step, out)
  if sampler is not None:
    writer.text(step, "sample", sampler.sample(state.params))
  return out


class _GreedySampler:
  """A text LM run's short greedy continuation of train.sample_prompt, for each evaluation.

  Decoding runs on a thread of its own, so outside the training mesh: one device and no sharded
  helper programs (~0.25 s less compile per run on nanoGPT's CPU recipe). Its program compiles
  at the first sample, unoptimized on CPU (decode.generate's fast_compile). Use as a context
  manager: on exit it waits for the thread (none outlives the run).
  """

  def __init__(self, exp: Experiment, mesh):
    self._exp, self._mesh = exp, mesh
    self._prompt = exp.config.train.sample_prompt or ""
    ids = exp.dataset.tokenizer.encode(self._prompt) if self._prompt else [0]
    limit = (exp.model_config.max_len - len(ids) if exp.model_config.position == "learned"
             else None)
    tokens = exp.config.train.sample_tokens
    self._prompt_ids = [list(ids)]
    self._settings = dict(max_new_tokens=tokens if limit is None else min(tokens, limit),
                          strategy="greedy", fast_compile=jax.default_backend() == "cpu")
    self._gather = None  # multi-process: a program that replicates the params on every device
    self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfjax-sample")

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._thread.shutdown(wait=True)

  def sample(self, params) -> str:
    """The continuation under `params` (the training state's, any sharding)."""
    if jax.process_count() > 1:  # device_get needs every shard addressable from this process
      if self._gather is None:
        self._gather = jax.jit(lambda p: p, out_shardings=sharding.replicated(self._mesh))
      params = self._gather(params)
    out = self._thread.submit(decode.generate, self._exp.model_config, jax.device_get(params),
                              self._prompt_ids, **self._settings).result()
    ids = np.asarray(out.tokens[0][:out.lengths[0]]).tolist()
    return self._prompt + self._exp.dataset.tokenizer.decode(ids)


def _sequence_length(batch, task):
  key = "decoder_inputs" if task == "seq2seq" else "inputs"
  return int(np.asarray(batch[key]).shape[1])


def _prepare_workdir(workdir: str, config, exp: Experiment) -> None:
  """Creates the workdir, or checks that an existing run there is the same model."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  current = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      previous = json.load(f)
    if previous.get("model") != current.get("model") or previous.get("task") != current.get(
        "task"):
      raise ValueError(
          f"{workdir} holds a run with a different model or task (see {path}); resuming would "
          "mix them. Use a new --workdir, or restore the original config.")
  if jax.process_index() != 0:
    return  # one writer on a shared filesystem
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(current, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
