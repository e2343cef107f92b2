"""Train a tfjax model: python experiments/train.py --config=configs/NAME.py --workdir=DIR."""
from tfjax.training.main import run

if __name__ == "__main__":
  run()
