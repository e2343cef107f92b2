"""A text LM run's greedy sample at each evaluation: a short continuation of train.sample_prompt."""

from __future__ import annotations

import concurrent.futures

import jax
import numpy as np

from tfjax.inference import decode
from tfjax.nn.positions import has_learned_table


class GreedySampler:
  """The run's greedy continuation of train.sample_prompt under given params.

  Decoding runs on a thread of its own, so outside the training mesh: one device and no sharded
  helper programs. Its program compiles at the first sample, unoptimized on CPU (a program that
  runs rarely; decode.generate's fast_compile). Use as a context manager: on exit it waits for the
  thread (none outlives the run).

  `experiment` is the run's tfjax.training.loop.experiment.Experiment (its config, dataset and
  model_config are read) and `placement` its sharding.BatchPlacement (`replicated()`); both are
  passed in, so generation stays below the training system that calls it.
  """

  def __init__(self, experiment, placement):
    self._experiment, self._placement = experiment, placement
    self._prompt = experiment.config.train.sample_prompt or ""
    ids = experiment.dataset.tokenizer.encode(self._prompt) if self._prompt else [0]
    model_cfg = experiment.model_config
    limit = model_cfg.max_len - len(ids) if has_learned_table(model_cfg) else None
    tokens = experiment.config.train.sample_tokens
    self._prompt_ids = [list(ids)]
    self._settings = dict(max_new_tokens=tokens if limit is None else min(tokens, limit),
                          strategy="greedy", fast_compile=jax.default_backend() == "cpu")
    self._gather = None  # multi-process: a program that replicates the params on every device
    self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfjax-sample")

  @staticmethod
  def wanted(experiment) -> bool:
    """Whether the run samples: a text LM (it has a tokenizer) with train.sample_tokens > 0."""
    return (experiment.config.task == "lm" and experiment.config.train.sample_tokens > 0
            and getattr(experiment.dataset, "tokenizer", None) is not None)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._thread.shutdown(wait=True)

  def sample(self, params) -> str:
    """The continuation under `params` (the training state's, any sharding)."""
    if jax.process_count() > 1:  # device_get needs every shard addressable from this process
      if self._gather is None:
        self._gather = jax.jit(lambda p: p, out_shardings=self._placement.replicated())
      params = self._gather(params)
    out = self._thread.submit(decode.generate, self._experiment.model_config,
                              jax.device_get(params), self._prompt_ids, **self._settings).result()
    ids = np.asarray(out.tokens[0][:out.lengths[0]]).tolist()
    return self._prompt + self._experiment.dataset.tokenizer.decode(ids)
