"""Generate from a trained run (`tfjax-generate`): see tfjax/training/generate_main.py.

  python experiments/generate.py --workdir=runs/shakespeare --prompt="ROMEO:" --max_new_tokens=200
"""
from tfjax.inference.generate import decode_ids, encode_prompt  # pylint: disable=unused-import
from tfjax.training.generate_main import generate_from_run, main, parse_args, run  # pylint: disable=unused-import

if __name__ == "__main__":
  run()
