"""tfjax/runtime/workarounds.py: startup and runtime workarounds (host lead limiter, background
compiles)."""

import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tfjax.training.loop import experiment, train
from run_helpers import REPO, tiny_config



_QUEUED_STEPS = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tfjax.runtime.workarounds import HostLeadLimiter
mesh = Mesh(np.array(jax.devices()), ("data",))
replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

def step(w, x):  # data-parallel gradient step: one all-reduce
  loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
  return w - 0.01 * grad, loss

step = jax.jit(step, in_shardings=(replicated, rows), out_shardings=(replicated, replicated),
               donate_argnums=0)
w = jax.device_put(jnp.full((512, 512), 0.01), replicated)
x = jax.device_put(jnp.ones((64, 512)), rows)
host_lead = HostLeadLimiter()
for _ in range(600):
  w, loss = step(w, x)
  host_lead.wait_if_ahead(loss)
print("done", float(loss))
"""


def test_host_lead_limiter_keeps_two_cpu_devices_from_deadlocking():
  """Regression: with 2 XLA:CPU devices (jax 0.10.2), 25-75 steps queued without a host sync
  deadlock the all-reduce (XLA aborts after 40 s); this loop queues 600 unless limited."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  run = subprocess.run([sys.executable, "-c", _QUEUED_STEPS], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=240)
  assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


@pytest.mark.parametrize("per_call,program", [(1, "train_step"), (2, "multi_step")])
def test_steps_compile_once_in_background_and_serve_the_first_calls(tmp_path, caplog, per_call,
                                                                     program):
  """runtime.compiling_in_background compiles the train and eval steps from shapes alone while the
  state initializes; the first calls must reuse those programs (same shapes, shardings and axis
  rules), not compile second ones. Eval batches compile once per distinct shape."""
  config = tiny_config(num_steps=4, eval_at_start=True, steps_per_call=per_call, log_every=2)
  previous = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)
  try:
    with caplog.at_level(logging.WARNING):
      train.train_and_evaluate(config, str(tmp_path / "run"))
  finally:
    jax.config.update("jax_log_compiles", previous)
  messages = [r.getMessage() for r in caplog.records]
  compiles = [m for m in messages if "XLA compilation of jit(" in m and "_step)" in m
              and "eval_step" not in m]
  assert len(compiles) == 1 and f"jit({program})" in compiles[0], compiles
  eval_shapes = {tuple(sorted((k, np.shape(v)) for k, v in batch.items()))
                 for _, batch in experiment.prepare(config).dataset.eval_batches(
                     config.train.eval_batch_size, config.train.eval_batches)}
  eval_compiles = [m for m in messages if "XLA compilation of jit(eval_step)" in m]
  assert len(eval_compiles) == len(eval_shapes) >= 2, (eval_compiles, eval_shapes)
