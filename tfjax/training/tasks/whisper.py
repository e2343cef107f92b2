"""Speech to text with Whisper (tfjax/nn/audio.py): config.task='whisper'.

Batch: features [B, frames, mels] float32 (log-mel-like), decoder_inputs [B, L] (SOT then the
transcript), targets [B, L] (the transcript then EOT), weights [B, L] (1 on the transcript and
EOT). Teacher-forced next-token cross entropy, summed. eval/exact_match is the share of rows
whose every target is the argmax: with the correct prefix fed at each step this equals greedy
decoding's exact match (tfjax/training/tasks/text.py).

Synthetic data (data.name='synthetic', tfjax/modalities/synthetic.py `utterances`): transcripts
of 1..data.max_tokens symbols from data.num_symbols; token ids 0 pad, 1 SOT, 2 EOT, symbols from
3; each symbol a fixed random spectrum (data.template_seed, scale data.amplitude) held over a
random stretch of frames, plus noise std data.noise.
"""

from __future__ import annotations

import numpy as np

from tfjax.modalities import synthetic
from tfjax.nn.audio import Whisper, WhisperConfig
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.registry import register_dataset, register_task
from tfjax.training.tasks.text import summed_statistics

FIRST_SYMBOL = 3  # ids 0 pad, 1 start of transcript, 2 end of transcript


class WhisperTask(OwnModelTask):
  name = family = "whisper"
  config_class = WhisperConfig
  eval_ratios = (("eval/exact_match", "exact_sum", "row_sum"),)

  def data_section(self) -> dict:
    return {"max_tokens": 4, "noise": 0.3, "amplitude": 1.0, "template_seed": 1234}

  def check(self, config, model_cfg) -> None:
    if config.data.name != "synthetic":
      return
    d = config.data
    if (model_cfg.decoder_start_id, model_cfg.eos_id) != (1, 2):
      raise ValueError("the synthetic transcripts start with token 1 and end with token 2: set "
                       "config.model decoder_start_id=1 and eos_id=2")
    if model_cfg.vocab_size < FIRST_SYMBOL + d.num_symbols:
      raise ValueError(f"config.model.vocab_size={model_cfg.vocab_size} < 3 + data.num_symbols="
                       f"{d.num_symbols}: raise the vocabulary")
    if d.max_tokens + 2 > model_cfg.max_target_positions:
      raise ValueError(f"data.max_tokens={d.max_tokens} + SOT + EOT exceeds "
                       f"max_target_positions={model_cfg.max_target_positions}")

  def build_model(self, model_cfg, deterministic: bool = True):
    return Whisper(model_cfg)

  def example_batch(self, model_cfg):
    return {"features": np.zeros((1, model_cfg.num_frames, model_cfg.num_mels), np.float32),
            "decoder_inputs": np.full((1, 1), model_cfg.decoder_start_id, np.int32)}

  def model_inputs(self, batch):
    return (batch["features"], batch["decoder_inputs"]), {}

  def row_lengths(self, batch):
    return int(np.shape(batch["decoder_inputs"])[1]), int(np.shape(batch["features"])[1]) // 2

  def tokens_per_row(self, model_cfg, batch) -> int:
    return model_cfg.max_source_positions + int(np.shape(batch["decoder_inputs"])[1])

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    logits_BxLxV = model.apply({"params": params}, batch["features"], batch["decoder_inputs"],
                               rngs=rngs or {})
    return summed_statistics(logits_BxLxV, batch["targets"], batch["weights"], label_smoothing)


def synthetic_utterances(config, workdir=None):
  del workdir
  task = WhisperTask()
  cfg, d = task.model_config(config), config.data
  task.check(config, cfg)  # the sizes the rows below rely on
  # The symbols' spectra: fixed by data.template_seed, the same for training and evaluation.
  templates = d.amplitude * np.random.default_rng(d.template_seed).normal(
      size=(d.num_symbols, cfg.num_mels))

  def rows(rng, count):
    features, symbols = synthetic.utterances(rng, count, cfg.num_frames, cfg.num_mels,
                                             d.num_symbols, d.max_tokens, templates, d.noise)
    target = np.zeros((count, d.max_tokens + 2), np.int32)
    target[:, 0] = cfg.decoder_start_id
    target[:, 1:-1] = np.where(symbols >= 0, symbols + FIRST_SYMBOL, 0)
    ends = (symbols >= 0).sum(axis=1) + 1
    target[np.arange(count), ends] = cfg.eos_id
    labels = target[:, 1:]
    return {"features": features, "decoder_inputs": target[:, :-1], "targets": labels,
            "weights": (labels != 0).astype(np.float32)}
  return SyntheticRows(rows, d.seed, d.eval_seed)


register_task(WhisperTask())
register_dataset("whisper", "synthetic", synthetic_utterances)
