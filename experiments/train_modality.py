"""The earlier spelling of training ViT, CLIP, Whisper and Funnel: they now train through the
main loop (experiments/train.py, `tfjax-train`), so this is that command under its old name:

  python experiments/train_modality.py --config=configs/vit_synthetic.py --workdir=DIR \\
      [--config.train.num_steps=300 ...] [--export_hf=HF_DIR]

equals `python experiments/train.py` with the same flags (checkpoints, resume, signals, mesh:
docs/modalities.md). --export_hf=HF_DIR also writes the trained model as a Hugging Face directory
(tfjax.hf.modalities.export) once the run has finished.
"""

import sys

EXPORT_FLAG = "--export_hf="


def _export(workdir: str, out_dir: str) -> None:
  from tfjax.hf import modalities  # pylint: disable=import-outside-toplevel
  from tfjax.training.checkpointing import runs  # pylint: disable=import-outside-toplevel
  run = runs.restore_run(workdir)
  config = modalities.export(run.model_config, run.params, out_dir)
  print(f"exported {workdir} -> {out_dir} ({config['architectures'][0]})")


if __name__ == "__main__":
  from tfjax.runtime import stop_signals
  exports = [a[len(EXPORT_FLAG):] for a in sys.argv[1:] if a.startswith(EXPORT_FLAG)]
  sys.argv = [a for a in sys.argv if not a.startswith(EXPORT_FLAG)]
  if exports and not any(a.startswith("--workdir") for a in sys.argv[1:]):
    print("error: --export_hf needs --workdir=DIR (the run to export)", file=sys.stderr)
    sys.exit(2)
  with stop_signals.exits_on_stop():
    from absl import flags  # pylint: disable=g-import-not-at-top
    from tfjax.training.entry import cli, main  # pylint: disable=g-import-not-at-top
    try:
      main.run()
    except SystemExit as done:
      if done.code not in (0, None) or not exports:
        raise
    cli.guarded(_export)(flags.FLAGS.workdir, exports[-1])
