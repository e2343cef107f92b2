"""Training the non-text front-ends (ViT, CLIP, Whisper) and the Funnel Transformer on synthetic
data (docs/modalities.md, docs/attention/funnel.md).

  synthetic.py  the synthetic images, image-text pairs, spectrogram-transcript pairs and motifs
  tasks.py      each modality's model, batch, loss and evaluation metrics
  train.py      a small Optax loop over a task (experiments/train_modality.py is its CLI)
"""
