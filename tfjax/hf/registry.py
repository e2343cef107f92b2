"""Which Hugging Face architectures tfjax imports and exports, keyed by config.json `model_type`.

Each `Architecture` names its family mapping's functions: `config_from_hf(kind, fields, names)`
(ModelConfig keys; `names` = the checkpoint's tensor names, for optional heads),
`config_to_hf(kind, cfg)`, `rules(cfg, names)` (tfjax/hf/mapping.py Rules),
`droppable(cfg, name)` (checkpoint tensors the model derives rather than stores) and `ignored`
(the family's config.json fields that do not change the model: its module's `IGNORED`, read
together with mapping.IGNORED). An unknown model_type, or a model_type whose tfjax switches do
not exist yet, is an UnsupportedError naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from tfjax.hf.mapping import UnsupportedError
from tfjax.hf.models import (bart, bert, bigbird, falcon, gemma3, gpt2, gpt_neox, llama, longformer,
                             opt, phi, phi3, roberta, t5)
from tfjax.nn.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Architecture:
  model_type: str
  hf_class: str                  # the `architectures` entry export writes (AutoModel* picks it)
  task: str                      # the tfjax task of an imported run: lm | mlm | seq2seq
  config_from_hf: Callable
  config_to_hf: Callable
  rules: Callable                # (cfg, names or None) -> [Rule]
  droppable: Callable
  needs: tuple = ()              # ModelConfig fields this architecture needs
  ignored: frozenset = frozenset()  # its config.json fields that do not change the model


def _plain_rules(module):
  return lambda cfg, names=None: module.rules(cfg)


def _bert_rules(cfg, names=None):
  if names is None:
    return bert.rules(cfg, bert.export_prefix(cfg))
  return bert.rules(cfg, bert._prefix(names))  # pylint: disable=protected-access


def _ignored(module, model_type) -> frozenset:
  return frozenset(module.IGNORED.get(model_type, ()))


def _decoder(model_type, hf_class, module, needs=()):
  return Architecture(model_type, hf_class, "lm", module.config_from_hf, module.config_to_hf,
                      _plain_rules(module), module.droppable, tuple(needs),
                      _ignored(module, model_type))


def _seq2seq(model_type, hf_class, module, needs=()):
  return Architecture(model_type, hf_class, "seq2seq", module.config_from_hf,
                      module.config_to_hf, _plain_rules(module), module.droppable, tuple(needs),
                      _ignored(module, model_type))


ARCHITECTURES = {a.model_type: a for a in (
    _decoder("gpt2", "GPT2LMHeadModel", gpt2, needs=("ffn:gelu_tanh",)),
    _decoder("llama", "LlamaForCausalLM", llama, needs=("rope_scaling",)),
    _decoder("mistral", "MistralForCausalLM", llama),
    _decoder("qwen2", "Qwen2ForCausalLM", llama, needs=("attention_out_bias",)),
    _decoder("qwen3", "Qwen3ForCausalLM", llama, needs=("qk_norm",)),
    _decoder("gemma", "GemmaForCausalLM", llama, needs=("norm_unit_offset", "ffn:geglu_tanh")),
    _decoder("gemma2", "Gemma2ForCausalLM", llama,
             needs=("norm_unit_offset", "attention_softcap", "logits_softcap", "window_pattern",
                    "attention_scale", "norm_placement:sandwich")),
    _decoder("gemma3_text", "Gemma3ForCausalLM", gemma3,
             needs=("rope_local_base", "qk_norm", "window_pattern", "norm_placement:sandwich")),
    _decoder("gpt_neox", "GPTNeoXForCausalLM", gpt_neox,
             needs=("parallel_block", "parallel_shared_norm", "rotary_fraction")),
    _decoder("phi", "PhiForCausalLM", phi,
             needs=("parallel_block", "rotary_fraction", "final_logits_bias")),
    _decoder("falcon", "FalconForCausalLM", falcon,
             needs=("parallel_block", "parallel_shared_norm")),
    _decoder("opt", "OPTForCausalLM", opt, needs=("position_offset",)),
    _decoder("phi3", "Phi3ForCausalLM", phi3, needs=("rotary_fraction",)),
    Architecture("bert", "BertForMaskedLM", "mlm", bert.config_from_hf, bert.config_to_hf,
                 _bert_rules, bert.droppable, ignored=_ignored(bert, "bert")),
    Architecture("big_bird", "BigBirdForMaskedLM", "mlm", bigbird.config_from_hf,
                 bigbird.config_to_hf, bigbird.rules, bigbird.droppable,
                 ignored=_ignored(bigbird, "big_bird")),
    Architecture("roberta", "RobertaForMaskedLM", "mlm", roberta.config_from_hf,
                 roberta.config_to_hf, roberta.rules, roberta.droppable, ("position_offset",),
                 _ignored(roberta, "roberta")),
    Architecture("longformer", "LongformerForMaskedLM", "mlm", longformer.config_from_hf,
                 longformer.config_to_hf, longformer.rules, longformer.droppable,
                 ("position_offset",), _ignored(longformer, "longformer")),
    _seq2seq("bart", "BartForConditionalGeneration", bart,
             ("share_positions", "position_offset", "final_logits_bias")),
    _seq2seq("mbart", "MBartForConditionalGeneration", bart,
             ("share_positions", "position_offset", "final_logits_bias")),
    _seq2seq("marian", "MarianMTModel", bart,
             ("final_logits_bias", "sinusoid_layout", "ffn:silu")),
    _seq2seq("t5", "T5ForConditionalGeneration", t5,
             ("position:t5_bias", "attention_scale", "scale_tied_logits", "ffn:reglu",
              "ffn:geglu_tanh")),
)}


# model_types of the task models (tfjax.hf.modalities mappings; their runs: tfjax/hf/task_runs.py).
MODALITIES = ("vit", "clip", "clip_vision_model", "whisper", "funnel")


def missing_switches(arch: Architecture) -> list:
  """The ModelConfig fields / values `arch` needs that this tfjax does not have yet."""
  from tfjax.nn import config as config_module  # pylint: disable=import-outside-toplevel
  from tfjax.nn.positions import POSITION_KINDS  # pylint: disable=import-outside-toplevel
  fields = set(config_module.FLAT_KEYS)
  choices = {"ffn": config_module.FFNS, "norm_placement": config_module.PLACEMENTS,
             "position": tuple(POSITION_KINDS),
             "sinusoid_layout": config_module.SINUSOID_LAYOUTS}
  missing = []
  for need in arch.needs:
    key, _, value = need.partition(":")
    if key not in fields and key not in choices:
      missing.append(need)
    elif value and value not in choices.get(key, ()):
      missing.append(need)
  return missing


def architecture(model_type: Optional[str]) -> Architecture:
  """The Architecture of a config.json `model_type`, or an UnsupportedError naming it."""
  arch = ARCHITECTURES.get(model_type)
  if model_type in MODALITIES:
    raise UnsupportedError(
        f"Hugging Face model_type {model_type!r} is not a ModelConfig family: it imports as a "
        f"run of its own task (tfjax/hf/task_runs.py, `python -m tfjax.hf import`), and a "
        "text run cannot export as it")
  if arch is None:
    raise UnsupportedError(
        f"Hugging Face model_type {model_type!r} is not supported; tfjax imports "
        f"{sorted(ARCHITECTURES)}")
  missing = missing_switches(arch)
  if missing:
    raise UnsupportedError(
        f"Hugging Face model_type {model_type!r} needs model config switch(es) {missing} that "
        "this version of tfjax does not have yet (not supported yet)")
  return arch
