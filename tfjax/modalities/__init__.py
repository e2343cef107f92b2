"""Synthetic data for the non-text front-ends (ViT, CLIP, Whisper) and the Funnel Transformer
(docs/modalities.md, docs/attention/funnel.md).

  synthetic.py  the synthetic images, image-text pairs, spectrogram-transcript pairs, motifs and
                dominant-group rows

They train through the main loop as registered tasks (tfjax/training/tasks/: vit, clip, whisper,
funnel, funnel_classification): python experiments/train.py --config=configs/vit_synthetic.py.
"""
