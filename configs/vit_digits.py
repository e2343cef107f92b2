"""ViT on scikit-learn's digits (1,797 real 8x8 handwritten digits, UCI), the fixed held-out split
of experiments/make_digit_images.py (1,438 train / 359 test): task 'vit' with
data.name='image_folder' (tfjax/training/tasks/vit.py) through the main loop, CPU.

The images are prepared at their own size, 8x8 grayscale (kept pixel for pixel), scaled to
[-1, 1]; patches 2x2 (16 patches + [CLS]), 4 pre-LN layers x 64, 4 heads; AdamW 2e-3 (warmup,
cosine to 2e-5), weight decay 0.05, batch 64, no augmentation. Evaluated on all 359 test images
(train.eval_batches x eval_batch_size >= 359; padding rows weigh 0).
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The benchmark recipe (experiments/bench_digits.py runs it beside logistic regression):

    python experiments/make_digit_images.py --output=data/digits --baseline
    tfjax-prepare --input=images:data/digits/train --val_input=images:data/digits/test \\
        --image_size=8 --image_mode=L --output=data/digits_8px
    python experiments/train.py --config=configs/vit_digits.py --workdir=runs/vit_digits \\
        --config.data.path=data/digits_8px

  Expected (docs/modalities.md; shared 2-core CPU, JAX 0.10.2, seed 0): about 4 minutes;
  eval/accuracy on the 359 test images 0.967 (seeds 1, 2: 0.955; scikit-learn's logistic
  regression on the same split: 0.953).
  'test' is the unit tests' few-step run (data.path still required).
  """
  if arg != "test":
    refuse_argument("configs/vit_digits.py", arg, "no argument or 'test'")
  test = arg == "test"
  config = base_config("vit")
  config.data.update(name="image_folder", path="data/digits_8px", seed=0)
  config.model.update(image_size=8, patch_size=2, channels=1, d_model=32 if test else 64,
                      num_layers=1 if test else 4, num_heads=4, d_ff=64 if test else 256,
                      ffn="gelu", norm_eps=1e-6, num_classes=10)
  steps = 4 if test else 1500
  config.optimizer.update(lr=2e-3, min_lr=2e-5, warmup_steps=2 if test else 100,
                          weight_decay=0.05, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=64, eval_batch_size=64 if not test else 8,
                      eval_batches=6 if not test else 2, eval_every=steps if test else 250,
                      log_every=2 if test else 100, checkpoint_every=steps)
  return config
