"""Attention heatmaps of a trained run: one panel per layer (rows) and head (columns).

  python experiments/visualize_attention.py --workdir=runs/shakespeare --text="ROMEO: But soft"
      [--out=attention.png]

Loads WORKDIR's config.json, tokenizer.json and latest checkpoint, runs the model on the text
(applied with mutable=['intermediates'], where every attention module sows its softmax weights
[batch, heads, queries, keys]) and writes a PNG grid (default WORKDIR/attention.png). Rows of a
panel are queries, columns keys; with causal attention the upper triangle is empty. Texts longer
than data.seq_len (or the learned position table) are cut to that length.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tfjax.training.entry import cli


def attention_maps(workdir: str, text: str, run=None):
  """(tokens as strings, weights [layers, heads, T, T]) for `text` under the run's model.

  `run`: the run's (config, experiment, params) if already restored (tfjax.research.sweep.restore_run).
  """
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import traverse_util  # pylint: disable=import-outside-toplevel
  from tfjax.research import sweep  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel

  config, exp, params = run or sweep.restore_run(workdir)
  tokenizer = getattr(exp.dataset, "tokenizer", None)
  if tokenizer is None or config.task != "lm":
    raise ValueError(f"{workdir}: attention maps of text need a text language-model run "
                     "(task 'lm' with a tokenizer)")
  ids = np.asarray(tokenizer.encode(text))[:min(config.data.seq_len, exp.model_config.max_len)]
  if not len(ids):
    raise ValueError("--text encodes to no tokens")
  model = build_model(exp.model_config)
  with nn.logical_axis_rules(()):
    _, state = model.apply({"params": params}, jnp.asarray(ids[None], jnp.int32),
                           mutable=["intermediates"])
  found = []
  for path, value in traverse_util.flatten_dict(jax.device_get(state["intermediates"])).items():
    if "attention_weights" in path:
      weights = np.asarray(value[0])  # sow keeps a tuple of the sown values
      if weights.ndim == 5:  # nn.scan stacks the layers on a leading axis
        found += [(("layers", i) + path, w) for i, w in enumerate(weights)]
      else:
        found.append((path, weights))
  found.sort(key=lambda item: _layer_index(item[0]))
  maps = np.stack([w[0] for _, w in found])  # first (only) batch row: [layers, H, T, T]
  return [tokenizer.decode([int(i)]) for i in ids], maps


def _layer_index(path) -> int:
  """Layer number from a flattened variable path: ('decoder', 'layers_3', ...) or a scanned
  ('layers', 3, ...)."""
  for part in path:
    if isinstance(part, int):
      return part
    if isinstance(part, str) and part.startswith("layers_"):
      return int(part[len("layers_"):])
  return 0


def plot_grid(tokens, maps, path: str, title: str = "") -> str:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  layers, heads, length = maps.shape[0], maps.shape[1], maps.shape[2]
  size = max(2.0, min(4.0, 0.12 * length))
  fig, axes = plt.subplots(layers, heads, figsize=(size * heads, size * layers), squeeze=False)
  labels = [repr(t)[1:-1] for t in tokens]  # newlines and spaces stay visible
  for layer in range(layers):
    for head in range(heads):
      ax = axes[layer][head]
      ax.imshow(maps[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
      ax.set_title(f"layer {layer + 1} head {head + 1}", fontsize=8)
      if length <= 48:
        ax.set_xticks(range(length), labels, fontsize=5, rotation=90)
        ax.set_yticks(range(length), labels, fontsize=5)
      else:
        ax.set_xticks([])
        ax.set_yticks([])
  fig.suptitle(title or "attention weights (rows: queries, columns: keys)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def run_title(workdir: str, num_tokens: int) -> str:
  """The run's own name (its directory's last part, e.g. a sweep point), never the whole path."""
  return f"{os.path.basename(os.path.normpath(workdir))}: {num_tokens} tokens"


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  tokens, maps = attention_maps(f.workdir, f.text)
  out = f.out or os.path.join(f.workdir, "attention.png")
  plot_grid(tokens, maps, out, title=run_title(f.workdir, len(tokens)))
  print(f"wrote {out} ({maps.shape[0]} layers x {maps.shape[1]} heads, {len(tokens)} tokens)")


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  absl_flags.DEFINE_string("workdir", None, "A trained run directory.", required=True)
  absl_flags.DEFINE_string("text", "First Citizen:\nBefore we proceed", "Text to attend over.")
  absl_flags.DEFINE_string("out", "", "PNG path (default WORKDIR/attention.png).")
  cli.run_absl(main)
