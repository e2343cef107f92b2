"""tfjax/training/accounting/flops.py: FLOPs per token (nanoGPT's estimate) against XLA's own
count."""


import jax
import pytest

from conftest import tiny_config
from test_params import load_config
from tfjax.training.accounting import flops
from tfjax.nn.models import build_model


@pytest.mark.parametrize("arg,published_millions", [(None, 10.65), ("cpu", None)])
def test_flops_per_token_is_nanogpts_estimate_for_its_recipes(arg, published_millions):
  """nanoGPT's estimate_mfu: 6N + 12 L H Q T, where N is get_num_params(non_embedding=True), the
  parameters less the position table, which train.py prints ("number of parameters: 10.65M" for
  shakespeare-char). Written here from nanoGPT's modules (65 characters, no biases)."""
  cfg = load_config("shakespeare_char", arg, vocab_size=65)
  d, layers, heads, context = cfg.d_model, cfg.num_layers, cfg.attention.num_heads, cfg.max_len
  block = 2 * d + d * 3 * d + d * d + 2 * d * 4 * d  # ln_1, ln_2, c_attn, c_proj, c_fc, c_proj
  n = 65 * d + layers * block + d  # wte (tied head), blocks, ln_f
  if published_millions is not None:
    assert round(n / 1e6, 2) == published_millions
  expected = 6 * n + 12 * layers * heads * (d // heads) * context
  assert flops.flops_per_token(cfg, context) == expected


@pytest.mark.parametrize("family,overrides", [
    ("decoder", dict(tie_embeddings=True)),
    ("decoder", dict(tie_embeddings=False, position="learned")),
    ("encoder", dict()),  # with its MLM head
    ("encoder_decoder", dict(num_decoder_layers=3)),
])
def test_flops_per_token_matches_xlas_count_of_forward_and_backward(family, overrides):
  """XLA's cost analysis of a whole forward + backward pass, per token, against 6N + attention:
  the matrix products dominate at this width, so they agree to within the elementwise work."""
  seq_len, batch = 128, 2
  cfg = tiny_config(family=family, d_model=256, num_heads=4, num_layers=2, d_ff=1024,
                    vocab_size=256, max_len=seq_len, **overrides)
  model = build_model(cfg)
  tokens = jax.numpy.zeros((batch, seq_len), jax.numpy.int32)
  inputs = (tokens, tokens) if family == "encoder_decoder" else (tokens,)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *inputs))

  def loss(variables):
    out = model.apply(variables, *inputs)
    logits = out["mlm_logits"] if isinstance(out, dict) else out
    return jax.numpy.sum(jax.nn.log_softmax(logits)[..., 0])

  xla_flops = jax.jit(jax.grad(loss)).lower(variables).cost_analysis()["flops"]
  ratio = xla_flops / (batch * seq_len) / flops.flops_per_token(cfg, seq_len)
  assert 1.0 <= ratio < 1.01, ratio
