"""Per-layer gradient norms at initialization (Xiong et al. 2020, figure 3) of a decoder config.

  python experiments/init_grad_norms.py --config=configs/ablations/norm.py:smoke \
      [--config.model.norm_placement=post --config.model.num_layers=6]

Prints, per layer, the gradient norm of the FFN output matrix W_2 and of all the layer's
parameters, for the mean loss on the first training batch at the initial parameters. What is
measured and why: tfjax/research/grad_norms.py.
"""

from __future__ import annotations

import sys

from absl import flags

from tfjax.training.entry import cli

_CONFIG = cli.define_config_file("config", None,
                                          "Config file (e.g. an ablation with :smoke).")
flags.mark_flag_as_required("config")


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {argv[1:]}")
  from tfjax.research import grad_norms  # pylint: disable=import-outside-toplevel
  print(grad_norms.format_table(grad_norms.per_layer_grad_norms(_CONFIG.value)))


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()  # orbax logs every file it touches at INFO
  cli.run_absl(main)
