"""Trains the registry matrix in ONE process and prints one JSON line (last on stdout).

  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
      python tests/registry_matrix_helper.py

Started as a subprocess by tests/test_registry_matrix.py. The cells come from the registries, not
from a list here:
  attention cells   every registered attention kind (tfjax.nn.attention_kinds.ATTENTION_KINDS) x
                    every model family (tfjax.nn.config.FAMILIES) whose tiny config the library
                    accepts (experiment.prepare; a ValueError is the kind or the config refusing
                    the family, reported with its message);
  position cells    every registered position kind (tfjax.nn.positions.POSITION_KINDS) with the
                    default attention kind and family (softmax, decoder).
Each accepted cell trains STEPS steps with the loop's own pieces (state_layout, jit_train_step,
BatchPlacement) on a 1-device mesh and on a 2-device data mesh, from the same initial state.
An optional argument "i/n" runs every n-th cell from the i-th (the test runs 2 parts at once).
Prints {"cells": {"kind/family/position": cell}, "kinds": [...], "position_kinds": [...],
"families": [...]}, where a cell is {"losses": {"1": [...], "2": [...]}} or {"rejected": message}.

Sizes: 1 layer of width 16, batch 4, rows of at most 16 tokens. A kind's own keys are sized to
these rows in KIND_SIZES (a kind registered without an entry runs at its defaults; if those do
not fit the rows, its cells are rejected with a message that is not about the family, which the
test reports by name).
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE).strip()

import jax  # noqa: E402  pylint: disable=wrong-import-position

from tfjax.nn import attention_kinds, positions  # noqa: E402  pylint: disable=wrong-import-position
from tfjax.nn.config import FAMILIES  # noqa: E402  pylint: disable=wrong-import-position
from tfjax.training.loop import experiment  # noqa: E402  pylint: disable=wrong-import-position
from tfjax.training.parallel import sharding  # noqa: E402  pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from tfjax.training.config.defaults import base_config  # noqa: E402

STEPS = 5
BATCH = 4
ROW = 16  # the longest row of any family's data below
DEFAULT_KIND, DEFAULT_FAMILY = "softmax", "decoder"
BASE_POSITION = "learned"  # every built-in attention kind takes it (Longformer refuses rotary)
# A kind's own keys sized to ROW-token rows (their defaults are sized to real sequences).
KIND_SIZES = {
    "longformer": dict(longformer_window=4, longformer_global_tokens=1),
    "bigbird": dict(bigbird_block_size=2, bigbird_num_random_blocks=1),
    "linformer": dict(linformer_k=8),
    "performer": dict(performer_features=16),
}
# family -> (task, data keys): synthetic data, no files.
FAMILY_DATA = {
    "decoder": ("lm", dict(name="copy", form="decoder", train_lengths=(1, 6), test_lengths=(6,),
                           num_symbols=8)),
    "encoder": ("classification", dict(name="majority", train_lengths=(ROW - 1, ROW - 1),
                                       test_lengths=(ROW - 1,))),
    "encoder_decoder": ("seq2seq", dict(name="reverse", form="seq2seq", train_lengths=(1, 6),
                                        test_lengths=(6,), num_symbols=8)),
}
FAMILY_MODEL = {"encoder": dict(pooler=True, num_classes=2, mlm_head=False)}
_T0 = time.time()


def _tick(what):
  print(f"[{time.time() - _T0:6.1f}s] {what}", file=sys.stderr, flush=True)


def cell_config(kind, family, position):
  task, data = FAMILY_DATA[family]
  config = base_config()
  config.task = task
  config.data.update(**data)
  config.model.update(family=family, vocab_size=0, d_model=16, num_layers=1, num_heads=2,
                      d_ff=32, position=position, max_len=2 * ROW, attention_kind=kind,
                      **FAMILY_MODEL.get(family, {}), **KIND_SIZES.get(kind, {}))
  config.optimizer.update(lr=1e-2, warmup_steps=1, min_lr=1e-3)
  config.train.update(num_steps=STEPS, batch_size=BATCH, eval_batch_size=BATCH, eval_batches=1,
                      eval_every=1000, log_every=1, checkpoint_every=1000, eval_at_start=False)
  config.mesh.update(data=2, fsdp=1, tensor=1)
  return config


def run_steps(exp, mesh, num_steps, initial=None):
  """The loop's own pieces for `num_steps` steps on `mesh` (tests/scaleout_helper.py's run_steps
  without its HLO capture, which would compile each step a second time). `initial`: a state to
  start from (placed with this mesh's shardings) instead of initializing one (an init compile
  per mesh); returns the losses and the initial state."""
  placement = sharding.BatchPlacement.create(mesh, sharding.rules(exp.config))
  layout = experiment.state_layout(exp, placement)
  state = layout.init() if initial is None else jax.device_put(initial, layout.shardings)
  start = jax.device_get(state)  # a host copy: the train step donates its input state
  train_step = experiment.jit_train_step(exp, placement, layout.shardings)
  batch_size = exp.config.train.batch_size
  rows = placement.process_rows(batch_size)
  losses = []
  with placement.axis_rules():
    for index in range(num_steps):
      batch = placement.put(exp.dataset.train_batch(index, batch_size, *rows))
      state, metrics = train_step(state, batch)
      losses.append(float(metrics["train/loss"]))
  return losses, start


def cells():
  """[(kind, family, position)] of the matrix, in a fixed order: the attention cells, then the
  position cells not among them."""
  keys = [(kind, family, BASE_POSITION) for kind in attention_kinds.ATTENTION_KINDS
          for family in FAMILIES]
  keys += [(DEFAULT_KIND, DEFAULT_FAMILY, position) for position in positions.POSITION_KINDS
           if (DEFAULT_KIND, DEFAULT_FAMILY, position) not in keys]
  return keys


def run_cell(kind, family, position, meshes):
  """{"losses": {"1": [...], "2": [...]}} (both meshes from the same initial state), or
  {"rejected": the ValueError's message}."""
  try:
    exp = experiment.prepare(cell_config(kind, family, position))
  except ValueError as e:
    return {"rejected": str(e)}
  losses, start = run_steps(exp, meshes["1"], STEPS)
  losses = {"1": losses, "2": run_steps(exp, meshes["2"], STEPS, initial=start)[0]}
  _tick(f"{kind} / {family} / {position}")
  return {"losses": losses}


def main(part="0/1"):
  """Runs the cells whose index is `i` modulo `n` (part "i/n": the test runs two parts at once)."""
  assert jax.device_count() == 2, "run with XLA_FLAGS=--xla_force_host_platform_device_count=2"
  index, count = map(int, part.split("/"))
  meshes = {"1": sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]),
            "2": sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 1}, jax.devices()[:2])}
  report = {"kinds": list(attention_kinds.ATTENTION_KINDS),
            "position_kinds": list(positions.POSITION_KINDS), "families": list(FAMILIES),
            "cells": {}}
  for number, key in enumerate(cells()):
    if number % count == index:
      report["cells"]["/".join(key)] = run_cell(*key, meshes)
  print(json.dumps(report))


if __name__ == "__main__":
  main(*sys.argv[1:])
