"""`python -m tfjax.hf import|export`: Hugging Face checkpoints in and out of tfjax runs.

  python -m tfjax.hf import --hf_dir=DIR --workdir=RUN [--dtype=float32|bfloat16] [--mesh=1,-1,1]
  python -m tfjax.hf export --workdir=RUN --hf_dir=OUT [--model_type=llama] [--dtype=float32]
                            [--max_shard_size=5GB]

See docs/hf.md for the architectures and fields supported. Both take --import=MODULE[,...]
(code outside tfjax, imported first; tfjax/runtime/imports.py).
"""

from __future__ import annotations

import sys

from tfjax.runtime import imports
from tfjax.training.checkpointing import runs
from tfjax.training.entry import cli


def parse_args(argv):
  # cli.ArgumentParser (also the subcommands' parsers): a usage error is one `error:` line, exit 2
  parser = cli.ArgumentParser(prog="python -m tfjax.hf", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  imp = sub.add_parser("import", help="Hugging Face model directory -> tfjax run directory")
  imp.add_argument("--hf_dir", required=True, help="config.json + *.safetensors (+ tokenizer)")
  imp.add_argument("--workdir", required=True, help="the new run directory")
  imp.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="compute dtype and stored params dtype")
  imp.add_argument("--mesh", default="1,-1,1",
                   help="DATA,FSDP,TENSOR mesh the tensors are placed on while reading")
  exp = sub.add_parser("export", help="tfjax run directory -> Hugging Face model directory")
  exp.add_argument("--workdir", required=True, help="a tfjax run directory")
  exp.add_argument("--hf_dir", required=True, help="output directory")
  exp.add_argument("--model_type", default=None,
                   help="architecture to write (default: the one the run was imported from)")
  exp.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
  exp.add_argument("--max_shard_size", default="5GB",
                   help="above this size (500MB, 5GB, 2GiB or bytes) weights are written as "
                        "shards with model.safetensors.index.json")
  for subparser in (imp, exp):
    cli.add_import_argument(subparser)
  return parser.parse_args(argv)


def _parse_mesh(text: str) -> tuple:
  try:
    return tuple(int(t) for t in text.split(","))
  except ValueError:
    raise ValueError(f"--mesh={text!r}: give integer sizes DATA,FSDP,TENSOR (-1: the remaining "
                     "devices), e.g. 1,-1,1") from None


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  from tfjax.hf import exporter, importer  # pylint: disable=import-outside-toplevel
  try:
    # export reads the run's config.json, which imports the modules it records itself
    imports.load(args.imports)
    if args.command == "import":
      mesh = _parse_mesh(args.mesh)
      cfg = importer.import_model(args.hf_dir, args.workdir, dtype=args.dtype, mesh=mesh)
      if hasattr(cfg, "family"):
        shown = (f"{cfg.family}, {cfg.num_layers} layers, d_model {cfg.d_model}, "
                 f"vocab {cfg.vocab_size}")
      else:  # a task's own model (tfjax/hf/task_runs.py)
        shown = f"task {runs.load_config(args.workdir).task}, {type(cfg).__name__}"
      print(f"imported {args.hf_dir} -> {args.workdir} ({shown})")
    else:
      config = exporter.export_model(args.workdir, args.hf_dir, model_type=args.model_type,
                                     dtype=args.dtype, max_shard_size=args.max_shard_size)
      print(f"exported {args.workdir} -> {args.hf_dir} ({config['architectures'][0]})")
  except cli.USER_ERRORS as e:  # unsupported architecture / field, bad directory: one line
    if cli.show_tracebacks():
      raise
    print(cli.error_line(cli.message_of(e)), file=sys.stderr)
    return cli.USAGE_ERROR
  return 0


if __name__ == "__main__":
  from tfjax.training.loop.metrics import setup_logging  # pylint: disable=g-import-not-at-top
  setup_logging()
  sys.exit(main())
