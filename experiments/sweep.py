"""Run a sweep and aggregate its results (`tfjax-sweep`): see tfjax/research/sweep_main.py.

  python experiments/sweep.py --config=configs/ablations/ffn.py --workdir=runs/ffn --scale=smoke
"""
from tfjax.research.sweep_main import main, run  # pylint: disable=unused-import

if __name__ == "__main__":
  run()
