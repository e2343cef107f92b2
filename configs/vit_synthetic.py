"""ViT on synthetic oriented gratings (tfjax/modalities/synthetic.py `stripes`), CPU: task 'vit'
(tfjax/training/tasks/vit.py) through the main loop.

4 classes (orientations 0, 45, 90, 135 degrees, random phase, noise std 0.5) of 16x16 RGB
images, patches 4x4 (16 patches + [CLS]), 2 pre-LN layers x 64, 4 heads, AdamW 3e-3 (warmup,
cosine to 10%), batch 32.
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run.

    python experiments/train.py --config=configs/vit_synthetic.py --workdir=runs/vit

  Measured (docs/modalities.md): see the table there for loss and accuracy.
  """
  if arg != "test":
    refuse_argument("configs/vit_synthetic.py", arg, "no argument or 'test'")
  test = arg == "test"
  config = base_config("vit")
  config.model.update(image_size=16, patch_size=4, channels=3, d_model=32 if test else 64,
                      num_layers=2, num_heads=4, d_ff=64 if test else 128, ffn="gelu",
                      norm_eps=1e-12, num_classes=4)
  config.data.update(classes=4, noise=0.5)
  steps = 40 if test else 300
  config.optimizer.update(lr=3e-3, min_lr=3e-4, warmup_steps=10 if test else 30,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=32,
                      eval_batches=2 if test else 16, eval_every=steps,
                      log_every=20 if test else 50, checkpoint_every=steps)
  return config
