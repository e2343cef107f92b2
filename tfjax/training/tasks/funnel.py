"""The Funnel Transformer (tfjax/nn/funnel.py): masked language modelling (config.task='funnel',
FunnelForMaskedLM's layout) and sequence classification (config.task='funnel_classification',
FunnelForSequenceClassification's head on token 0).

Batch: inputs [B, L], token_type_ids [B, L] ([CLS] has type 2, as the Funnel tokenizer marks it);
MLM adds targets [B, L] and weights [B, L] (1 at masked positions), classification labels [B].

Synthetic data (data.name='synthetic', tfjax/modalities/synthetic.py): rows of data.seq_len
tokens, [CLS] then a random motif of data.num_symbols symbols repeated with a period drawn from
data.periods; MLM masks data.mask_rate of the tokens (a masked token is recoverable from a copy
one period away). Classification rows are [CLS] then data.seq_len - 1 tokens, 60% of them from
the label's group of the data.num_symbols symbols (split into data.classes groups), the rest
from all; the label is the dominating group (`dominant`).
"""

from __future__ import annotations

import numpy as np

from tfjax.modalities import synthetic
from tfjax.nn.funnel import Funnel, FunnelConfig
from tfjax.training.tasks.own_model import OwnModelTask, SyntheticRows
from tfjax.training.tasks.registry import register_dataset, register_task
from tfjax.training.tasks.text import class_statistics, summed_statistics


class FunnelMLMTask(OwnModelTask):
  name, family = "funnel", "funnel"
  config_class = FunnelConfig

  def default_model(self):
    return FunnelConfig(mlm_head=True)

  def model_section(self):
    section = super().model_section()
    section.block_repeats = ()  # () = 1 per block, whatever block_sizes a config sets
    return section

  def data_section(self) -> dict:
    return {"periods": (3, 4, 5), "mask_rate": 0.15}

  def check(self, config, model_cfg) -> None:
    if not model_cfg.mlm_head:
      raise ValueError("the funnel task predicts masked tokens: set config.model.mlm_head=True")
    self._check_data(config, model_cfg)

  def _check_data(self, config, model_cfg) -> None:
    d = config.data
    if d.name == "synthetic" and model_cfg.vocab_size < synthetic.FIRST_SYMBOL + d.num_symbols:
      raise ValueError(f"config.model.vocab_size={model_cfg.vocab_size} < 3 + data.num_symbols="
                       f"{d.num_symbols}: raise the vocabulary")
    model_cfg.lengths(d.seq_len)  # the model's error for sequences too short to pool

  def build_model(self, model_cfg, deterministic: bool = True):
    return Funnel(model_cfg)

  def example_batch(self, model_cfg):
    inputs = np.zeros((1, 2 ** len(model_cfg.block_sizes)), np.int32)  # long enough to pool
    return {"inputs": inputs, "token_type_ids": _token_types(inputs)}

  def model_inputs(self, batch):
    return (batch["inputs"],), {"token_type_ids": batch["token_type_ids"]}

  def row_lengths(self, batch):
    return int(np.shape(batch["inputs"])[1]), None

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    out = model.apply({"params": params}, batch["inputs"],
                      token_type_ids=batch["token_type_ids"], rngs=rngs or {})
    return summed_statistics(out["mlm_logits"], batch["targets"], batch["weights"],
                             label_smoothing)


class FunnelClassificationTask(FunnelMLMTask):
  name = "funnel_classification"

  def default_model(self):
    return FunnelConfig(decoder=False, num_decoder_layers=0, num_classes=3)

  def data_section(self) -> dict:
    return {"classes": 3}

  def check(self, config, model_cfg) -> None:
    if model_cfg.mlm_head or not model_cfg.num_classes:
      raise ValueError("funnel_classification predicts one class per row: set "
                       "config.model.mlm_head=False and config.model.num_classes > 0")
    if config.data.name == "synthetic" and model_cfg.num_classes != config.data.classes:
      raise ValueError(f"config.model.num_classes={model_cfg.num_classes} differs from "
                       f"config.data.classes={config.data.classes}; set them equal")
    self._check_data(config, model_cfg)

  def forward(self, model, params, batch, label_smoothing=0.0, rngs=None):
    out = model.apply({"params": params}, batch["inputs"],
                      token_type_ids=batch["token_type_ids"], rngs=rngs or {})
    return class_statistics(out["logits"], batch["labels"], batch.get("weights"),
                            label_smoothing)


def _token_types(inputs):
  types = np.zeros_like(inputs)
  types[:, 0] = 2
  return types


def synthetic_motifs(config, workdir=None):
  del workdir
  d = config.data
  periods = tuple(d.periods)

  def rows(rng, count):
    inputs, labels, weights = synthetic.motifs(rng, count, d.seq_len, d.num_symbols, periods,
                                               d.mask_rate)
    return {"inputs": inputs, "token_type_ids": _token_types(inputs), "targets": labels,
            "weights": weights}
  return SyntheticRows(rows, d.seed, d.eval_seed)


def synthetic_dominant(config, workdir=None):
  del workdir
  d = config.data

  def rows(rng, count):
    inputs, labels = synthetic.dominant(rng, count, d.seq_len, d.num_symbols, d.classes)
    return {"inputs": inputs, "token_type_ids": _token_types(inputs), "labels": labels}
  return SyntheticRows(rows, d.seed, d.eval_seed)


register_task(FunnelMLMTask())
register_task(FunnelClassificationTask())
register_dataset("funnel", "synthetic", synthetic_motifs)
register_dataset("funnel_classification", "synthetic", synthetic_dominant)
