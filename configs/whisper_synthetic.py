"""Whisper on synthetic utterances (tfjax/modalities/synthetic.py `utterances`), CPU: task
'whisper' (tfjax/training/tasks/whisper.py) through the main loop.

Transcripts of 1-4 symbols from 8; each symbol is a fixed random 16-bin spectrum held over a
random share of 64 frames (the segments tile the utterance), plus noise std 0.3. The model hears
64 frames -> 32 encoder positions after the stride-2 conv; 2 encoder and 2 decoder layers x 64,
4 heads; tokens: 0 pad, 1 start of transcript, 2 end, symbols 3-10. Teacher-forced
cross-entropy, AdamW 2e-3, batch 32; eval: token accuracy and exact match.
"""

from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The CPU recipe; 'test' is the unit tests' shorter run.

    python experiments/train.py --config=configs/whisper_synthetic.py --workdir=runs/whisper

  Measured: docs/modalities.md (loss, token accuracy, exact match).
  """
  if arg != "test":
    refuse_argument("configs/whisper_synthetic.py", arg, "no argument or 'test'")
  test = arg == "test"
  width = 32 if test else 64
  config = base_config("whisper")
  config.model.update(num_mels=16, max_source_positions=16 if test else 32,
                      max_target_positions=8, vocab_size=16, d_model=width, encoder_layers=2,
                      encoder_heads=4, encoder_ffn=2 * width, decoder_layers=2, decoder_heads=4,
                      decoder_ffn=2 * width, ffn="gelu", decoder_start_id=1, eos_id=2)
  config.data.update(num_symbols=8, max_tokens=3 if test else 4, noise=0.3, amplitude=1.0,
                     template_seed=1234)
  steps = 80 if test else 400
  config.optimizer.update(lr=2e-3, min_lr=2e-4, warmup_steps=10 if test else 40,
                          weight_decay=0.01, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=32,
                      eval_batches=2 if test else 16, eval_every=steps,
                      log_every=20 if test else 50, checkpoint_every=steps)
  return config
