"""Generation from a model's parameters, below the training system (which samples with it).

  decode.py          generate(): prompts in, tokens out (greedy, sampling, beam)
  cached_model.py    the model with its KV cache: the decode config, init, prefill and steps
  sample_loop.py     greedy / temperature / top-k / top-p token choice in one while_loop
  beam.py            beam search with the GNMT length penalty
  decode_window.py   generating past model.max_len (sliding context or ring-buffer cache)
  sampling.py        a training run's greedy sample of train.sample_prompt
  generate.py        prompts as text, continuations as text (tfjax-generate's library)

The `tfjax-generate` command (it restores a run) is tfjax/training/entry/generate_main.py.
"""
