"""configs/gpt2_owt.py: nanoGPT's GPT-2 / OpenWebText settings, and its smoke run on a small
generated corpus prepared with a local BPE tokenizer (the CI stand-in for GPT-2's), resumed
exactly from the batch index."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)

from run_helpers import REPO, train_losses  # pylint: disable=wrong-import-position

from tfjax.data import prepare as prep  # pylint: disable=wrong-import-position
from tfjax.training.loop import train  # pylint: disable=wrong-import-position


def _get(path):
  import importlib.util  # pylint: disable=import-outside-toplevel
  file, _, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("gpt2_owt", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg or None)


def _prepared(config, num_devices):
  """experiment.prepare on `num_devices` devices (none needed) with a stand-in for the corpus."""
  from tfjax.aot import shapes  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  return experiment.prepare(config, num_devices=num_devices,
                            dataset=shapes.stand_in_dataset(config)).config


def test_the_recipe_is_nanogpts():
  c = _prepared(_get(os.path.join(REPO, "configs", "gpt2_owt.py")), num_devices=1)
  micro = c.train.batch_size // c.optimizer.grad_accum_steps
  assert (micro, c.data.seq_len, c.optimizer.grad_accum_steps) == (12, 1024, 40)
  assert c.train.batch_size * c.data.seq_len == 491_520  # ~0.5M tokens a step
  assert (c.optimizer.lr, c.optimizer.min_lr, c.optimizer.warmup_steps, c.train.num_steps) == (
      6e-4, 6e-5, 2000, 600_000)
  assert (c.optimizer.weight_decay, c.optimizer.b1, c.optimizer.b2, c.optimizer.clip_norm) == (
      0.1, 0.9, 0.95, 1.0)
  assert c.data.name == "prepared" and c.data.expect_tokenizer == "gpt2"


@pytest.mark.parametrize("mesh,shards,accum", [
    ({}, 1, 40), ({}, 2, 20), ({}, 4, 10), ({}, 8, 5),        # data over all devices
    ({"data": 2, "fsdp": 4}, 8, 5),                            # fsdp holds rows too
    ({"data": -1, "tensor": 2}, 4, 10)])                       # 8 devices, 4 of them batch shards
def test_accumulation_and_eval_batch_follow_the_batch_shards(mesh, shards, accum):
  """Each batch shard takes nanoGPT's 12 rows per micro-batch and per eval batch, 480 rows a step,
  from the same command on any of these meshes; config.json gets the resolved numbers."""
  config = _get(os.path.join(REPO, "configs", "gpt2_owt.py"))
  config.mesh.update(mesh)
  devices = 8 if mesh else shards
  c = _prepared(config, num_devices=devices)
  assert (c.optimizer.grad_accum_steps, c.train.eval_batch_size) == (accum, 12 * shards)
  micro = c.train.batch_size // c.optimizer.grad_accum_steps
  assert micro // shards == 12 and micro * c.optimizer.grad_accum_steps == 480
  assert c.train.eval_batch_size // shards == 12
  assert '"grad_accum_steps": %d' % accum in c.to_json_best_effort()


@pytest.mark.parametrize("shards,fix", [
    (7, "set --config.train.batch_size=504 or 420 (a multiple of 12 x 7), or run on a number of "
        "batch shards that divides 40"),
    (12, "set --config.train.micro_batch_per_device=10 (keeps 480 rows a step), or set "
         "--config.train.batch_size=432 or 576 (a multiple of 12 x 12), or run on a number of "
         "batch shards that divides 40")])
def test_a_device_count_the_batch_does_not_split_over_names_the_documented_fix(shards, fix):
  config = _get(os.path.join(REPO, "configs", "gpt2_owt.py"))
  with pytest.raises(ValueError) as error:
    _prepared(config, num_devices=shards)
  message = str(error.value)
  assert message == (f"train.batch_size=480 rows do not split into micro-batches of "
                     f"train.micro_batch_per_device=12 rows on each of {shards} batch shards "
                     f"({12 * shards} rows a micro-batch): {fix}")
  # The fix it names is the one the config documents, and it works.
  doc = " ".join(_module_doc().split())
  assert "--config.train.micro_batch_per_device" in doc and "--config.train.batch_size" in doc
  key, value = fix.split(" ")[1].split("=")
  section, name = key.removeprefix("--config.").split(".")
  config[section][name] = int(value.split(" ")[0])
  c = _prepared(config, num_devices=shards)
  assert (c.train.batch_size // c.optimizer.grad_accum_steps) % shards == 0


def test_explicit_values_win_over_the_derived_ones():
  config = _get(os.path.join(REPO, "configs", "gpt2_owt.py"))
  config.optimizer.grad_accum_steps = 5  # the 8-GPU command of before: still works, on 1 or 8
  assert _prepared(config, num_devices=1).optimizer.grad_accum_steps == 5
  c = _prepared(config, num_devices=8)
  assert (c.optimizer.grad_accum_steps, c.train.eval_batch_size) == (5, 96)
  config.train.eval_batch_size = 24
  assert _prepared(config, num_devices=8).train.eval_batch_size == 24
  config.train.eval_batch_size = 12  # explicit and not splitting: the error names the -1 too
  with pytest.raises(ValueError, match=r"train\.eval_batch_size = 12 rows do not split over the "
                     r"8 batch shards .* use a multiple of 8, or train\.eval_batch_size=-1 \(12 "
                     r"rows per batch shard: train\.micro_batch_per_device\)"):
    _prepared(config, num_devices=8)


def test_derived_values_need_micro_batch_per_device():
  config = _get(os.path.join(REPO, "configs", "gpt2_owt.py"))
  config.train.micro_batch_per_device = 0
  with pytest.raises(ValueError, match=r"optimizer\.grad_accum_steps and train\.eval_batch_size"
                     r"=-1 take their size from train\.micro_batch_per_device"):
    _prepared(config, num_devices=1)


def _module_doc():
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("gpt2_owt_doc",
                                                os.path.join(REPO, "configs", "gpt2_owt.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.__doc__ + module.get_config.__doc__


def test_parameter_count_is_nanogpts():
  from tfjax.training.accounting import params  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
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
  # config.json holds the numbers resolved for this one device, so the same command resumes it
  # as the same run (no config change to record)
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  with open(tmp_path / "run" / "config.json") as f:
    written = json.load(f)
  assert (written["optimizer"]["grad_accum_steps"], written["train"]["eval_batch_size"]) == (2, 4)
  assert runs.config_changes(str(tmp_path / "run"), experiment.prepare(config).config) == []


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


@pytest.mark.slow  # a fresh process with 8 CPU devices (~15 s on 2 shared cores)
def test_smoke_run_on_eight_devices_derives_its_batches(tmp_path):
  """The same command on 8 devices: 4 rows per device per micro-batch of the smoke's 64-row step
  (64 / (4 x 8) = 2 micro-batches), eval batches of 4 x 8 rows, in config.json."""
  code = ("import json, sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]; import jax;"
          "assert jax.device_count() == 8;"
          "from test_gpt2_owt import prepared_corpus, smoke_config; import pathlib;"
          "from tfjax.training import train; tmp = pathlib.Path(sys.argv[1]);"
          "config = smoke_config(prepared_corpus(tmp));"
          "config.train.update(batch_size=64, num_steps=2);"
          "train.train_and_evaluate(config, str(tmp / 'run'))")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "  # the suite's (tests/conftest.py)
                       "--xla_force_host_platform_device_count=8")
  result = subprocess.run([sys.executable, "-c", code, str(tmp_path), TESTS,
                           os.path.join(TESTS, "training")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-5000:]
  with open(tmp_path / "run" / "config.json") as f:
    written = json.load(f)
  assert (written["optimizer"]["grad_accum_steps"], written["train"]["eval_batch_size"]) == (2, 32)
  assert sorted(train_losses(str(tmp_path / "run"))) == [1, 2]
