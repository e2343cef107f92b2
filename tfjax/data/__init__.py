"""Everything a batch is made from, below the training system (nothing here imports
tfjax.training or tfjax.inference): `datasets.make_dataset` picks a text, synthetic or prepared
dataset from the data config; `tokenizers`, `text_files`, `hashed_rng` (with MLM masking) and
`packing` serve the text datasets. Corpora bigger than memory: `prepare` tokenizes them once into
memory-mappable token shards with a manifest (`tfjax-prepare`, `python -m tfjax.data.prepare`),
and `prepared` serves training batches from such a directory. Image and audio folders
(`tfjax-prepare --input=images:DIR | audio:DIR`): `image_folder`, `audio_folder` and `log_mel`
(Whisper's features in NumPy) read them, `prepare_media` and `media_shards` write their shards,
and `prepared_media` reads them back."""
