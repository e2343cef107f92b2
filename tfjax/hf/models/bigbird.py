"""BigBird (`model_type` big_bird): BigBirdForMaskedLM / BigBirdForPreTraining / BigBirdModel.

BERT's encoder, embeddings and MLM head under BERT's tensor names (tfjax/hf/models/bert.py), with
the pooler as one Linear (`pooler.weight`, BERT's `pooler.dense.weight`), biases of Q, K, V by
`use_bias` (the output projection always has one), `rescale_embeddings` as model.embed_scale, and
the attention by `attention_type`:
  block_sparse   model.attention_kind='bigbird' (tfjax/nn/kinds/bigbird.py) with block_size,
                 num_random_blocks, and bigbird_random='hf', bigbird_seed=0: transformers'
                 random blocks (layer l seeded with l while training, block 0 in model.eval()),
                 so the imported model computes what transformers computes in both modes;
  original_full  softmax attention (model.attention_kind='softmax').
Export writes the same fields back; a bigbird run with bigbird_random='seeded' or another seed
computes something transformers does not, and the exporter's config round trip refuses it.

hidden_act sets the FFN's and the MLM head's activation (model.ffn, model.mlm_activation), as
in BERT; the released google/bigbird-roberta-* use gelu_new (tanh GELU), also BigBirdConfig's
default when the field is absent.
"""

from __future__ import annotations

from tfjax.hf import mapping
from tfjax.hf.models import bert
from tfjax.hf.mapping import Fields, UnsupportedError
from tfjax.nn.config import ModelConfig

# config.json fields that do not change the model beyond mapping.IGNORED: none (sep_token_id and
# classifier_dropout are in it; bigbird-roberta-base's config.json reads through this mapping).
IGNORED = {"big_bird": frozenset()}
ATTENTION_TYPES = {"block_sparse": "bigbird", "original_full": "softmax"}
POOLER = {"pooler.dense.weight": "pooler.weight", "pooler.dense.bias": "pooler.bias"}


def _to_bigbird(name: str) -> str:
  """BERT's tensor name -> BigBird's (the pooler differs)."""
  for old, new in POOLER.items():
    if name.endswith(old):
      return name[:-len(old)] + new
  return name


def _as_bert(names: set) -> set:
  out = set(names)
  for old, new in POOLER.items():
    out |= {n[:-len(new)] + old for n in names if n.endswith(new)}
  return out


def config_from_hf(kind: str, f: Fields, names: set) -> dict:
  attention = f.expect("attention_type", tuple(ATTENTION_TYPES), "block_sparse")
  block_size = f.get("block_size", 64)
  num_random = f.get("num_random_blocks", 3)
  act = bert.ACTS.get(f.get("hidden_act", "gelu_new"))  # BigBirdConfig's default
  cfg = bert.config_from_hf(kind, f, _as_bert(names))  # refuses an unknown hidden_act
  cfg.update(ffn=act, mlm_activation=act)
  cfg.update(attention_bias=bool(f.get("use_bias", True)), attention_out_bias=True,
             embed_scale=bool(f.get("rescale_embeddings", False)),
             attention_kind=ATTENTION_TYPES[attention])
  if attention == "block_sparse":
    cfg.update(bigbird_block_size=block_size, bigbird_num_random_blocks=num_random,
               bigbird_random="hf", bigbird_seed=0)
  return cfg


def config_to_hf(kind: str, cfg: ModelConfig) -> dict:
  out = bert.config_to_hf(kind, cfg)
  attention = {v: k for k, v in ATTENTION_TYPES.items()}.get(cfg.attention.kind)
  if attention is None:
    raise UnsupportedError(f"big_bird has no attention for model.attention_kind="
                           f"{cfg.attention.kind!r} (bigbird or softmax)")
  out.update(model_type="big_bird", attention_type=attention, use_bias=cfg.attention.bias,
             rescale_embeddings=cfg.embed_scale)
  if attention == "block_sparse":
    kind_cfg = cfg.attention.kind_config
    out.update(block_size=kind_cfg.block_size, num_random_blocks=kind_cfg.num_random_blocks)
  return out


def rules(cfg: ModelConfig, names=None) -> list:
  if names is None:
    prefix = bert.export_prefix(cfg)
  else:
    prefix = bert._prefix(_as_bert(names))  # pylint: disable=protected-access
  out = []
  for rule in bert.rules(cfg, prefix):
    out.append(mapping.Rule(tuple(_to_bigbird(n) for n in rule.hf), rule.tfjax, rule.to_tfjax,
                            rule.to_hf))
  return out


def droppable(cfg: ModelConfig, name: str) -> bool:
  """BERT's: the tied decoder and its bias, position/token-type id buffers, the NSP head."""
  return bert.droppable(cfg, name) or name.endswith("token_type_ids")
