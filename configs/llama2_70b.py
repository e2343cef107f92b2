"""LLaMA-2 70B (Touvron et al. 2023): 68,976,648,192 parameters.

80 layers x 8192, 64 query heads sharing 8 KV heads (GQA), SwiGLU d_ff 28672, RMSNorm (eps 1e-5)
pre-LN, RoPE (rotate-half pairing as in Hugging Face; base 10000), no biases, untied 32000-token
output head. Laid out for a v5p-256 (128 chips): FSDP over 32 x tensor parallelism over 4
(`python -m tfjax.aot --config=configs/llama2_70b.py --target=v5p-256`).
"""
from tfjax.training.config.defaults import base_config


def get_config(arg=None):
  """The architecture as published; its parameter count is the expected result.

    python -m tfjax.params --config=configs/llama2_70b.py
    (jax.eval_shape only: nothing is allocated)

  Expected last line: "total: 68976648192".
  """
  del arg
  config = base_config()
  config.model.update(
      family="decoder", vocab_size=32000, d_model=8192, num_layers=80, num_heads=64,
      num_kv_heads=8, d_ff=28672, ffn="swiglu", ffn_bias=False, attention_bias=False,
      norm="rmsnorm", norm_eps=1e-5, norm_placement="pre", position="rope", rope_base=10000.0,
      max_len=4096, tie_embeddings=False, scan_layers=True, remat="full", dtype="bfloat16")
  config.mesh.update(data=1, fsdp=-1, tensor=4)
  config.train.update(batch_size=128, eval_batch_size=128)
  return config
