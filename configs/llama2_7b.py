"""LLaMA-2 7B (Touvron et al. 2023): 6,738,415,616 parameters.

32 layers x 4096, 32 heads (MHA), SwiGLU d_ff 11008, RMSNorm (eps 1e-5) pre-LN, RoPE (rotate-half
pairing as in Hugging Face; base 10000), no biases, untied 32000-token output head.
"""
from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The architecture as published; its parameter count is the expected result.

    python -m tfjax.params --config=configs/llama2_7b.py
    (jax.eval_shape only: nothing is allocated)

  Expected last line: "total: 6738415616".

  Training: float32 params, gradients and Adam state take ~100 GiB per device when replicated
  (`--mesh=8,1,1`: 101 GiB), more than an 80 GB H100 holds, so the mesh shards them over all
  devices (FSDP, ZeRO-3): `python -m tfjax.params --config=configs/llama2_7b.py --mesh=1,8,1`
  plans 13.2 GiB per device on 8. Attention: model.attention_impl 'auto' (the Pallas kernel on
  GPU/TPU).
  """
  refuse_argument("configs/llama2_7b.py", arg)
  config = base_config()
  config.model.update(
      family="decoder", vocab_size=32000, d_model=4096, num_layers=32, num_heads=32,
      d_ff=11008, ffn="swiglu", ffn_bias=False, attention_bias=False, norm="rmsnorm",
      norm_eps=1e-5, norm_placement="pre", position="rope", rope_base=10000.0, max_len=4096,
      tie_embeddings=False, scan_layers=True, remat="full", dtype="bfloat16")
  config.mesh.update(data=1, fsdp=-1, tensor=1)  # replicated it does not fit (docstring)
  return config
