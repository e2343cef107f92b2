"""RoBERTa: BERT's encoder and MLM head under other names, with positions offset by the pad id.

transformers numbers a token's position from padding_idx + 1 (= pad_token_id + 1, 2 in the
released models), so the table has max_position_embeddings = max_len + pad + 1 rows and
position p reads row p + pad + 1 (tfjax `position_offset`). transformers counts p over the
non-pad tokens only, so the two agree on inputs whose pad tokens come last (right padding);
the encoder layers are BERT's (tfjax/hf/models/bert.py), the MLM head is `lm_head` (dense, GELU,
LayerNorm, tied decoder, bias): exact GELU whatever hidden_act says (RobertaLMHead's `gelu`).
"""

from __future__ import annotations

import dataclasses

from tfjax.hf.models import bert
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig

# config.json fields RobertaForMaskedLM does not read: none beyond mapping.IGNORED.
IGNORED = {"roberta": frozenset()}
# BERT's MLM-head tensor names -> RoBERTa's.
HEAD_NAMES = {"cls.predictions.transform.dense.weight": "lm_head.dense.weight",
              "cls.predictions.transform.dense.bias": "lm_head.dense.bias",
              "cls.predictions.transform.LayerNorm.weight": "lm_head.layer_norm.weight",
              "cls.predictions.transform.LayerNorm.bias": "lm_head.layer_norm.bias",
              "cls.predictions.bias": "lm_head.bias"}


def _prefix(names) -> str:
  return "roberta." if "roberta.embeddings.word_embeddings.weight" in names else ""


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  as_bert = {HEAD_NAMES.get(n, n) for n in names}
  as_bert |= {k for k, v in HEAD_NAMES.items() if v in names}
  prefix = _prefix(names)
  as_bert |= {"bert." + n[len(prefix):] for n in names if prefix and n.startswith(prefix)}
  cfg = bert.config_from_hf(kind, f, as_bert)
  offset = int(f.get("pad_token_id", 1)) + 1
  cfg.update(max_len=cfg["max_len"] - offset, position_offset=offset, mlm_activation="gelu")
  return cfg


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  if cfg.mlm_head and cfg.mlm_activation != "gelu":
    raise UnsupportedError(f"model.mlm_activation={cfg.mlm_activation!r}: {kind}'s MLM head "
                           "applies exact GELU whatever hidden_act says; set it to 'gelu'")
  # bert's check (head and FFN share hidden_act) does not hold here: hand it the FFN's.
  out = bert.config_to_hf(kind, dataclasses.replace(
      cfg, mlm_activation=cfg.feed_forward.activation))
  out.update(model_type="roberta", max_position_embeddings=cfg.position_table_rows,
             pad_token_id=cfg.positions.offset - 1)
  return out


def rules(cfg: ModelConfig, names=None) -> list:
  prefix = ("roberta." if cfg.mlm_head else "") if names is None else _prefix(names)
  out = []
  for rule in bert.rules(cfg, prefix):
    (name,) = rule.hf
    out.append(dataclasses.replace(rule, hf=(HEAD_NAMES.get(name, name),)))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """The tied decoder (and its bias, a second name of lm_head.bias), position-id buffers."""
  del cfg
  return name in ("lm_head.decoder.weight", "lm_head.decoder.bias") or name.endswith(
      ("position_ids", "token_type_ids"))
