"""Error messages that name the fix that works (issue 60): a fine-tune whose rows exceed the source
run's position table, a diverged run's learning rate, a misspelled choice, a modality run read as
a text run, and no expected-but-alarming orbax warning on a non-OCDBT checkpoint."""

import json
import logging

import jax.numpy as jnp
import pytest

from tfjax.nn.choices import one_of
from tfjax.training.checkpointing import checkpoint, runs
from tfjax.training.config import run_config
from tfjax.training.loop import divergence, experiment
from tfjax.training.config.defaults import base_config


def _text_config(corpus, seq_len):
  config = base_config()
  config.data.update(name="text", path=str(corpus), tokenizer="byte", seq_len=seq_len)
  config.model.update(d_model=16, num_layers=1, num_heads=2, d_ff=32, position="learned",
                      max_len=16)
  config.train.update(batch_size=2, eval_batch_size=2)
  return config


def test_init_from_rows_longer_than_the_source_position_table_name_data_seq_len(tmp_path):
  """init_from takes model.max_len from the source run, so "raise model.max_len" (the position
  table's own message) fixes nothing: the error names data.seq_len."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the cat sat on the mat. " * 200)
  source = str(tmp_path / "source")
  runs.prepare_workdir(source, experiment.prepare(_text_config(corpus, 16)).config)
  config = _text_config(corpus, 32)
  config.init_from = source
  config.model.max_len = 64  # ignored: the model keys are the source run's
  with pytest.raises(ValueError, match=r"rows of 32 tokens exceed the learned position table of "
                     r"config\.init_from=.*model\.max_len=16.*lower data\.seq_len \(now 32\) to "
                     r"16 or less"):
    experiment.prepare(config)
  config.data.seq_len = 16  # the fix the message names
  assert experiment.prepare(config).model_config.max_len == 16


def test_a_diverged_run_names_the_configured_lr_not_the_warmup_scaled_one():
  config = base_config()
  config.optimizer.lr = 1e6
  key, lr = divergence.lr_setting(config.optimizer)
  text = str(divergence.Diverged(5, None, lr, lr_key=key, scheduled_lr=5e4))
  assert "Lower optimizer.lr (set to 1e+06; the schedule's rate at step 5 was 50000)" in text
  config.optimizer.schedule = "rsqrt"  # ignores optimizer.lr
  assert divergence.lr_setting(config.optimizer) == ("optimizer.lr_scale", 1.0)


def test_a_misspelled_choice_gets_the_close_one():
  kinds = ("softmax", "bigbird", "linformer", "longformer", "performer")
  with pytest.raises(ValueError, match=r"^model\.attention_kind='perfomer' is invalid; choose one "
                                       r"of \(.*\); did you mean 'performer'\?$"):
    one_of("model.attention_kind", "perfomer", kinds)
  with pytest.raises(ValueError, match=r"choose one of \(.*\)$"):  # nothing close: no guess
    one_of("model.attention_kind", "dense", kinds)


def test_a_run_of_the_removed_modality_loop_says_what_it_is(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(
      {"task": "vit", "data": {"classes": 4}, "model": {"d_model": 8},
       "train": {"learning_rate": 3e-3}}))
  with pytest.raises(ValueError, match=r"is a 'vit' run of the removed modality loop .*"
                                       r"experiments/train\.py --config=configs/vit_synthetic"):
    run_config.load_config(str(tmp_path))


def test_a_checkpoint_without_ocdbt_logs_no_ocdbt_merge_warning(tmp_path, caplog):
  """orbax's finalizer tries to merge per-process OCDBT files after every save, also when the
  handler wrote none (use_ocdbt=False: the HF import), and warns; that warning is dropped."""
  ckpt = checkpoint.Checkpointer(str(tmp_path / "run"), use_ocdbt=False)
  try:
    with caplog.at_level(logging.WARNING):
      ckpt.save(0, {"params": {"w": jnp.ones((3,), jnp.float32)}}, {"index": 0}, {}, force=True)
      ckpt.wait()
  finally:
    ckpt.close()
  assert ckpt.steps() == [0]
  assert not [r for r in caplog.records if "Skipping merge of OCDBT" in r.getMessage()]
