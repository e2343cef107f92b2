"""Perplexity of a trained language model at longer contexts than it was trained on.

  python experiments/eval_length.py --workdir=RUN [--multiples=1,2,4,8] [--max_tokens=16384]

Loads RUN's config.json, tokenizer and latest checkpoint, and scores the first `max_tokens` tokens
of the validation split (the same tokens at every length) with contexts T = multiple x L, where L is
the training context (data.seq_len), in two ways (Press et al. 2021, section 2 and appendix B):
  nonoverlap  the split cut into consecutive windows of T tokens; a token at offset i of its window
              is predicted from the i tokens before it (on average T/2 of context)
  sliding     windows of T tokens advanced by stride S = T/4 (--stride_fraction); each window
              scores only its last S tokens (the first window scores all), so every token but the
              first T-S is predicted from at least T-S tokens of context
Every target is scored exactly once in both. Learned absolute positions have no embedding past
model.max_len: those lengths are reported as n/a (null). Writes RUN/length_eval.json and prints a
table; `perplexity_vs_length` returns {'long/ppl_nonoverlap@T': ..., 'long/ppl_sliding@T': ...}
for the sweep (configs/ablations/position.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np


def scoring_windows(num_targets: int, length: int, stride: int):
  """(starts, first_scored) of windows of `length` inputs covering targets 1..num_targets.

  Window w has inputs tokens[s : s+length] and targets tokens[s+1 : s+length+1]; it scores the
  targets from offset first_scored[w] on. Windows end at length, length+stride, ..., and a last one
  ending exactly at num_targets, so every target is scored once.
  """
  if num_targets < length:
    raise ValueError(f"{num_targets} targets are fewer than one window of {length}")
  ends = list(range(length, num_targets + 1, stride))
  if ends[-1] != num_targets:
    ends.append(num_targets)
  starts = np.asarray(ends) - length
  previous_end = np.asarray([0] + ends[:-1])
  return starts, previous_end - starts  # offset of the first target not yet scored


def _window_batches(tokens, starts, first_scored, length: int, rows: int):
  """Batches of `rows` windows: inputs, targets, weights (1 on the scored targets)."""
  offsets = np.arange(length)
  for b in range(0, len(starts), rows):
    s, f = starts[b:b + rows], first_scored[b:b + rows]
    pad = rows - len(s)  # the last batch is padded with weight-0 rows: one compiled shape
    s, f = np.concatenate([s, np.zeros(pad, int)]), np.concatenate([f, np.full(pad, length)])
    idx = s[:, None] + offsets[None, :]
    yield {"inputs": tokens[idx].astype(np.int32), "targets": tokens[idx + 1].astype(np.int32),
           "weights": (offsets[None, :] >= f[:, None]).astype(np.float32)}


def perplexity_vs_length(workdir: str, multiples: Sequence[int] = (1, 2, 4, 8),
                         max_tokens: Optional[int] = 16384, stride_fraction: float = 0.25,
                         rows: Optional[int] = None, run=None) -> dict:
  """{'long/ppl_nonoverlap@T', 'long/ppl_sliding@T', 'long/tokens'} for T = multiple x seq_len.

  `run`: the run's (config, experiment, params) if already restored (tfjax.sweep.restore_run).
  """
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax import sweep, tasks  # pylint: disable=import-outside-toplevel
  from tfjax.models import build_model  # pylint: disable=import-outside-toplevel

  config, exp, params = run or sweep.restore_run(workdir)
  if config.task != "lm" or not hasattr(exp.dataset, "val_tokens"):
    raise ValueError(f"{workdir}: length evaluation needs a text language-model run")
  cfg = exp.model_config
  train_len = config.data.seq_len
  lengths = [m * train_len for m in multiples]
  tokens = np.asarray(exp.dataset.val_tokens)
  # Same targets at every length: a whole number of the longest windows (nonoverlap tiles it).
  available = len(tokens) - 1 if max_tokens is None else min(max_tokens, len(tokens) - 1)
  num_targets = available // max(lengths) * max(lengths)
  if num_targets == 0:
    raise ValueError(f"the validation split ({len(tokens)} tokens) is shorter than one window "
                     f"of {max(lengths)}")
  rows = rows or config.train.eval_batch_size
  model = build_model(cfg)
  step = jax.jit(lambda p, batch: tasks.forward(model, p, batch, "lm"))
  out = {"long/tokens": num_targets}
  with nn.logical_axis_rules(()):
    for length in lengths:
      for mode, stride in (("nonoverlap", length),
                           ("sliding", max(1, int(length * stride_fraction)))):
        key = f"long/ppl_{mode}@{length}"
        if cfg.position == "learned" and length > cfg.max_len:
          out[key] = None  # no position embedding exists past the table
          continue
        starts, first = scoring_windows(num_targets, length, stride)
        loss = count = 0.0
        for batch in _window_batches(tokens, starts, first, length, rows):
          stats = jax.device_get(step(params, batch))
          loss += float(stats["loss_sum"])
          count += float(stats["weight_sum"])
        assert count == num_targets, (mode, length, count, num_targets)
        out[key] = math.exp(min(loss / count, 50.0))
  return out


def format_table(metrics: dict) -> str:
  lengths = sorted({int(k.split("@")[1]) for k in metrics if "@" in k})
  cell = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
  lines = ["context  nonoverlap  sliding"]
  for t in lengths:
    lines.append(f"{t:7d}  {cell(metrics[f'long/ppl_nonoverlap@{t}']):>10}  "
                 f"{cell(metrics[f'long/ppl_sliding@{t}']):>7}")
  return "\n".join(lines)


def main(argv):
  from absl import flags  # pylint: disable=import-outside-toplevel
  del argv
  flags_ = flags.FLAGS
  result = perplexity_vs_length(flags_.workdir, [int(m) for m in flags_.multiples],
                                flags_.max_tokens or None, flags_.stride_fraction)
  path = os.path.join(flags_.workdir, "length_eval.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  print(f"perplexity on {result['long/tokens']} validation tokens ({path}):")
  print(format_table(result))


if __name__ == "__main__":
  from tfjax.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  from absl import app, flags as absl_flags  # pylint: disable=g-import-not-at-top
  absl_flags.DEFINE_string("workdir", None, "A finished run (config.json + checkpoints).",
                           required=True)
  absl_flags.DEFINE_list("multiples", ["1", "2", "4", "8"], "Contexts as multiples of seq_len.")
  absl_flags.DEFINE_integer("max_tokens", 16384, "Validation targets scored (0: the whole split).")
  absl_flags.DEFINE_float("stride_fraction", 0.25, "Sliding-window stride as a fraction of T.")
  sys.exit(app.run(main))
