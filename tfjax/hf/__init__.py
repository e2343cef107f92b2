"""Hugging Face import and export (`python -m tfjax.hf import|export`; docs/hf.md).

The core, here:
  registry.py   architectures by config.json model_type
  mapping.py    tensor rules (HF <-> tfjax layouts) and the strict config.json field reader
  modalities.py load / export of the image, speech and Funnel models in memory
  shards.py     sharded safetensors export with an index (--max_shard_size)
  reader.py     config.json / safetensors (single or sharded) / tokenizer files, no torch
  importer.py   HF directory -> tfjax run directory (streams tensor by tensor onto the mesh)
  exporter.py   tfjax run directory -> HF directory transformers loads
  task_runs.py  run directories of the task models (ViT, CLIP, Whisper, Funnel)
  __main__.py   the command line

The per-model mappings, in models/ (one file per family: its config and tensor mappings and its
ignorable fields):
  gpt2, llama, gemma3, phi3, gpt_neox, phi, falcon, opt, bert, roberta, bigbird, longformer,
  bart, t5        the text families (tfjax.nn.models)
  vit, clip, clip_vision, whisper, funnel
                  the image and speech front-ends and the Funnel Transformer (tfjax/nn/vision.py,
                  clip.py, audio.py, funnel.py)

`tfjax.hf.llama` and the other flat spellings keep working through `ALIASES`: each is the SAME
module object as tfjax.hf.models.<name> (tfjax/runtime/module_aliases.py).
"""

from tfjax.runtime import module_aliases as _module_aliases

MODELS = ("bart", "bert", "bigbird", "clip", "falcon", "funnel", "gemma3", "gpt2", "gpt_neox",
          "llama", "longformer", "opt", "phi", "phi3", "roberta", "t5", "vit", "whisper",
          "clip_vision")
ALIASES = {name: f"{__name__}.models.{name}" for name in MODELS}

_module_aliases.install(__name__, ALIASES)
