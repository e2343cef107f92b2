"""Perplexity of a trained language model at longer contexts than it was trained on.

  python experiments/eval_length.py --workdir=RUN [--multiples=1,2,4,8] [--max_tokens=16384]

Loads RUN's config.json, tokenizer and latest checkpoint and scores the first `max_tokens` tokens
of the validation split with contexts T = multiple x data.seq_len, in nonoverlapping and sliding
windows (stride T x stride_fraction). Writes RUN/length_eval.json and prints a table; n/a where
learned positions have no embedding. The method and its guarantees: tfjax/research/length_eval.py.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from tfjax.training.entry import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run (config.json + checkpoints).",
                               required=True)
_MULTIPLES = flags.DEFINE_list("multiples", ["1", "2", "4", "8"],
                               "Contexts as multiples of seq_len (1.5: 1.5 x seq_len tokens).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 16384,
                                   "Validation targets scored (0: the whole split).")
_STRIDE = flags.DEFINE_float("stride_fraction", 0.25, "Sliding-window stride as a fraction of T.")


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  from tfjax.runtime import files
  from tfjax.research import length_eval  # pylint: disable=import-outside-toplevel
  try:
    multiples = [float(m) for m in _MULTIPLES.value]
  except ValueError:
    cli.fail(f"--multiples takes numbers >= 1 (e.g. 1,1.5,2,4), got {_MULTIPLES.value}")
  result = length_eval.perplexity_vs_length(_WORKDIR.value, multiples, _MAX_TOKENS.value or None,
                                            _STRIDE.value)
  path = os.path.join(_WORKDIR.value, length_eval.RESULT_FILE)
  files.write_json_atomic(path, result, indent=2)
  print(f"perplexity on {result['long/tokens']} validation tokens ({path}):")
  print(length_eval.format_table(result))


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  cli.run_absl(main)
