"""BERT-base (Devlin et al. 2019): 109,482,240 parameters (Hugging Face `BertModel`, pooler incl.).

12 layers x 768, 12 heads, d_ff 3072, vocab 30522, 512 learned positions, 2 token types,
post-LN LayerNorm (eps 1e-12) also on the embedding sum, GELU, pooler on [CLS].
The MLM head is off so the count is the published backbone's; pretraining turns it on with
`--config.model.mlm_head=True` (+622,650: dense 768x768+768, LayerNorm, output bias 30522; the
decoder matrix is tied to the token embedding).
"""
from tfjax.training.config.defaults import base_config, refuse_argument


def get_config(arg=None):
  """The architecture as published; its parameter count is the expected result.

    python -m tfjax.params --config=configs/bert_base.py

  Expected last line: "total: 109482240".
  """
  refuse_argument("configs/bert_base.py", arg)
  config = base_config()
  config.model.update(
      family="encoder", vocab_size=30522, d_model=768, num_layers=12, num_heads=12, d_ff=3072,
      ffn="gelu", norm="layernorm", norm_eps=1e-12, norm_placement="post", embed_norm=True,
      position="learned", max_len=512, type_vocab_size=2, mlm_head=False, pooler=True,
      tie_embeddings=True, dropout=0.1, attention_dropout=0.1)
  return config
