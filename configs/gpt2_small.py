"""GPT-2 small (Radford et al. 2019): 124,439,808 parameters.

12 layers x 768, 12 heads, d_ff 3072, learned positions (1024), pre-LN LayerNorm (eps 1e-5),
GELU in GPT-2's tanh approximation (`gelu_new`), biases everywhere, LM head tied to the token
embedding.
"""
from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The architecture as published; its parameter count is the expected result.

    python -m tfjax.params --config=configs/gpt2_small.py

  Expected last line: "total: 124439808".
  """
  refuse_argument("configs/gpt2_small.py", arg)
  config = base_config()
  config.model.update(
      family="decoder", vocab_size=50257, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
      ffn="gelu_tanh", ffn_bias=True, attention_bias=True, norm="layernorm", norm_eps=1e-5,
      norm_placement="pre", position="learned", max_len=1024, tie_embeddings=True, dropout=0.1)
  return config
