"""tfjax/inference/sampling.py: the greedy sample a training run logs."""

import logging
import threading

import jax
import numpy as np

from tfjax.training.loop import train
from tfjax.nn.models import build_model
from run_helpers import tiny_config



def test_lm_run_logs_the_greedy_sample_of_the_params_it_evaluated(tmp_path, caplog):
  """At an evaluation a text LM run logs a greedy continuation of train.sample_prompt (decoded
  with the KV cache on the sampler's own thread): it must be the argmax chain of full forward
  passes under the checkpointed params of that step."""
  path = tmp_path / "corpus.txt"
  path.write_text("abcdefgh" * 2000)  # learnt within 30 steps: the sample is not one repeated id
  config = tiny_config(num_steps=30, eval_every=30, checkpoint_every=30, sample_tokens=7,
                       sample_prompt="abc")
  config.data.update(name="text", path=str(path), tokenizer="char", seq_len=16)
  config.model.update(position="learned", max_len=16)
  workdir = str(tmp_path / "run")
  with caplog.at_level(logging.INFO, logger="tfjax"):
    train.train_and_evaluate(config, workdir)
  samples = [r.getMessage() for r in caplog.records if " sample: " in r.getMessage()]
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)
  step, params = run.step, run.params
  model, tokenizer = build_model(run.model_config), run.dataset.tokenizer
  tokens = np.asarray(tokenizer.encode("abc")).tolist()
  # Jitted (one program per length): eager apply dispatched every op of 7 passes (~10 s of CPU).
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x))
  for _ in range(7):
    logits = forward(params, np.asarray([tokens], np.int32))
    tokens.append(int(np.argmax(logits[0, -1])))
  assert step == 30 and samples == [f"step 30 sample: {tokenizer.decode(tokens)}"], samples
  assert not [t.name for t in threading.enumerate() if t.name.startswith("tfjax-sample")]
