"""The full experiment config every `configs/*.py` starts from: one ConfigDict, every key present.

Sections: model (tfjax.config.ModelConfig), data (tfjax.data), optimizer (tfjax.optimizer), train
(the loop, below), mesh (tfjax.sharding). Config files change values, never add keys, so a typo in
`--config.x.y=...` fails instead of being silently ignored.
"""

from ml_collections import config_dict

from tfjax.config import default_model_config
from tfjax.data import default_data_config
from tfjax.optimizer import default_optimizer_config


def default_train_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.num_steps = 1000            # optimizer updates
  c.batch_size = 32             # global batch (rows), split over processes and micro-batches
  c.eval_batch_size = 32
  c.eval_batches = 8            # per eval group ('val', or one per synthetic test length)
  c.eval_every = 250
  c.eval_at_start = True        # nanoGPT also evaluates step 0
  c.log_every = 50
  c.steps_per_call = 1          # steps per jitted call (lax.fori_loop over K stacked batches);
                                # logs, evals, checkpoints still land on their steps
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  c.label_smoothing = 0.0
  c.sample_tokens = 0           # LM runs: greedy sample of this many tokens at each eval
  c.sample_prompt = ""
  c.peak_flops = 0.0            # per device, for MFU; 0 = look the device up (tfjax.params)
  return c


def default_mesh_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.data = -1                   # -1: all remaining devices
  c.fsdp = 1
  c.tensor = 1
  # CPU-only hosts: split the CPU into this many XLA devices before JAX starts, so the 'data'
  # axis runs one batch shard per core (XLA:CPU runs a small matmul on ~1 core; see
  # tfjax.sharding.configure_cpu_devices). 0: leave JAX's default (1 device); -1: one per core,
  # capped to a count that divides the batch sizes. Applied by the entry points only.
  c.cpu_devices = 0
  return c


def base_config() -> config_dict.ConfigDict:
  config = config_dict.ConfigDict()
  config.seed = 0
  config.task = "lm"            # lm | mlm | seq2seq | classification
  config.model = default_model_config()
  config.data = default_data_config()
  config.optimizer = default_optimizer_config()
  config.train = default_train_config()
  config.mesh = default_mesh_config()
  config.sharding_rules = ()    # () = tfjax.sharding.DEFAULT_RULES; else ((logical, mesh), ...)
  return config
