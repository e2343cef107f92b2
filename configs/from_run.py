"""The config of an existing run directory (e.g. one imported with `python -m tfjax.hf import`).

  python -m tfjax.params --config=configs/from_run.py:runs/llama
  python experiments/train.py --config=configs/from_run.py:runs/llama --workdir=runs/ft \
      --config.init_from=runs/llama --config.data.path=corpus.txt
"""

from tfjax.training.checkpointing import runs


def get_config(workdir):
  if not workdir:
    raise ValueError("give the run directory: --config=configs/from_run.py:RUN")
  return runs.load_config(workdir)
