"""Synthetic data for the modality front-ends: each is a task a model can only solve by reading
its input, with a known chance level, generated from a seed (no files, no network).

  stripes     images of oriented sinusoidal gratings: class k has orientation k*pi/K (and, for
              K > 4, one of two spatial frequencies), a random phase and Gaussian noise, so the
              class is a property of the patches' arrangement, not of any one pixel.
  captions    the "text" of a stripes class for CLIP: the class's attribute tokens at random
              positions among filler tokens, ended by EOS; pooled at EOS as HF CLIP pools.
  utterances  log-mel-like features of a short transcript for Whisper: each token is a fixed
              random spectral template held for a few frames (random durations), plus noise;
              the target is [SOT, tokens..., EOT].
  motifs      token sequences repeating a random motif, some tokens masked, for the Funnel
              Transformer's masked language modelling (recover a token from a copy one period
              away).
"""

from __future__ import annotations

import numpy as np


def stripes(rng: np.random.Generator, batch: int, size: int, channels: int, classes: int,
            noise: float = 0.5):
  """(images [B, size, size, C] float32, labels [B] int32)."""
  labels = rng.integers(0, classes, size=batch)
  orientations = 4 if classes > 4 else classes
  theta = np.pi * (labels % orientations) / orientations
  freq = np.where(labels // orientations == 0, 2.0, 4.0) / size  # cycles per pixel
  phase = rng.uniform(0, 2 * np.pi, size=batch)
  ys, xs = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
  proj_BxHxW = (xs[None] * np.cos(theta)[:, None, None] + ys[None] * np.sin(theta)[:, None, None])
  wave_BxHxW = np.sin(2 * np.pi * freq[:, None, None] * proj_BxHxW + phase[:, None, None])
  images = wave_BxHxW[..., None] + noise * rng.normal(size=(batch, size, size, channels))
  return images.astype(np.float32), labels.astype(np.int32)


# Token ids of the synthetic captions: 0 pad, 1 BOS, 3 EOS, then attribute tokens, then filler.
PAD, BOS, EOS, FIRST_ATTRIBUTE = 0, 1, 3, 4


def captions(rng: np.random.Generator, labels, length: int, vocab: int, classes: int):
  """Token ids [B, length]: BOS, the label's orientation and frequency tokens at random places
  among filler tokens, EOS, then padding. EOS is id 3, not 2: HF CLIP reads eos_token_id 2 as
  the legacy "pool at the largest id" rule (tfjax/nn/clip.py), any other id as "first EOS"."""
  orientations = 4 if classes > 4 else classes
  filler_first = FIRST_ATTRIBUTE + orientations + 2
  if vocab <= filler_first or length < 5:
    raise ValueError(f"captions need vocab > {filler_first} and length >= 5, got vocab={vocab}, "
                     f"length={length}")
  batch = len(labels)
  ids = np.full((batch, length), PAD, np.int32)
  for b, label in enumerate(labels):
    words = int(rng.integers(2, length - 1))  # tokens between BOS and EOS
    row = list(rng.integers(filler_first, vocab, size=words))
    where = rng.choice(words, size=2, replace=False)
    row[where[0]] = FIRST_ATTRIBUTE + label % orientations
    row[where[1]] = FIRST_ATTRIBUTE + orientations + label // orientations
    ids[b, :words + 2] = [BOS] + row + [EOS]
  return ids


def utterances(rng: np.random.Generator, batch: int, frames: int, mels: int, symbols: int,
               max_tokens: int, templates, noise: float = 0.3):
  """(features [B, frames, mels] float32, tokens [B, max_tokens] int32 (symbol ids 0..symbols-1,
  -1 padding)). `templates` [symbols, mels] is the fixed spectrum of each symbol."""
  features = noise * rng.normal(size=(batch, frames, mels))
  tokens = np.full((batch, max_tokens), -1, np.int32)
  for b in range(batch):
    count = int(rng.integers(1, max_tokens + 1))
    row = rng.integers(0, symbols, size=count)
    tokens[b, :count] = row
    # Split the frames into `count` segments of random (>= 1 frame) lengths.
    cuts = np.sort(rng.choice(np.arange(1, frames), size=count - 1, replace=False))
    bounds = np.concatenate([[0], cuts, [frames]])
    for symbol, start, end in zip(row, bounds[:-1], bounds[1:]):
      features[b, start:end] += templates[symbol]
  return features.astype(np.float32), tokens


# Token ids of the synthetic motif sequences (Funnel MLM): 0 pad, 1 [CLS], 2 [MASK], symbols from 3.
CLS, MASK, FIRST_SYMBOL = 1, 2, 3


def motifs(rng: np.random.Generator, batch: int, length: int, symbols: int, periods,
           mask_rate: float):
  """(inputs [B, length], labels [B, length], weights [B, length]) for masked language modelling:
  [CLS] then a random motif of `symbols` symbols, its period drawn from `periods`, repeated to
  fill the row; `mask_rate` of the non-[CLS] tokens (at least one) replaced by [MASK], their
  labels the original ids (weight 1). A masked token is recoverable from a copy one period away,
  so a model must attend by relative position (chance: 1 / symbols)."""
  labels = np.zeros((batch, length), np.int32)
  for b in range(batch):
    period = int(rng.choice(periods))
    motif = rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + symbols, size=period)
    labels[b, 1:] = np.resize(motif, length - 1)
  labels[:, 0] = CLS
  masked = rng.random((batch, length)) < mask_rate
  masked[:, 0] = False
  masked[np.arange(batch), rng.integers(1, length, size=batch)] = True
  inputs = np.where(masked, MASK, labels).astype(np.int32)
  return inputs, labels, masked.astype(np.float32)



def dominant(rng: np.random.Generator, batch: int, length: int, symbols: int, classes: int,
             share: float = 0.6):
  """(inputs [B, length], labels [B]) for sequence classification: [CLS] then tokens of which
  `share` come from the label's group of symbols (the `symbols` split into `classes` groups) and
  the rest from all symbols, shuffled. The class is a property of the whole row (which group
  dominates), not of any one token (chance: 1 / classes)."""
  if symbols < classes:
    raise ValueError(f"data.num_symbols={symbols} < data.classes={classes}: each class needs "
                     "at least one symbol of its own")
  labels = rng.integers(0, classes, size=batch).astype(np.int32)
  groups = np.array_split(np.arange(symbols), classes)
  inputs = np.zeros((batch, length), np.int32)
  inputs[:, 0] = CLS
  for b, label in enumerate(labels):
    own = rng.random(length - 1) < share
    row = np.where(own, rng.choice(groups[label], size=length - 1),
                   rng.integers(0, symbols, size=length - 1))
    inputs[b, 1:] = FIRST_SYMBOL + row
  return inputs, labels
