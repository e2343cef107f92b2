"""Hugging Face import and export (`python -m tfjax.hf import|export`; docs/hf.md).

  registry.py   architectures by config.json model_type
  mapping.py    tensor rules (HF <-> tfjax layouts) and the strict config.json field reader
  gpt2.py, llama.py, gemma3.py, phi3.py, gpt_neox.py, phi.py, falcon.py, opt.py, bert.py,
  roberta.py, bigbird.py, bart.py, t5.py
                the per-family config and tensor mappings (and their ignorable fields)
  vit.py, clip.py, whisper.py
                the image and speech front-ends' mappings (tfjax/nn/vision.py, clip.py, audio.py)
  modalities.py load / export of those in memory (they are not text training runs)
  shards.py     sharded safetensors export with an index (--max_shard_size)
  reader.py     config.json / safetensors (single or sharded) / tokenizer files, no torch
  importer.py   HF directory -> tfjax run directory (streams tensor by tensor onto the mesh)
  exporter.py   tfjax run directory -> HF directory transformers loads
"""
