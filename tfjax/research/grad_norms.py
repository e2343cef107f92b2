"""Per-layer gradient norms at initialization (Xiong et al. 2020, "On Layer Normalization in the
Transformer Architecture", figure 3).

Xiong et al. show that at initialization Post-LN's gradients grow towards the output layers,
which is why it needs learning-rate warmup, while Pre-LN's stay about level. This measures the
same quantity for a tfjax config: the gradient of the mean training loss on the first training
batch, at the parameters training starts from (the training state's init with config.seed),
dropout off. Per decoder layer i (1-based):
  init/grad_norm_ffn_wo@i  the FFN output matrix W_2 (the matrix Xiong et al. plot)
  init/grad_norm_layer@i   all parameters of the layer

The norm ablation's sweep reports them (configs/ablations/norm.py); the CLI is
experiments/init_grad_norms.py.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

_FFN_OUTPUT = ("ffn", "wo", "kernel")  # the path of W_2 inside a TransformerLayer


def layer_grad_norms(grads: Mapping, num_layers: int, stack: str = "decoder") -> dict:
  """The two norms per layer of a gradient tree shaped like the params of a layer stack.

  `stack` is the LayerStack's name; its layers are either `layers_0..layers_{N-1}` (a Python
  loop) or one `layers` subtree whose leaves carry a leading axis of N (nn.scan). Leaves outside
  the layers (embeddings, the final norm) are not counted.
  """
  from flax import traverse_util  # pylint: disable=import-outside-toplevel

  totals, ffn_wo = np.zeros(num_layers), np.zeros(num_layers)
  seen = False
  for path, grad in traverse_util.flatten_dict(dict(grads)).items():
    grad = np.asarray(grad, np.float64)
    if path[:2] == (stack, "layers"):  # nn.scan: one leading layer axis
      if grad.shape[:1] != (num_layers,):
        raise ValueError(f"scanned gradient {'/'.join(path)} has shape {grad.shape}, expected a "
                         f"leading axis of {num_layers} layers")
      squares, index = np.sum(grad.reshape(num_layers, -1) ** 2, axis=1), slice(None)
    elif path[0] == stack and len(path) > 1 and path[1].startswith("layers_"):
      squares, index = np.sum(grad ** 2), int(path[1].split("_")[1])
    else:
      continue
    seen = True
    totals[index] += squares
    if path[-3:] == _FFN_OUTPUT:
      ffn_wo[index] += squares
  if not seen:
    raise ValueError(f"the gradient tree has no {stack}/layers*: top-level keys "
                     f"{sorted(grads)}")
  out = {}
  for i in range(num_layers):
    out[f"init/grad_norm_ffn_wo@{i + 1}"] = float(np.sqrt(ffn_wo[i]))
    out[f"init/grad_norm_layer@{i + 1}"] = float(np.sqrt(totals[i]))
  return out


def init_gradients(config):
  """(model config, gradient tree) of the mean loss on the first training batch at the state
  training starts from; dropout off (no dropout rng is passed)."""
  import jax  # pylint: disable=import-outside-toplevel
  from tfjax.training import tasks  # pylint: disable=import-outside-toplevel
  from tfjax.training.loop import experiment  # pylint: disable=import-outside-toplevel
  from tfjax.training.parallel import sharding  # pylint: disable=import-outside-toplevel
  from tfjax.nn.models import build_model  # pylint: disable=import-outside-toplevel

  exp = experiment.prepare(config)
  if exp.model_config.family != "decoder":
    raise ValueError(f"per-layer gradient norms are implemented for decoder-only models; "
                     f"model.family is {exp.model_config.family!r}")
  placement = sharding.BatchPlacement.for_config(config)
  state = experiment.state_layout(exp, placement).init()
  model = build_model(exp.model_config)
  batch = exp.dataset.train_batch(0, config.train.batch_size)

  def mean_loss(params):
    stats = tasks.forward(model, params, batch, config.task)
    return stats["loss_sum"] / stats["weight_sum"]

  with placement.axis_rules():
    grads = jax.device_get(jax.jit(jax.grad(mean_loss))(state.params))
  return exp.model_config, grads


def per_layer_grad_norms(config) -> dict:
  """{'init/grad_norm_ffn_wo@i', 'init/grad_norm_layer@i'} for i = 1..num_layers (see above)."""
  model_config, grads = init_gradients(config)
  return layer_grad_norms(grads, model_config.num_layers)


def format_table(norms: dict) -> str:
  """The norms as a text table, one row per layer."""
  layers = len([k for k in norms if k.startswith("init/grad_norm_layer@")])
  lines = ["layer  ffn W_2 grad norm  layer grad norm"]
  for i in range(1, layers + 1):
    lines.append(f"{i:5d}  {norms[f'init/grad_norm_ffn_wo@{i}']:17.4g}  "
                 f"{norms[f'init/grad_norm_layer@{i}']:15.4g}")
  return "\n".join(lines)
