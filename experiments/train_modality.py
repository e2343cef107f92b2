"""Train a modality front-end (ViT, CLIP, Whisper) or the Funnel Transformer on synthetic data
(docs/modalities.md, docs/attention/funnel.md):

  python experiments/train_modality.py --config=configs/vit_synthetic.py --workdir=DIR \
      [--config.train.num_steps=300 ...] [--export_hf=HF_DIR]

--export_hf writes the trained model as a Hugging Face directory (tfjax.hf.modalities.export).
"""

from absl import flags

from tfjax.training import cli

_CONFIG = cli.define_config_file("config", None, "configs/<modality>_synthetic.py[:arg]")
_WORKDIR = flags.DEFINE_string("workdir", None, "new directory for metrics, config and params")
_EXPORT = flags.DEFINE_string("export_hf", None, "also export the trained model to this "
                              "Hugging Face directory")


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: settings are flags, e.g. "
             "--config.train.num_steps=100")
  if _CONFIG.value is None or not _WORKDIR.value:
    cli.fail("give --config=configs/<modality>_synthetic.py and --workdir=DIR")
  from tfjax.modalities import train  # pylint: disable=import-outside-toplevel
  train.train(_CONFIG.value, _WORKDIR.value)
  if _EXPORT.value:
    from tfjax.hf import modalities  # pylint: disable=import-outside-toplevel
    task, params = train.load_run(_WORKDIR.value)
    config = modalities.export(task.cfg, params, _EXPORT.value)
    print(f"exported {_WORKDIR.value} -> {_EXPORT.value} ({config['architectures'][0]})")


if __name__ == "__main__":
  cli.run_absl(main)
