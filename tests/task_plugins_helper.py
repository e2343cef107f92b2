"""Child process of tests/training/test_task_plugins.py: each task with a model of its own (vit,
clip, whisper, funnel, funnel_classification) trained a few steps through the main loop
(train.train_and_evaluate), with its records written under OUT/<mesh>/<task>/.

  JAX_PLATFORMS=cpu [XLA_FLAGS=--xla_force_host_platform_device_count=2] \\
      python tests/task_plugins_helper.py OUT one|two

'one' (1 device): an uninterrupted run (full/), the same run stopped after step STOP and resumed
(resumed/), and tfjax-params' output for the config (params.txt). 'two' (2 CPU devices, the batch
split over mesh.data=2): the uninterrupted run only. Prints a JSON line of the device count.
"""

import contextlib
import importlib.util
import io
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, STOP = 8, 3


def config_file(name: str, arg: str):
  spec = importlib.util.spec_from_file_location(f"configs_{name}",
                                                os.path.join(REPO, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def tiny(task: str):
  """The task's 'test' config shrunk to a few seconds: STEPS steps of 16 rows, a loss and an
  eval (at step 0 and the last step) logged, a checkpoint every 4 steps."""
  if task == "funnel_classification":
    config = config_file("funnel_synthetic", "classify_test")
  else:
    config = config_file(f"{task}_synthetic", "test")
  if task == "vit":  # BERT's init std 0.02 barely moves [CLS] in 8 steps; 0.2 learns in them
    config.model.init_std = 0.2
    config.data.noise = 0.3
  if task.startswith("funnel"):
    config.model.update(block_sizes=(1, 1), d_model=16, n_head=2, d_head=8, d_inner=32)
    config.data.seq_len = 16
  config.optimizer.update(lr=1e-2, min_lr=1e-3, warmup_steps=2)
  config.train.update(num_steps=STEPS, batch_size=16, eval_batch_size=16, eval_batches=1,
                      eval_every=STEPS, log_every=1, checkpoint_every=4)
  return config


TASKS = ("vit", "clip", "whisper", "funnel", "funnel_classification")


def main(out: str, mesh: str):
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.runtime import compile_cache  # pylint: disable=import-outside-toplevel
  from tfjax.training.entry import params_main  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import train  # pylint: disable=import-outside-toplevel
  compile_cache.enable(os.path.join(out, f"cache-{mesh}"))
  for task in TASKS:
    root = os.path.join(out, mesh, task)
    train.train_and_evaluate(tiny(task), os.path.join(root, "full"))
    if mesh == "two":
      continue
    resumed = os.path.join(root, "resumed")
    stopped = train.train_and_evaluate(tiny(task), resumed, stop_after_step=STOP)
    assert stopped.stopped is not None or stopped.get("train/loss") is not None
    train.train_and_evaluate(tiny(task), resumed)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
      params_main._plan_and_print(tiny(task), None, None)  # pylint: disable=protected-access
    with open(os.path.join(root, "params.txt"), "w", encoding="utf-8") as f:
      f.write(text.getvalue())
  print(json.dumps({"devices": jax.device_count()}))


if __name__ == "__main__":
  main(*sys.argv[1:])
