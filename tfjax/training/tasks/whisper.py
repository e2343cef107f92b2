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

A prepared audio folder (data.name='audio_folder', data.path = tfjax-prepare --input=audio:DIR's
output; tfjax/training/tasks/prepared_rows.py): each clip's log-mel features cropped to the
model's 2 x max_source_positions frames (a clip whose frames before its padding do not fit is
refused: nothing it says is cut; released Whisper hears 3,000 frames, a tiny one fewer), and its
transcript's token ids shifted by 3 (0 pad, 1 SOT, 2 EOT, the prepared tokenizer's id k is
k + 3; an end-of-text id the prepare appended is dropped for EOT). Rows are max_target_positions
wide.
"""

from __future__ import annotations

import numpy as np

from tfjax.modalities import synthetic
from tfjax.nn.audio import Whisper, WhisperConfig
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.prepared_rows import PreparedRows, open_prepared
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
    if (model_cfg.decoder_start_id, model_cfg.eos_id) != (1, 2):
      raise ValueError(f"the {config.data.name} transcripts start with token 1 and end with "
                       "token 2: set config.model decoder_start_id=1 and eos_id=2")
    if config.data.name != "synthetic":
      return
    d = config.data
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


def transcript_rows(token_lists, width: int) -> dict:
  """decoder_inputs / targets / weights [n, width] of transcripts given as prepared-tokenizer
  ids: SOT + ids + 3 in, ids + 3 + EOT out, weight 1 on the transcript and EOT."""
  decoder_inputs = np.zeros((len(token_lists), width), np.int32)
  targets = np.zeros((len(token_lists), width), np.int32)
  for i, ids in enumerate(token_lists):
    shifted = np.asarray(ids, np.int64) + FIRST_SYMBOL
    decoder_inputs[i, 0] = 1
    decoder_inputs[i, 1:len(shifted) + 1] = shifted
    targets[i, :len(shifted)] = shifted
    targets[i, len(shifted)] = 2
  return {"decoder_inputs": decoder_inputs, "targets": targets,
          "weights": (targets != 0).astype(np.float32)}


def transcripts(tokens_BxN, tokenizer, start: int = 1) -> list[str]:
  """The text of generated rows (tfjax.nn.audio.greedy_decode's [B, N] from SOT): the ids after
  the first `start` up to the first EOT (2), shifted back by 3 and read by the prepared
  tokenizer (pad / SOT ids inside a row are dropped)."""
  out = []
  for row in np.asarray(tokens_BxN)[:, start:]:
    ends = np.flatnonzero(row == 2)
    ids = row[:ends[0]] if len(ends) else row
    out.append(tokenizer.decode((ids[ids >= FIRST_SYMBOL] - FIRST_SYMBOL).tolist()))
  return out


def audio_folder(config, workdir=None):
  del workdir
  cfg = WhisperTask().model_config(config)
  train, held_out = open_prepared(config, "audio", "audio_folder")
  path, settings = config.data.path, train.settings
  if settings["n_mels"] != cfg.num_mels:
    raise ValueError(f"data.path={path} holds {settings['n_mels']} mel bins, config.model."
                     f"num_mels={cfg.num_mels}: set model.num_mels={settings['n_mels']}")
  vocab = train.manifest["tokenizer"]["vocab_size"] + FIRST_SYMBOL
  if cfg.vocab_size < vocab:
    raise ValueError(f"config.model.vocab_size={cfg.vocab_size} < 3 + the prepared tokenizer's "
                     f"{vocab - FIRST_SYMBOL} ids: set model.vocab_size={vocab}")
  eos = settings.get("eos_id")
  if cfg.num_frames > settings["frames"]:
    raise ValueError(f"config.model.max_source_positions={cfg.max_source_positions} hears "
                     f"{cfg.num_frames} frames, the prepared clips have {settings['frames']} "
                     f"({settings['chunk_seconds']} s): set it to at most "
                     f"{settings['frames'] // 2}")
  frames = max(int(train.frame_counts().max()), int(held_out.frame_counts().max()))
  if frames > cfg.num_frames:
    raise ValueError(f"data.path={path} has a clip of {frames} frames before its padding; "
                     f"config.model.max_source_positions={cfg.max_source_positions} hears "
                     f"{cfg.num_frames}: set it to at least {-(-frames // 2)}")
  tokens = max(int(train.token_counts().max()), int(held_out.token_counts().max()))
  tokens -= eos is not None
  if tokens + 1 > cfg.max_target_positions:
    raise ValueError(f"data.path={path} has a transcript of {tokens} tokens; with SOT / EOT it "
                     f"needs config.model.max_target_positions >= {tokens + 1}")

  def transcript(split, index):
    ids = split.tokens(int(index))
    return ids[:-1] if eos is not None and len(ids) and ids[-1] == eos else ids

  def rows(split, indices, positions):
    del positions
    return {"features": split.features(indices)[:, :cfg.num_frames],
            **transcript_rows([transcript(split, i) for i in indices], cfg.max_target_positions)}

  def row_weights(real_n, batch):  # a padding row counts nowhere: its tokens weigh 0
    return {**batch, "weights": batch["weights"] * real_n[:, None]}
  return PreparedRows(train, held_out, config.data.seed, config.data.eval_seed, rows,
                      row_weights=row_weights)


register_task(WhisperTask())
register_dataset("whisper", "synthetic", synthetic_utterances)
register_dataset("whisper", "audio_folder", audio_folder)
