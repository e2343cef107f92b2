"""Training the non-text front-ends (ViT, CLIP, Whisper) on synthetic data (docs/modalities.md).

  synthetic.py  the synthetic images, image-text pairs and spectrogram-transcript pairs
  tasks.py      each modality's model, batch, loss and evaluation metrics
  train.py      a small Optax loop over a task (experiments/train_modality.py is its CLI)
"""
