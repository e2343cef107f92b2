"""CLIP trained contrastively on scikit-learn's digits paired with template captions, scored
zero-shot on the held-out digits (task 'clip', data.name='image_folder';
tfjax/training/tasks/clip.py, captions.py), through the main loop, CPU.

Images: the 8x8 grayscale digits of experiments/make_digit_images.py's fixed split (1,438 train /
359 test), scaled to [-1, 1]. Each training image is paired with a caption of its class under one
of three templates drawn per row ("a photo of the digit {name}", "a picture of the number
{name}", "a handwritten {name}"; words are tokens). Towers: vision patches 2x2 (16 + [CLS]),
2 pre-LN layers x 64; text 2 causal layers x 64, 8 positions; projections to 32; init std 0.2
(configs/clip_synthetic.py: at 0.02 a narrow CLIP starts collapsed). Symmetric contrastive loss,
batch 64 (a batch repeats classes: same-class captions are false negatives, as in web data),
AdamW 2e-3. eval/zero_shot_accuracy: each test image's nearest class embedding (the mean of the
class's three template-caption embeddings); step 0's value is the untrained floor; chance 0.10.
"""

from tfjax.training.config.defaults import base_config, refuse_argument

TEMPLATES = ("a photo of the digit {name}", "a picture of the number {name}",
             "a handwritten {name}")


def get_config(arg=None):
  """The benchmark recipe (experiments/bench_digits_clip.py runs it and rescores the checkpoint):

    python experiments/make_digit_images.py --output=data/digits
    tfjax-prepare --input=images:data/digits/train --val_input=images:data/digits/test \\
        --image_size=8 --image_mode=L --output=data/digits_8px
    python experiments/train.py --config=configs/clip_digits.py --workdir=runs/clip_digits \\
        --config.data.path=data/digits_8px

  Expected (docs/modalities.md; shared 2-core CPU, JAX 0.10.2, seed 0): about 2 minutes;
  eval/zero_shot_accuracy on the 359 test digits 0.961 (untrained step 0: 0.086; chance 0.10).
  'test' is the unit tests' few-step run (data.path still required).
  """
  if arg != "test":
    refuse_argument("configs/clip_digits.py", arg, "no argument or 'test'")
  test = arg == "test"
  width = 32 if test else 64
  config = base_config("clip")
  config.data.update(name="image_folder", path="data/digits_8px", seed=0, templates=TEMPLATES)
  config.model.projection_dim = 32
  config.model.text.update(vocab_size=24, max_len=8, d_model=width, num_layers=1 if test else 2,
                           num_heads=4, d_ff=2 * width, ffn="quick_gelu", norm_eps=1e-5,
                           eos_id=1, init_std=0.2)
  config.model.vision.update(image_size=8, patch_size=2, channels=1, d_model=width,
                             num_layers=1 if test else 2, num_heads=4, d_ff=2 * width,
                             ffn="quick_gelu", norm_eps=1e-5, init_std=0.2)
  steps = 4 if test else 1500
  config.optimizer.update(lr=2e-3, min_lr=2e-5, warmup_steps=2 if test else 100,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=16 if test else 64,
                      eval_batch_size=8 if test else 64, eval_batches=2 if test else 6,
                      eval_every=steps if test else 250, log_every=2 if test else 100,
                      checkpoint_every=steps)
  return config
