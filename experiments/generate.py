"""Generate from a trained run (`tfjax-generate`): see tfjax/training/generate.py.

  python experiments/generate.py --workdir=runs/shakespeare --prompt="ROMEO:" --max_new_tokens=200
"""
from tfjax.training.generate import (decode_ids, encode_prompt, generate_from_run, main,  # pylint: disable=unused-import
                                     parse_args, run)

if __name__ == "__main__":
  run()
