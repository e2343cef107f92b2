"""configs/gpt2_owt.py: nanoGPT's GPT-2 / OpenWebText settings, and its smoke run on a small
generated corpus prepared with a local BPE tokenizer (the CI stand-in for GPT-2's), resumed
exactly from the batch index."""

import json
import os
import sys

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

from run_helpers import REPO, train_losses  # pylint: disable=wrong-import-position

from tfjax.data import prepare as prep  # pylint: disable=wrong-import-position
from tfjax.training import train  # pylint: disable=wrong-import-position


def _get(path):
  import importlib.util  # pylint: disable=import-outside-toplevel
  file, _, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("gpt2_owt", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg or None)


def test_the_recipe_is_nanogpts():
  c = _get(os.path.join(REPO, "configs", "gpt2_owt.py"))
  micro = c.train.batch_size // c.optimizer.grad_accum_steps
  assert (micro, c.data.seq_len, c.optimizer.grad_accum_steps) == (12, 1024, 40)
  assert c.train.batch_size * c.data.seq_len == 491_520  # ~0.5M tokens a step
  assert (c.optimizer.lr, c.optimizer.min_lr, c.optimizer.warmup_steps, c.train.num_steps) == (
      6e-4, 6e-5, 2000, 600_000)
  assert (c.optimizer.weight_decay, c.optimizer.b1, c.optimizer.b2, c.optimizer.clip_norm) == (
      0.1, 0.9, 0.95, 1.0)
  assert c.data.name == "prepared" and c.data.expect_tokenizer == "gpt2"


def test_parameter_count_is_nanogpts():
  from tfjax.training import experiment, params  # pylint: disable=import-outside-toplevel
  cfg = experiment.model_config(_get(os.path.join(REPO, "configs", "gpt2_owt.py")))
  total = sum(params.count_by_category(cfg).values())
  # nanoGPT prints "number of parameters: 123.59M" for this model: it leaves out the position
  # table (1024 x 768 = 786,432), as its get_num_params does.
  assert total == 124_373_760 and round((total - 1024 * 768) / 1e6, 2) == 123.59


def prepared_corpus(tmp_path):
  """300 generated documents prepared with a 300-id BPE that has GPT-2's <|endoftext|>."""
  tokenizers = pytest.importorskip("tokenizers")
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "the", "of", "and", "model", "token", "shard"]
  docs = [" ".join(rng.choice(words, size=int(rng.integers(20, 200)))) for _ in range(300)]
  with open(tmp_path / "corpus.jsonl", "w") as f:
    f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  (tmp_path / "tok").mkdir()
  tok.save(str(tmp_path / "tok" / "tokenizer.json"))
  (tmp_path / "tok" / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
  prepared = str(tmp_path / "prepared")
  prep.prepare(str(tmp_path / "corpus.jsonl"), f"hf:{tmp_path}/tok", prepared, val_docs=20,
               shard_mb=0.02, workers=1, progress=False, min_val_tokens=0)
  return prepared


def smoke_config(prepared):
  config = _get(os.path.join(REPO, "configs", "gpt2_owt.py") + ":smoke")
  config.data.path = prepared
  return config


def test_smoke_run_learns(tmp_path):
  config = smoke_config(prepared_corpus(tmp_path))
  train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = train_losses(str(tmp_path / "run"))
  assert sorted(losses) == list(range(1, 7)) and np.isfinite(list(losses.values())).all()
  assert losses[6] < losses[1]


@pytest.mark.slow  # 3 runs (~50 s on 2 shared cores); the loop's resume is tested in test_train
def test_smoke_run_resumes_exactly(tmp_path):
  config = smoke_config(prepared_corpus(tmp_path))
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  train.train_and_evaluate(config, straight)
  train.train_and_evaluate(config, resumed, stop_after_step=3)
  train.train_and_evaluate(config, resumed)  # the run's saved tokenizer matches the manifest's
  expected, got = train_losses(straight), train_losses(resumed)
  assert sorted(got) == list(range(1, 7))
  for step in range(4, 7):  # bitwise equal after the restart
    assert got[step] == expected[step], (step, got[step], expected[step])
