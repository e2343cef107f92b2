"""Per-layer gradient norms at initialization (Xiong et al. 2020, "On Layer Normalization in the
Transformer Architecture", figure 3): Post-LN's gradients grow towards the output layers, which is
why it needs learning-rate warmup; Pre-LN's stay about level.

  python experiments/init_grad_norms.py --config=configs/ablations/norm.py:smoke \
      [--config.model.norm_placement=post --config.model.num_layers=6]

Gradient of the mean training loss on the first training batch, at the parameters training starts
from (train.init_state with config.seed), dropout off. Per decoder layer i (1-based):
  init/grad_norm_ffn_wo@i  the FFN output matrix W_2 (the matrix Xiong et al. plot)
  init/grad_norm_layer@i   all parameters of the layer
"""

from __future__ import annotations

import sys

import numpy as np


def per_layer_grad_norms(config) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from flax import traverse_util  # pylint: disable=import-outside-toplevel
  from tfjax import sharding, tasks, train  # pylint: disable=import-outside-toplevel
  from tfjax.models import build_model  # pylint: disable=import-outside-toplevel

  exp = train.prepare(config)
  if exp.model_config.family != "decoder":
    raise ValueError("per-layer gradient norms are implemented for decoder-only models")
  mesh, rules = sharding.make_mesh(config.mesh), sharding.rules(config)
  state, _ = train.init_state(exp, mesh, rules)
  model = build_model(exp.model_config)
  batch = exp.dataset.train_batch(0, config.train.batch_size)

  def mean_loss(params):
    stats = tasks.forward(model, params, batch, config.task)
    return stats["loss_sum"] / stats["weight_sum"]

  with sharding.axis_rules(mesh, rules):
    grads = jax.device_get(jax.jit(jax.grad(mean_loss))(state.params))
  flat = traverse_util.flatten_dict(grads)
  layers = exp.model_config.num_layers
  totals, ffn_wo = np.zeros(layers), np.zeros(layers)
  for path, grad in flat.items():
    grad = np.asarray(grad, np.float64)
    if path[:2] == ("decoder", "layers"):  # nn.scan: a leading layer axis
      per_layer = np.sum(grad.reshape(layers, -1) ** 2, axis=1)
      index = slice(None)
    elif path[0] == "decoder" and path[1].startswith("layers_"):
      per_layer, index = np.sum(grad ** 2), int(path[1].split("_")[1])
    else:
      continue  # embeddings, final norm
    totals[index] += per_layer
    if path[-3:] == ("ffn", "wo", "kernel"):
      ffn_wo[index] += per_layer
  out = {}
  for i in range(layers):
    out[f"init/grad_norm_ffn_wo@{i + 1}"] = float(np.sqrt(ffn_wo[i]))
    out[f"init/grad_norm_layer@{i + 1}"] = float(np.sqrt(totals[i]))
  return out


def main(argv):
  del argv
  from absl import flags  # pylint: disable=import-outside-toplevel
  norms = per_layer_grad_norms(flags.FLAGS.config)
  layers = len(norms) // 2
  print("layer  ffn W_2 grad norm  layer grad norm")
  for i in range(1, layers + 1):
    print(f"{i:5d}  {norms[f'init/grad_norm_ffn_wo@{i}']:17.4g}  "
          f"{norms[f'init/grad_norm_layer@{i}']:15.4g}")


if __name__ == "__main__":
  from tfjax.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  from absl import app  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Config file (e.g. an ablation with :smoke).")
  sys.exit(app.run(main))
