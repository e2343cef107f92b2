"""The vocabulary of every family mapping: tensor rules and a strict reader of config fields.

A `Rule` ties one or more Hugging Face tensors to one or more tfjax parameters with a pair of
inverse functions (import: HF arrays -> tfjax arrays; export: the other way). Most rules are one
tensor to one parameter (a transpose, a reshape into heads); GPT-2's fused QKV is one tensor to
three parameters. The importer and exporter only walk the rules, so a family is fully described
by its config translation and its rule list.

`Fields` reads a `config.json` strictly: each field is taken (mapped to tfjax), checked against
the values tfjax can express, or explicitly ignored (it does not change the forward pass:
dropout rates, generation defaults, token ids). A field none of these name is an error that
names it, so an unknown option can never silently give a different model.

Layouts (shape letters as in tfjax/nn/axes.py): a torch `nn.Linear` weight is [out, in]; tfjax
kernels are [in, out], attention projections [D, heads, E] and the output projection [heads, E, D].
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from tfjax.nn import sections

Path = tuple  # a tfjax parameter path, e.g. ("decoder", "layers_0", "ffn", "wi", "kernel")


# A checkpoint or config that tfjax cannot express exactly (named in the message); defined in nn so
# the config sections' own Hugging Face conversions raise it too.
UnsupportedError = sections.UnsupportedError


@dataclasses.dataclass(frozen=True)
class Rule:
  """HF tensors `hf` <-> tfjax parameters `tfjax`; `to_tfjax` and `to_hf` map lists of arrays."""
  hf: tuple
  tfjax: tuple
  to_tfjax: Callable[[list], list]
  to_hf: Callable[[list], list]


def _one(fn):
  return lambda arrays: [fn(arrays[0])]


def copy(hf: str, path: Path) -> Rule:
  """Same layout on both sides (embeddings, norm gains, biases of dense layers)."""
  return Rule((hf,), (path,), _one(lambda a: a), _one(lambda a: a))


def linear(hf: str, path: Path) -> Rule:
  """torch Linear weight [out, in] <-> Dense kernel [in, out]."""
  return Rule((hf,), (path,), _one(lambda w: w.T), _one(lambda k: k.T))


def conv1d(hf: str, path: Path) -> Rule:
  """GPT-2's Conv1D weight is already [in, out]."""
  return copy(hf, path)


def heads_in(hf: str, path: Path, heads: int, transposed: bool = True) -> Rule:
  """Q/K/V projection: Linear [heads*E, D] (or Conv1D [D, heads*E] with transposed=False) <->
  kernel [D, heads, E]."""
  def to_tfjax(w):
    w = w.T if transposed else w
    return w.reshape(w.shape[0], heads, -1)

  def to_hf(k):
    w = k.reshape(k.shape[0], -1)
    return w.T if transposed else w
  return Rule((hf,), (path,), _one(to_tfjax), _one(to_hf))


def heads_out(hf: str, path: Path, heads: int, transposed: bool = True) -> Rule:
  """Output projection: Linear [D, heads*E] (Conv1D [heads*E, D]) <-> kernel [heads, E, D]."""
  def to_tfjax(w):
    w = w.T if transposed else w
    return w.reshape(heads, -1, w.shape[-1])

  def to_hf(k):
    w = k.reshape(-1, k.shape[-1])
    return w.T if transposed else w
  return Rule((hf,), (path,), _one(to_tfjax), _one(to_hf))


def heads_bias(hf: str, path: Path, heads: int) -> Rule:
  """Q/K/V bias [heads*E] <-> [heads, E]."""
  return Rule((hf,), (path,), _one(lambda b: b.reshape(heads, -1)),
              _one(lambda b: b.reshape(-1)))


def fused(hf: str, paths: Sequence[Path], heads: int, weight: bool) -> Rule:
  """GPT-2 c_attn: Conv1D weight [D, 3*heads*E] (or bias [3*heads*E]) <-> query, key, value
  kernels [D, heads, E] (biases [heads, E])."""
  def to_tfjax(arrays):
    parts = np.split(arrays[0], len(paths), axis=-1)
    if weight:
      return [p.reshape(p.shape[0], heads, -1) for p in parts]
    return [p.reshape(heads, -1) for p in parts]

  def to_hf(arrays):
    flat = [a.reshape(a.shape[0], -1) if weight else a.reshape(-1) for a in arrays]
    return [np.concatenate(flat, axis=-1)]
  return Rule((hf,), tuple(paths), to_tfjax, to_hf)


def row_vector(hf: str, path: Path) -> Rule:
  """A [1, V] buffer (BART/Marian final_logits_bias) <-> a [V] parameter."""
  return Rule((hf,), (path,), _one(lambda a: a.reshape(-1)), _one(lambda a: a.reshape(1, -1)))


# ---- config.json ------------------------------------------------------------------------------

# Fields of every family that never change the forward pass of the imported weights: bookkeeping,
# generation defaults, cache settings, token ids (kept with the tokenizer), training-time dropout
# and initialization, task-head label maps. A family's own ignorable fields (legacy names, task-head
# settings it has no head for) are listed beside its mapping (`IGNORED` in tfjax/hf/<family>.py).
IGNORED = frozenset("""
_name_or_path architectures model_type transformers_version dtype torch_dtype use_cache
bos_token_id eos_token_id pad_token_id sep_token_id cls_token_id mask_token_id unk_token_id
decoder_start_token_id forced_bos_token_id forced_eos_token_id
output_attentions output_hidden_states return_dict chunk_size_feed_forward problem_type
id2label label2id tokenizer_class prefix task_specific_params finetuning_task
is_encoder_decoder tie_encoder_decoder torchscript pruned_heads
max_length min_length num_beams num_beam_groups early_stopping no_repeat_ngram_size
length_penalty repetition_penalty temperature top_k top_p do_sample bad_words_ids
num_return_sequences diversity_penalty encoder_no_repeat_ngram_size typical_p
exponential_decay_length_penalty suppress_tokens begin_suppress_tokens
remove_invalid_values output_scores return_dict_in_generate forced_decoder_ids
initializer_range init_std initializer_factor
attention_dropout attn_pdrop embd_pdrop resid_pdrop summary_first_dropout dropout dropout_rate
activation_dropout hidden_dropout_prob attention_probs_dropout_prob classifier_dropout
encoder_layerdrop decoder_layerdrop layerdrop
gradient_checkpointing _attn_implementation_autoset attn_implementation pretraining_tp
output_past cache_implementation num_labels _num_labels auto_map custom_pipelines
""".split())


class Fields:
  """Strict reading of a Hugging Face config.json (see the module docstring)."""

  def __init__(self, values: dict, arch: str, ignored=()):
    """`ignored`: the family's own fields that do not change the model (beside IGNORED)."""
    self.values, self.arch = dict(values), arch
    self._seen = set(IGNORED) | set(ignored)

  def get(self, key: str, default: Any = None) -> Any:
    """The field's value (or `default`), marked as understood."""
    self._seen.add(key)
    return self.values.get(key, default)

  def require(self, key: str) -> Any:
    self._seen.add(key)
    if key not in self.values:
      raise UnsupportedError(f"{self.arch} config.json has no field {key!r}, which it needs")
    return self.values[key]

  def expect(self, key: str, allowed: Sequence, default: Any = None) -> Any:
    """The field's value, which must be one of `allowed` (a value tfjax can express)."""
    value = self.get(key, default)
    if value not in allowed:
      raise UnsupportedError(
          f"{self.arch} config.json field {key}={value!r} is not supported by tfjax's "
          f"importer (supported: {list(allowed)})")
    return value

  def ignore(self, *keys: str) -> None:
    self._seen.update(keys)

  def finish(self) -> None:
    """Raises for any field that was neither mapped, checked nor ignored."""
    unknown = sorted(set(self.values) - self._seen)
    if unknown:
      shown = ", ".join(f"{k}={self.values[k]!r}" for k in unknown)
      raise UnsupportedError(
          f"{self.arch} config.json has field(s) the tfjax importer does not understand: {shown}. "
          "They may change the model, so the import stops rather than guess.")


# Config fields an export copies from the imported source (token ids and bookkeeping); the text
# exporter's and the task runs' (tfjax/hf/task_runs.py) alike.
KEPT_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
               "forced_bos_token_id", "forced_eos_token_id", "sep_token_id")


def special_ids(config: dict, generation: dict) -> dict:
  """Token ids the tokenizer wrapper keeps (generation_config.json wins over config.json)."""
  def first(key):
    value = generation.get(key, config.get(key))
    return value[0] if isinstance(value, list) and value else value
  return {"bos_id": first("bos_token_id"), "eos_id": first("eos_token_id"),
          "pad_id": first("pad_token_id"), "decoder_start_id": first("decoder_start_token_id")}
