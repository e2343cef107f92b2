"""CLIP on synthetic image-caption pairs (tfjax/modalities/synthetic.py), CPU: task 'clip'
(tfjax/training/tasks/clip.py) through the main loop.

8 classes of 16x16 gratings (4 orientations x 2 spatial frequencies, random phase, noise std
0.5), each paired with a caption holding its orientation and frequency tokens at random places
among filler tokens (vocabulary 32, length 12, EOS = 3). Image tower: patches 4x4, 2 pre-LN
layers x 48; text tower: 2 causal layers x 48; projections to 32; learned temperature (init
0.07, logit scale clipped at 100). Symmetric contrastive loss, batch 32, AdamW 2e-3.

init_std 0.2 in both towers, not BERT's 0.02: at width 48 with 0.02, attention barely moves the
[CLS] state, the image embeddings of a batch start with cosine similarity 1.00 to each other and
training sits at the collapsed loss ln(batch) (docs/modalities.md).
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run.

    python experiments/train.py --config=configs/clip_synthetic.py --workdir=runs/clip

  Measured: docs/modalities.md (loss, retrieval accuracy).
  """
  if arg != "test":
    refuse_argument("configs/clip_synthetic.py", arg, "no argument or 'test'")
  test = arg == "test"
  width = 32 if test else 48
  config = base_config("clip")
  config.model.projection_dim = 32
  config.model.text.update(vocab_size=32, max_len=12, d_model=width, num_layers=2, num_heads=4,
                           d_ff=2 * width, ffn="quick_gelu", norm_eps=1e-5, eos_id=3,
                           init_std=0.2)
  config.model.vision.update(image_size=16, patch_size=4, channels=3, d_model=width,
                             num_layers=2, num_heads=4, d_ff=2 * width, ffn="quick_gelu",
                             norm_eps=1e-5, init_std=0.2)
  config.data.update(classes=8, noise=0.5)
  steps = 60 if test else 400
  config.optimizer.update(lr=2e-3, min_lr=2e-4, warmup_steps=10 if test else 40,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=32,
                      eval_batches=2 if test else 16, eval_every=steps,
                      log_every=20 if test else 50, checkpoint_every=steps)
  return config
