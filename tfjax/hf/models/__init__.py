"""The per-model Hugging Face mappings, one file per family: its config.json fields read strictly
(mapped, checked or ignored) and its tensor rules (tfjax/hf/mapping.py). tfjax/hf/registry.py
names them by model_type."""
