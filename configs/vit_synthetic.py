"""ViT on synthetic oriented gratings (tfjax/modalities/synthetic.py `stripes`), CPU.

4 classes (orientations 0, 45, 90, 135 degrees, random phase, noise std 0.5) of 16x16 RGB
images, patches 4x4 (16 patches + [CLS]), 2 pre-LN layers x 64, 4 heads, AdamW 3e-3.
"""

import ml_collections


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run.

    python experiments/train_modality.py --config=configs/vit_synthetic.py --workdir=runs/vit

  Measured (docs/modalities.md): see the table there for loss and accuracy.
  """
  if arg not in (None, "", "test"):
    raise ValueError(f"configs/vit_synthetic.py takes no argument or 'test', got {arg!r}")
  test = arg == "test"
  config = ml_collections.ConfigDict()
  config.task = "vit"
  config.model = dict(image_size=16, patch_size=4, channels=3, d_model=32 if test else 64,
                      num_layers=2, num_heads=4, d_ff=64 if test else 128, ffn="gelu",
                      norm_eps=1e-12, num_classes=4)
  config.data = dict(classes=4, noise=0.5)
  config.train = dict(num_steps=40 if test else 300, batch_size=32, learning_rate=3e-3,
                      warmup_steps=10 if test else 30, weight_decay=0.01, seed=0,
                      log_every=20 if test else 50, eval_batches=2 if test else 16)
  return ml_collections.ConfigDict(config)
