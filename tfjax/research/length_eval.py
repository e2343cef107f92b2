"""Perplexity of a trained language model at longer contexts than it was trained on.

Press et al. 2021 ("Train Short, Test Long", section 2 and appendix B) score one validation text
with contexts T = multiple x L, L the training context (data.seq_len), in two ways:
  nonoverlap  the text cut into consecutive windows of T tokens; a token at offset i of its window
              is predicted from the i tokens before it (on average T/2 of context)
  sliding     windows of T tokens advanced by a stride S (T/4 by default); each window scores only
              its last S tokens (the first window scores all), so every token but the first T-S
              is predicted from at least T-S tokens of context
Every target is scored exactly once in both, and the same targets at every T (a whole number of
the longest windows), so the perplexities compare across T. Learned absolute positions have no
embedding past model.max_len: those lengths are None (n/a).

`perplexity_vs_length(workdir)` returns {'long/ppl_nonoverlap@T', 'long/ppl_sliding@T',
'long/tokens'}: the metric names the position ablation's sweep reports
(configs/ablations/position.py). The CLI is experiments/eval_length.py.

RoPE context extension without fine-tuning (`rope_scalings`): a RoPE model trained at L is also
scored with each model.rope_scaling applied at evaluation time, as 'long/ppl_{mode}_{kind}@T':
  linear   position interpolation (Chen et al. 2023) with factor T / L: positions 0..T-1 rotate as
           0..L-1 did (Chen et al. then fine-tune for 1000 steps; scored here without)
  dynamic  dynamic NTK-aware scaling (factor 1): the base grows as (T / L)^(d / (d - 2)) once T > L
  yarn     YaRN (Peng et al. 2023) with factor T / L and original length L
At T = L every scaling is the identity, so those columns equal the unscaled ones.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional, Sequence

import numpy as np

RESULT_FILE = "length_eval.json"  # what the CLI writes into the run directory
_MAX_MEAN_NLL = 50.0              # exp() of a diverged model's loss stays a finite float


def scoring_windows(num_targets: int, length: int, stride: int):
  """(starts, first_scored) of windows of `length` inputs covering targets 1..num_targets.

  Window w has inputs tokens[s : s+length] and targets tokens[s+1 : s+length+1]; it scores the
  targets from offset first_scored[w] on. Windows end at length, length+stride, ..., and a last one
  ending exactly at num_targets, so every target is scored once.
  """
  if length < 1 or stride < 1:
    raise ValueError(f"window length ({length}) and stride ({stride}) must be >= 1")
  if num_targets < length:
    raise ValueError(f"{num_targets} targets are fewer than one window of {length}")
  ends = list(range(length, num_targets + 1, stride))
  if ends[-1] != num_targets:
    ends.append(num_targets)
  starts = np.asarray(ends) - length
  previous_end = np.asarray([0] + ends[:-1])
  return starts, previous_end - starts  # offset of the first target not yet scored


def window_batches(tokens, starts, first_scored, length: int, rows: int) -> Iterator[dict]:
  """Batches of `rows` windows: inputs, targets [rows, length] and weights (1 on the scored
  targets). The last batch is padded with weight-0 rows, so one compiled shape serves all."""
  offsets_L = np.arange(length)
  for b in range(0, len(starts), rows):
    s, f = starts[b:b + rows], first_scored[b:b + rows]
    pad = rows - len(s)
    s, f = np.concatenate([s, np.zeros(pad, int)]), np.concatenate([f, np.full(pad, length)])
    index_BxL = s[:, None] + offsets_L[None, :]
    yield {"inputs": tokens[index_BxL].astype(np.int32),
           "targets": tokens[index_BxL + 1].astype(np.int32),
           "weights": (offsets_L[None, :] >= f[:, None]).astype(np.float32)}


ROPE_EXTENSIONS = ("linear", "dynamic", "yarn")


def extends_rope(cfg) -> bool:
  """Whether `cfg`'s position kind is RoPE (so the rope_scalings apply at evaluation)."""
  from tfjax.nn.positions import position_kind  # pylint: disable=import-outside-toplevel
  return position_kind(cfg).rotary


def has_positions_at(cfg, length: int) -> bool:
  """Whether `cfg` embeds positions up to `length` (a learned table stops at model.max_len)."""
  from tfjax.nn.positions import position_kind  # pylint: disable=import-outside-toplevel
  return not (position_kind(cfg).learned_table and length > cfg.max_len)


def context_lengths(multiples: Sequence[float], seq_len: int) -> list[int]:
  """multiple x seq_len for each multiple, each a whole number of tokens (1.25 x 64 = 80), so
  that lengths between L and 2L can be scored; a fraction of a token is a ValueError."""
  lengths = []
  for m in multiples:
    length = m * seq_len
    if length != int(length):
      raise ValueError(f"context {m} x {seq_len} = {length} is not a whole number of tokens; "
                       "choose multiples that give whole lengths")
    lengths.append(int(length))
  return lengths


def rope_extension_config(cfg, kind: str, length: int, trained_length: int):
  """`cfg` (a RoPE model trained at `trained_length`) with model.rope_scaling `kind` for scoring
  windows of `length` tokens (see the module docstring)."""
  from tfjax.nn.choices import one_of  # pylint: disable=import-outside-toplevel
  one_of("rope extension", kind, ROPE_EXTENSIONS)
  if not extends_rope(cfg) or cfg.positions.rope.scaling != "none":
    raise ValueError(f"RoPE extension {kind!r} rescales an unscaled RoPE model; this run has "
                     f"model.position={cfg.positions.kind!r}, "
                     f"rope_scaling={cfg.positions.rope.scaling!r}")
  factor = max(1.0, length / trained_length)
  if kind == "linear":
    return cfg.replace(rope_scaling="linear", rope_scaling_factor=factor)
  if kind == "dynamic":
    return cfg.replace(rope_scaling="dynamic", rope_original_max_len=trained_length)
  return cfg.replace(rope_scaling="yarn", rope_scaling_factor=factor,  # kind == "yarn"
                     rope_original_max_len=trained_length)


def perplexity_vs_length(workdir: str, multiples: Sequence[int] = (1, 2, 4, 8),
                         max_tokens: Optional[int] = 16384, stride_fraction: float = 0.25,
                         rows: Optional[int] = None, run=None,
                         rope_scalings: Sequence[str] = ()) -> dict:
  """{'long/ppl_nonoverlap@T', 'long/ppl_sliding@T', 'long/tokens'} for T = multiple x seq_len,
  and 'long/ppl_{mode}_{kind}@T' for each kind in `rope_scalings` (RoPE runs only: other runs
  return just the unscaled keys).

  Scores the first `max_tokens` targets of the run's validation split (None: all of it), rounded
  down to a whole number of the longest windows, `rows` windows per call (default: the run's
  eval_batch_size). `run`: the run's (config, experiment, params) if already restored
  (tfjax.research.sweep.restore_run); otherwise the newest checkpoint in `workdir` is restored.
  """
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.training import tasks  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel

  if not multiples or any(not m >= 1 for m in multiples):
    raise ValueError(f"multiples must be >= 1 (contexts of at least the training one), got "
                     f"{list(multiples)}")
  if not 0 < stride_fraction <= 1:
    raise ValueError(f"stride_fraction must be in (0, 1], got {stride_fraction}")
  if run is None:
    # jax only when needed
    from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
    restored = runs.restore_run(workdir)  # has the experiment's model_config and dataset
    config, exp, params = restored.config, restored, restored.params
  else:
    config, exp, params = run
  if config.task != "lm" or not hasattr(exp.dataset, "val_tokens"):
    raise ValueError(f"{workdir}: length evaluation needs a text language-model run "
                     f"(task 'lm' on text data), got task {config.task!r} on {config.data.name!r}")
  cfg = exp.model_config
  lengths = context_lengths(multiples, config.data.seq_len)
  tokens = np.asarray(exp.dataset.val_tokens)
  available = len(tokens) - 1 if max_tokens is None else min(max_tokens, len(tokens) - 1)
  num_targets = available // max(lengths) * max(lengths)
  if num_targets == 0:
    raise ValueError(f"the validation split ({len(tokens)} tokens) is shorter than one window "
                     f"of {max(lengths)}; use smaller multiples or a larger validation split")
  rows = rows or config.train.eval_batch_size
  extensions = [""]
  if extends_rope(cfg):
    extensions += [f"_{kind}" for kind in rope_scalings]

  def scorer(suffix, length):
    model_cfg = cfg if not suffix else rope_extension_config(cfg, suffix[1:], length,
                                                             config.data.seq_len)
    model = build_model(model_cfg)
    return jax.jit(lambda p, batch: tasks.forward(model, p, batch, "lm"))

  out = {"long/tokens": num_targets}
  with nn.logical_axis_rules(()):  # the restored params are on this host: no sharding rules
    for suffix in extensions:
      for length in lengths:
        step = scorer(suffix, length)
        for mode, stride in (("nonoverlap", length),
                             ("sliding", max(1, int(length * stride_fraction)))):
          key = f"long/ppl_{mode}{suffix}@{length}"
          if not has_positions_at(cfg, length):
            out[key] = None  # no position embedding exists past the table
            continue
          starts, first = scoring_windows(num_targets, length, stride)
          loss = count = 0.0
          for batch in window_batches(tokens, starts, first, length, rows):
            stats = jax.device_get(step(params, batch))
            loss += float(stats["loss_sum"])
            count += float(stats["weight_sum"])
          if count != num_targets:  # scoring_windows guarantees it; a wrong batch would break it
            raise RuntimeError(f"{mode}@{length} scored {count} targets, not {num_targets}")
          out[key] = math.exp(min(loss / count, _MAX_MEAN_NLL))
  return out


def format_table(metrics: dict) -> str:
  """The result as a text table: one row per context length, n/a where it could not run."""
  lengths = sorted({int(k.split("@")[1]) for k in metrics if "@" in k})
  cell = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
  lines = ["context  nonoverlap  sliding"]
  for t in lengths:
    lines.append(f"{t:7d}  {cell(metrics[f'long/ppl_nonoverlap@{t}']):>10}  "
                 f"{cell(metrics[f'long/ppl_sliding@{t}']):>7}")
  return "\n".join(lines)
