"""Generate from a trained run (`tfjax-generate`): see tfjax/training/entry/generate_main.py.

  python experiments/generate.py --workdir=runs/shakespeare --prompt="ROMEO:" --max_new_tokens=200
"""
from tfjax.inference.generate import decode_ids, encode_prompt  # pylint: disable=unused-import
from tfjax.training.entry.generate_main import (  # pylint: disable=unused-import
    generate_from_run, main, parse_args, run)

if __name__ == "__main__":
  run()
