"""Helpers shared by the training-system tests: a tiny config, metrics readers, a one-device
placement and the train CLI in a child process."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from tfjax.training.parallel import sharding
from tfjax.training.config.defaults import base_config


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(num_steps=8, **train_overrides):
  """A 1-layer decoder on the synthetic copy task: compiles and steps in seconds."""
  config = base_config()
  config.data.update(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(4, 8),
                     num_symbols=8)
  config.model.update(family="decoder", vocab_size=0, d_model=32, num_layers=1, num_heads=2,
                      d_ff=64, position="rope", max_len=64)
  config.optimizer.update(lr=3e-3, warmup_steps=2, min_lr=1e-4)
  config.train.update(num_steps=num_steps, batch_size=8, eval_batch_size=8, eval_batches=1,
                      eval_every=4, log_every=1, checkpoint_every=4, eval_at_start=False)
  config.train.update(**train_overrides)
  return config


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def train_losses(workdir):
  return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


def one_device_placement(config):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  return sharding.BatchPlacement.create(mesh, sharding.rules(config))


def run_cli(args, cwd, timeout=120, **env_vars):
  # The compilation cache goes under the test's directory, not the user's ~/.cache.
  env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(cwd / "cache"), **env_vars)
  return subprocess.run([sys.executable, os.path.join(REPO, "experiments", "train.py"), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def run_in_cpu_only_process(test_file: str, name: str, *args, timeout: float = 900):
  """Runs function `name(*args)` of the test module `test_file` in a new Python started with
  JAX_PLATFORMS=cpu (the CUDA plugin describes compile-only GPUs only when JAX has not opened the
  cuda backend); fails with the child's stderr."""
  code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', "
          f"{os.path.abspath(test_file)!r}); m = importlib.util.module_from_spec(spec); "
          f"spec.loader.exec_module(m); m.{name}(*{args!r})")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
                              [REPO, os.path.dirname(os.path.abspath(__file__))])),  # + tests/
                          timeout=timeout)
  assert result.returncode == 0, result.stderr[-4000:]
