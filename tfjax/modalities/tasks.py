"""Each modality's training task: its model config, synthetic batches, loss and eval metrics.

A task is built from `config` (configs/vit_synthetic.py and siblings): `config.model` holds the
fields of the modality's config dataclass, `config.data` the synthetic data's sizes.
  vit      cross-entropy of the class logits; eval: accuracy (chance 1/classes)
  clip     the symmetric contrastive loss; eval: image->text retrieval accuracy within a batch
  whisper  next-token cross-entropy of the transcript; eval: greedy exact-match rate
  funnel   masked-token cross-entropy on repeated motifs (FunnelForMaskedLM: the decoder's
           token-level output); eval: masked-token accuracy (chance 1/symbols)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfjax.modalities import synthetic
from tfjax.nn.audio import Whisper, WhisperConfig, greedy_decode
from tfjax.nn.clip import CLIP, CLIPConfig, contrastive_loss
from tfjax.nn.funnel import Funnel, FunnelConfig
from tfjax.nn.vision import ViTClassifier, ViTConfig


class Task:
  """model(), batch(rng, size) -> dict of arrays, loss(params, batch) -> (loss, metrics),
  evaluate(params, batch) -> metrics."""
  name = ""

  def __init__(self, config):
    self.config = config
    self.data = config.data

  def after_update(self, params):
    """The params after an optimizer step (CLIP clips its temperature here)."""
    return params

  def init(self, key):
    return self.model().init(key, *self.example(self.batch(np.random.default_rng(0), 1)))


class ViTTask(Task):
  name = "vit"

  def __init__(self, config):
    super().__init__(config)
    self.cfg = ViTConfig(**dict(config.model)).validated()
    if self.cfg.num_classes != self.data.classes:
      raise ValueError(f"config.model.num_classes={self.cfg.num_classes} differs from "
                       f"config.data.classes={self.data.classes}; set them equal")

  def model(self):
    return ViTClassifier(self.cfg)

  def batch(self, rng, size):
    images, labels = synthetic.stripes(rng, size, self.cfg.image_size, self.cfg.channels,
                                       self.data.classes, self.data.noise)
    return {"images": images, "labels": labels}

  def example(self, batch):
    return (batch["images"],)

  def loss(self, params, batch):
    logits = self.model().apply({"params": params}, batch["images"])["logits"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["labels"])
    return loss, {"loss": loss, "accuracy": accuracy}

  def evaluate(self, params, batch):
    return self.loss(params, batch)[1]


class CLIPTask(Task):
  """Paired synthetic images and captions of `data.classes` classes; a batch holds repeats of a
  class, so 'accuracy' (the exact pair retrieved) is capped below 1 while 'class_accuracy' (a
  caption of the image's class retrieved) can reach 1."""
  name = "clip"

  def __init__(self, config):
    super().__init__(config)
    self.cfg = CLIPConfig.from_dict(config.model)
    if self.cfg.text.eos_id != synthetic.EOS:
      raise ValueError(f"config.model.text.eos_id={self.cfg.text.eos_id}: the synthetic "
                       f"captions end with token {synthetic.EOS}; set eos_id={synthetic.EOS}")

  def model(self):
    return CLIP(self.cfg)

  def batch(self, rng, size):
    v, t = self.cfg.vision, self.cfg.text
    images, labels = synthetic.stripes(rng, size, v.image_size, v.channels, self.data.classes,
                                       self.data.noise)
    ids = synthetic.captions(rng, labels, t.max_len, t.vocab_size, self.data.classes)
    return {"images": images, "token_ids": ids, "labels": labels}

  def example(self, batch):
    return batch["images"], batch["token_ids"]

  def loss(self, params, batch):
    logits = self.model().apply({"params": params}, batch["images"],
                                batch["token_ids"])["logits_per_image"]
    loss = contrastive_loss(logits)
    picked = jnp.argmax(logits, axis=-1)
    labels = batch["labels"]
    return loss, {"loss": loss, "accuracy": jnp.mean(picked == jnp.arange(len(labels))),
                  "class_accuracy": jnp.mean(labels[picked] == labels),
                  "temperature": jnp.exp(-params["logit_scale"])}

  def evaluate(self, params, batch):
    return self.loss(params, batch)[1]

  def after_update(self, params):
    # Radford et al. 2021, sec. 2.5: the logit scale is clipped so logits scale by at most 100.
    return {**params, "logit_scale": jnp.minimum(params["logit_scale"], jnp.log(100.0))}


class WhisperTask(Task):
  """Synthetic utterances: token ids 0 pad, decoder_start_id 1 (SOT), eos_id 2 (EOT), symbols
  from 3. Teacher-forced loss over the transcript and EOT; eval adds greedy exact match (the
  whole decoded transcript up to EOT equal to the target)."""
  name = "whisper"
  FIRST_SYMBOL = 3

  def __init__(self, config):
    super().__init__(config)
    self.cfg = WhisperConfig(**dict(config.model)).validated()
    d = self.data
    if (self.cfg.decoder_start_id, self.cfg.eos_id) != (1, 2):
      raise ValueError("the synthetic transcripts start with token 1 and end with token 2: set "
                       "config.model decoder_start_id=1 and eos_id=2")
    if self.cfg.vocab_size < self.FIRST_SYMBOL + d.symbols:
      raise ValueError(f"config.model.vocab_size={self.cfg.vocab_size} < 3 + data.symbols="
                       f"{d.symbols}: raise the vocabulary")
    if d.max_tokens + 2 > self.cfg.max_target_positions:
      raise ValueError(f"data.max_tokens={d.max_tokens} + SOT + EOT exceeds "
                       f"max_target_positions={self.cfg.max_target_positions}")
    # The symbols' spectra: fixed by the data seed, the same for training and evaluation.
    self.templates = d.amplitude * np.random.default_rng(d.template_seed).normal(
        size=(d.symbols, self.cfg.num_mels))

  def model(self):
    return Whisper(self.cfg)

  def batch(self, rng, size):
    d = self.data
    features, symbols = synthetic.utterances(rng, size, self.cfg.num_frames, self.cfg.num_mels,
                                             d.symbols, d.max_tokens, self.templates, d.noise)
    target = np.zeros((size, d.max_tokens + 2), np.int32)
    target[:, 0] = self.cfg.decoder_start_id
    target[:, 1:-1] = np.where(symbols >= 0, symbols + self.FIRST_SYMBOL, 0)
    ends = (symbols >= 0).sum(axis=1) + 1
    target[np.arange(size), ends] = self.cfg.eos_id
    return {"features": features, "inputs": target[:, :-1], "labels": target[:, 1:]}

  def example(self, batch):
    return batch["features"], batch["inputs"]

  def loss(self, params, batch):
    logits = self.model().apply({"params": params}, batch["features"], batch["inputs"])
    weights = (batch["labels"] != 0).astype(jnp.float32)
    token_loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    loss = jnp.sum(token_loss * weights) / jnp.sum(weights)
    correct = (jnp.argmax(logits, -1) == batch["labels"]) * weights
    return loss, {"loss": loss, "token_accuracy": jnp.sum(correct) / jnp.sum(weights)}

  def evaluate(self, params, batch):
    metrics = self.loss(params, batch)[1]
    labels = batch["labels"]
    decoded = greedy_decode(self.cfg, params, batch["features"], labels.shape[1])[:, 1:]
    # Positions after EOT are padding in the labels and EOT-filled in the decoding.
    match = jnp.all((decoded == labels) | (labels == 0), axis=1)
    return {**metrics, "exact_match": jnp.mean(match)}


class FunnelTask(Task):
  """Masked language modelling on synthetic motifs (synthetic.motifs): ids 0 pad, 1 [CLS]
  (token type 2, as the Funnel tokenizer marks it), 2 [MASK], symbols from 3."""
  name = "funnel"

  def __init__(self, config):
    super().__init__(config)
    self.cfg = FunnelConfig(**dict(config.model)).validated()
    d = self.data
    if not self.cfg.mlm_head:
      raise ValueError("the funnel task predicts masked tokens: set config.model.mlm_head=True")
    if self.cfg.vocab_size < synthetic.FIRST_SYMBOL + d.symbols:
      raise ValueError(f"config.model.vocab_size={self.cfg.vocab_size} < 3 + data.symbols="
                       f"{d.symbols}: raise the vocabulary")
    self.cfg.lengths(d.seq_len)  # the model's error for sequences too short to pool

  def model(self):
    return Funnel(self.cfg)

  def init(self, key):
    # Jitted: op-by-op, the unrolled blocks' init compiles each small op separately (slower).
    return jax.jit(self.model().init)(key, *self.example(self.batch(np.random.default_rng(0), 1)))

  def batch(self, rng, size):
    d = self.data
    inputs, labels, weights = synthetic.motifs(rng, size, d.seq_len, d.symbols,
                                               tuple(d.periods), d.mask_rate)
    types = np.zeros_like(inputs)
    types[:, 0] = 2
    return {"inputs": inputs, "token_types": types, "labels": labels, "weights": weights}

  def example(self, batch):
    return batch["inputs"], None, batch["token_types"]

  def loss(self, params, batch):
    logits = self.model().apply({"params": params}, batch["inputs"],
                                token_type_ids=batch["token_types"])["mlm_logits"]
    w = batch["weights"]
    token_loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    loss = jnp.sum(token_loss * w) / jnp.sum(w)
    correct = (jnp.argmax(logits, -1) == batch["labels"]) * w
    return loss, {"loss": loss, "accuracy": jnp.sum(correct) / jnp.sum(w)}

  def evaluate(self, params, batch):
    return self.loss(params, batch)[1]


TASKS = {t.name: t for t in (ViTTask, CLIPTask, WhisperTask, FunnelTask)}


def build(config) -> Task:
  if config.task not in TASKS:
    raise ValueError(f"config.task={config.task!r} is not a modality task; choose one of "
                     f"{sorted(TASKS)}")
  return TASKS[config.task](config)


def to_host(metrics) -> dict:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}
