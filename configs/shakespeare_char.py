"""nanoGPT's shakespeare-char recipe (Karpathy), character-level GPT on Tiny Shakespeare.

GPU (no argument): 6 layers x 384, 6 heads, context 256, batch 64, dropout 0.2 (embeddings,
residual branches and attention probabilities), AdamW lr 1e-3 (beta2 0.99, weight decay 0.1 on
matrices and embeddings), 100 warmup steps then cosine to 1e-4 at 5000 steps. CPU ("cpu"
argument): nanoGPT's CPU variant, 4 layers x 128, 4 heads, context 64,
batch 12, 2000 steps, dropout 0, eval on 20 batches; the CPU is split into one XLA device per
core and runs 50 steps per jitted call.

Like nanoGPT: no biases in Linear/LayerNorm, exact GELU, pre-LN, learned positions, tied head,
GPT-2's residual-projection init (std 0.02/sqrt(2 layers)), eval every 250 steps. That it is the
same recipe step for step is checked against a PyTorch re-implementation
(experiments/torch_nanogpt.py --mode=lockstep, tests/training/test_torch_parity.py).
Data: $TFJAX_DATA_DIR/tinyshakespeare/input.txt, else downloaded once.
"""
from tfjax.training.config.defaults import base_config


def get_config(arg=None):
  """The GPU recipe, or with arg 'cpu' its CPU variant.

    python experiments/train.py --config=configs/shakespeare_char.py --workdir=runs/shakespeare
    python experiments/train.py --config=configs/shakespeare_char.py:cpu \
        --workdir=runs/shakespeare_cpu

  Expected validation losses, beside nanoGPT's published ones, with their run times, seeds and
  precision: the shakespeare-char rows of docs/benchmarks/gpu.md (GPU) and
  docs/benchmarks/cpu_training.md (cpu). The cpu variant pins float32 and xla, as its rows were
  measured; on GPU/TPU model.dtype and attention_impl are 'auto' (bfloat16 compute with float32
  params, nanoGPT's autocast precision; the start-up line names the attention that runs), which
  the GPU table's float32 / xla row does not cover.
  """
  if arg not in (None, "", "cpu"):
    raise ValueError(f"configs/shakespeare_char.py takes no argument or 'cpu', got {arg!r}")
  cpu = arg == "cpu"
  config = base_config()
  config.task = "lm"
  config.data.update(name="tinyshakespeare", tokenizer="char", seq_len=64 if cpu else 256,
                     mode="random", eval_mode="random", val_fraction=0.1)
  config.model.update(
      family="decoder", vocab_size=0, d_model=128 if cpu else 384, num_layers=4 if cpu else 6,
      num_heads=4 if cpu else 6, d_ff=512 if cpu else 1536, ffn="gelu", ffn_bias=False,
      attention_bias=False, norm="layernorm", norm_bias=False, norm_placement="pre",
      position="learned", max_len=64 if cpu else 256, tie_embeddings=True,
      scaled_residual_init=True,
      dropout=0.0 if cpu else 0.2,
      attention_dropout=0.0 if cpu else 0.2)  # nanoGPT: dropout_p of its attention as well
  if cpu:  # on any platform: the numbers above are float32 + xla
    config.model.update(dtype="float32", attention_impl="xla")
  config.optimizer.update(name="adamw", lr=1e-3, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1,
                          decay_exclude=("norms", "biases"), clip_norm=1.0, schedule="cosine",
                          warmup_steps=100, min_lr=1e-4)
  config.train.update(num_steps=2000 if cpu else 5000, batch_size=12 if cpu else 64,
                      eval_batch_size=12 if cpu else 64, eval_batches=20 if cpu else 200,
                      eval_every=250, log_every=50 if cpu else 100, checkpoint_every=1000,
                      sample_tokens=200, sample_prompt="\n")
  # One XLA device per core, the batch split over them
  # (tfjax.training.parallel.sharding.configure_cpu_devices).
  if cpu:
    config.mesh.cpu_devices = -1
    config.train.steps_per_call = 50  # one jitted call per logged step: less host dispatch and
                                      # one batch copy per call (docs/benchmarks/cpu_training.md)
  return config
