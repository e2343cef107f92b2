"""A tiny Whisper trained from scratch on spoken digit strings (espeak-ng, made offline by
experiments/make_spoken_digits.py: 1,000 train / 200 test clips of 1-7 digit words, four voices):
task 'whisper' with data.name='audio_folder' (tfjax/training/tasks/whisper.py) through the main
loop, CPU.

Input: Whisper's 80-bin log-mel features (tfjax-prepare, the math of WhisperFeatureExtractor)
cropped to 320 frames (3.2 s; every clip's speech fits, the rest of the 30 s window is padding),
-> 160 encoder positions after the stride-2 conv. Output: characters (the prepared char
tokenizer, 16 symbols + pad / SOT / EOT). 2 encoder and 2 decoder pre-LN layers x 128, 4 heads;
AdamW 1e-3 (warmup, cosine to 1e-5), batch 32, 1,200 steps, teacher-forced cross-entropy. Scored by
experiments/bench_spoken_digits.py: word error rate of greedy decoding on the 200 test clips.
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The benchmark recipe:

    python experiments/make_spoken_digits.py --output=data/spoken_digits
    tfjax-prepare --input=audio:data/spoken_digits/train \\
        --val_input=audio:data/spoken_digits/test --tokenizer=char \\
        --output=data/spoken_digits_prepared
    python experiments/bench_spoken_digits.py --prepared=data/spoken_digits_prepared \\
        --workdir=runs/whisper_digits     # trains with this config, then decodes the test clips

  Expected (docs/modalities.md; shared 2-core CPU, JAX 0.10.2, seed 0): 18 minutes at load
  average 10-12 (0.8-0.9 s a step); greedy word error rate 0.041 on the 200 test clips (33 / 797
  words), exact match 0.865.
  'test' is the unit tests' few-step run (data.path still required).
  """
  if arg != "test":
    refuse_argument("configs/whisper_spoken_digits.py", arg, "no argument or 'test'")
  test = arg == "test"
  width = 32 if test else 64
  config = base_config("whisper")
  config.data.update(name="audio_folder", path="data/spoken_digits_prepared", seed=0)
  config.model.update(num_mels=80, max_source_positions=160, max_target_positions=48,
                      vocab_size=19, d_model=width, encoder_layers=1 if test else 2,
                      encoder_heads=4, encoder_ffn=2 * width if test else 4 * width,
                      decoder_layers=1 if test else 2, decoder_heads=4,
                      decoder_ffn=2 * width if test else 4 * width, ffn="gelu",
                      decoder_start_id=1, eos_id=2)
  steps = 4 if test else 1200
  config.optimizer.update(lr=1e-3, min_lr=1e-5, warmup_steps=2 if test else 100,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=8 if test else 32,
                      eval_batch_size=8 if test else 40, eval_batches=2 if test else 5,
                      eval_every=steps if test else 250, log_every=2 if test else 50,
                      checkpoint_every=steps if test else 250)
  return config
