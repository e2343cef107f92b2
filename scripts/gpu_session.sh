#!/usr/bin/env bash
# One measuring session on an NVIDIA GPU (H100 / H200), as one command with a fixed time budget.
#
#   RESULTS=bench_results/gpu bash scripts/gpu_session.sh [PHASE ...]
#
# Phases, in priority order (default: all), each under its own time limit so that one that hangs
# or fails leaves the rest their time:
#   env        versions of jax / flax / optax / orbax, nvidia-smi
#   tests      the kernel and ops tests on the GPU (GPU-marked ones included): Triton-compiled
#              Pallas vs xla and NumPy over the seeded sweeps, bf16 and fp32
#   attention  experiments/bench_attention.py: ours, cuDNN, JAX's bundled Pallas mha, XLA
#   train      experiments/bench_train.py: GPT-2 small (bf16, 1024 tokens a row), tokens/s and MFU
#   train_vocab  the same with the vocabulary padded to 50304 = 393 x 128 (nanoGPT's choice), so
#              that the LM head's GEMMs tile evenly
#   train_cublas train_vocab with XLA's Triton GEMM fusions off: every GEMM a cuBLAS call
#   recipe     nanoGPT's shakespeare-char GPU recipe, 5000 steps, to its published val loss
#   recipe_bf16  the same recipe computing in bfloat16 (params float32), nanoGPT's own precision
#   profile_recipe  the recipe's step without attention dropout (the program the AOT kernel-sum
#              estimate models) traced, float32 and bfloat16: time per kernel category
#   tune       experiments/bench_attention.py --tune: candidates for GPU_TILINGS
#   profile    GPT-2 small's step traced with jax.profiler (pallas and cudnn attention): device
#              time per kernel category and idle time (tfjax/aot/kernel_profile.py), xla timed
#   alibi      experiments/bench_attention.py, ours only, causal: plain, ALiBi and GQA side by side
#   peaks      experiments/bench_peaks.py: achieved GEMM FLOP/s (bf16 and float32/TF32, square and
#              at the recipe's and GPT-2 small's shapes) and copy bandwidth (the kernel-sum
#              model's efficiencies, tfjax/aot/kernel_model.py)
#   nanogpt    nanoGPT's shakespeare-char recipe in PyTorch on the same GPU (gpu_phase_nanogpt.sh)
#   asshipped  issue 41's side by side with nanoGPT's own train.py / bench.py (a checkout carried
#              as $NANOGPT_DIR, default .gpu/nanoGPT), tfjax's configs as shipped
#              (gpu_phase_asshipped.sh; limits T_RECIPE=240 s per recipe run, T_BENCH=150 s per
#              bench, 7 runs in all)
#   mgpu       the Mosaic GPU forward kernel: its GPU tests and a forward bench (gpu_phase_mgpu.sh)
#   sweeps     ablation sweeps ($SWEEPS, default "ffn heads"; scale $SWEEP_SCALE, default medium)
#              on the GPU, $SWEEP_PARALLEL (8) points at a time, each its own process; float32
#              matmuls at full precision (no TF32) as on a CPU. Workdirs under /tmp/tfjax_sweeps
#              (a rerun on the same machine resumes them); the per-seed results land in
#              $RESULTS/sweeps/<sweep>_<scale>.jsonl, naming commit $RESULTS_COMMIT (the copy's
#              own .git, if any, may be stale: set it to the commit the working tree holds)
# Everything lands in $RESULTS (logs, JSON, markdown; default bench_results/gpu), packed into
# results.tgz at the end; the last lines printed are a summary (scripts/gpu_summary.py). With $OUT
# set (the device tool's return folder), results.tgz and summary.md are copied there.
#
# Needs: python3 with jax[cuda] (and flax, optax, orbax); ml_collections and tensorboardX as
# wheels in .whl/ when the machine lacks them; Tiny Shakespeare under $TFJAX_DATA_DIR.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
PHASES=${*:-env tests attention train recipe tune}
# GPT-2 small compiles in ~40 s on an H200 (jax 0.11.2), then 20 timed steps: train and profile
# phases get 130 s. The recipe (5000 steps with its evaluations) took 178 s with attention dropout.
T_TESTS=${T_TESTS:-90} T_ATTN=${T_ATTN:-150} T_TRAIN=${T_TRAIN:-130} T_RECIPE=${T_RECIPE:-200}
T_TUNE=${T_TUNE:-60} T_PROFILE=${T_PROFILE:-130}
SECONDS=0

phase() {  # phase NAME SECONDS COMMAND...: run under a limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "=== $name (limit ${limit}s, at ${SECONDS}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
  local rc=$?
  printf "%s\t%s\t%s\n" "$name" "$rc" "$((SECONDS - start))" >>"$RESULTS/phases.tsv"
  echo "=== $name rc=$rc after ${SECONDS}s"; tail -n 4 "$RESULTS/$name.log"
  checkpoint
}

train_phase() {  # train_phase NAME [FLAG ...]: GPT-2 small's step, bench_train.py, extra flags last
  local name=$1; shift
  phase "$name" "$T_TRAIN" $PY experiments/bench_train.py --config=configs/gpt2_small.py \
    --config.data.name=tinyshakespeare --config.data.tokenizer=char \
    --config.data.seq_len=1024 --config.data.mode=random --config.model.dropout=0.0 \
    --config.model.dtype=bfloat16 --config.model.attention_impl=pallas \
    --config.train.batch_size=16 --steps=20 --warmup=3 --out="$RESULTS/$name" "$@"
}

checkpoint() {  # what is done so far, into $OUT: a call cut by its time limit still returns it
  if [ -n "${OUT:-}" ] && [ "$OUT" != "$RESULTS" ]; then
    tar -czf "$OUT/partial.tgz" -C "$RESULTS" . 2>/dev/null
  fi
}

for p in $PHASES; do
  case $p in
    env)
      # The machine's flax / optax / orbax first; the versions CI tests (wheels in .whl/fallback)
      # only if tfjax does not import with them.
      if ! $PY -c "import tfjax.training.loop.train" >"$RESULTS/import.log" 2>&1 && ls .whl/fallback/*.whl >/dev/null 2>&1; then
        echo "tfjax import failed with the machine's packages (import.log); using .whl/fallback"
        $PY -m pip install -q --no-index --no-deps --target /tmp/site_fallback .whl/fallback/*.whl
        export PYTHONPATH=$PWD:/tmp/site_fallback${PYTHONPATH#$PWD}
      fi
      { nvidia-smi; $PY -c "import sys, jax, jaxlib, flax, optax, orbax.checkpoint as oc
print(sys.version); print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__,
      'optax', optax.__version__, 'orbax', oc.__version__ if hasattr(oc, '__version__') else '?')
print(jax.devices(), jax.devices()[0].device_kind)
import tfjax.training.loop.train, tfjax.nn.ops; print('tfjax imports ok')"; } >"$RESULTS/env.log" 2>&1
      cat "$RESULTS/env.log" | tail -n 6 ;;
    tests)
      XLA_PYTHON_CLIENT_PREALLOCATE=false phase tests "$T_TESTS" $PY -m pytest -q -n 8 ${TEST_SELECT:-} \
        -p no:cacheprovider ${TEST_ARGS:-tests/nn/kernels/test_kernels.py tests/nn/test_ops.py} --junitxml="$RESULTS/tests.xml" ;;
    attention)
      phase attention "$T_ATTN" $PY experiments/bench_attention.py --out="$RESULTS/attention" \
        --lengths=1024,4096,16384 --head_dims=64,128 --variant_impls=pallas \
        --iters=5 --min_seconds=0.3 --compile_workers=12 ;;
    train) train_phase train ;;
    train_vocab) train_phase train_vocab --config.model.vocab_size=50304 ;;
    train_cublas)
      XLA_FLAGS="--xla_gpu_enable_triton_gemm=false" train_phase train_cublas \
        --config.model.vocab_size=50304 ;;
    recipe|recipe_bf16)
      dtype=float32; [ $p = recipe_bf16 ] && dtype=bfloat16
      rm -rf "/tmp/tfjax_$p"
      phase $p "$T_RECIPE" $PY experiments/train.py --config=configs/shakespeare_char.py \
        --workdir="/tmp/tfjax_$p" --compilation_cache=none --config.model.dtype=$dtype
      cp "/tmp/tfjax_$p/metrics.jsonl" "$RESULTS/${p}_metrics.jsonl" 2>/dev/null ;;
    profile_recipe)
      for dtype in ${RECIPE_DTYPES:-float32 bfloat16}; do
        phase "profile_recipe_$dtype" "${T_PROFILE_RECIPE:-90}" $PY experiments/bench_train.py \
          --config=configs/shakespeare_char.py --config.model.attention_dropout=0.0 \
          --config.model.dtype=$dtype --steps=50 --warmup=5 --profile_steps=5 \
          --out="$RESULTS/profile_recipe_$dtype"
        rm -rf "$RESULTS/profile_recipe_$dtype/trace"
      done ;;
    tune)
      phase tune "$T_TUNE" $PY experiments/bench_attention.py --tune --out="$RESULTS/tune" \
        --lengths=4096 --head_dims=64,128 --iters=3 --min_seconds=0.1 --compile_workers=12 ;;
    profile)
      for impl in ${PROFILE_IMPLS:-pallas cudnn xla}; do
        steps=20; profile=5; [ $impl = xla ] && profile=0
        phase "profile_$impl" "$T_PROFILE" $PY experiments/bench_train.py \
          --config=configs/gpt2_small.py --config.data.name=tinyshakespeare \
          --config.data.tokenizer=char --config.data.seq_len=1024 --config.data.mode=random \
          --config.model.dropout=0.0 --config.model.dtype=bfloat16 \
          --config.model.attention_impl=$impl --config.train.batch_size=16 --steps=$steps \
          --warmup=3 --profile_steps=$profile --out="$RESULTS/profile_$impl"
        rm -rf "$RESULTS/profile_$impl/trace"
      done ;;
    alibi)
      phase alibi "${T_ALIBI:-90}" $PY experiments/bench_attention.py --out="$RESULTS/alibi" --impls=pallas \
        --variant_impls=pallas --causal=true --lengths=${ALIBI_LENGTHS:-1024,4096,16384} --head_dims=64,128 \
        --iters=5 --min_seconds=0.3 --compile_workers=12 ;;
    peaks)
      # Shapes: the recipe's (16384 tokens x 384 / 1536, the 65-letter head, and its unfused
      # attention's scores and values: 64 x 6 heads of 256 x 64 x 256 and 256 x 256 x 64) and
      # GPT-2 small's (16384 x 768 / 3072, the 50304 head).
      phase peaks "${T_PEAKS:-90}" $PY experiments/bench_peaks.py --out="$RESULTS/peaks" \
        --gemm_shapes=${PEAK_SHAPES:-16384x384x1536,16384x1536x384,16384x384x384,16384x384x65,384x256x64x256,384x256x256x64,16384x768x3072,16384x3072x768,16384x768x50304} ;;
    sweeps)
      for sweep in ${SWEEPS:-ffn heads}; do
        name=${sweep}_${SWEEP_SCALE:-medium} args="--config=configs/ablations/$sweep.py --scale=${SWEEP_SCALE:-medium}"
        mkdir -p "$RESULTS/sweeps"
        TFJAX_CODE_COMMIT=${RESULTS_COMMIT:-} XLA_PYTHON_CLIENT_PREALLOCATE=false \
          JAX_DEFAULT_MATMUL_PRECISION=highest \
          XLA_FLAGS="--xla_gpu_autotune_level=0" phase "sweep_$name" "${T_SWEEP:-150}" \
          $PY experiments/sweep.py $args --workdir="/tmp/tfjax_sweeps/$name" \
          --parallel="${SWEEP_PARALLEL:-8}"
        JAX_PLATFORMS=cpu $PY experiments/sweep.py $args --workdir="/tmp/tfjax_sweeps/$name" \
          --report_only --results_jsonl="$RESULTS/sweeps/$name.jsonl" \
          ${RESULTS_COMMIT:+--results_commit=$RESULTS_COMMIT} >>"$RESULTS/sweep_$name.log" 2>&1
        tail -n 2 "$RESULTS/sweep_$name.log"; checkpoint
      done ;;
    nanogpt|mgpu|asshipped)
      RESULTS=$RESULTS PY=$PY bash "scripts/gpu_phase_$p.sh"; checkpoint ;;
    *) echo "unknown phase $p" ;;
  esac
done
$PY scripts/gpu_summary.py "$RESULTS" 2>&1 | tee "$RESULTS/summary.md"
tar -czf /tmp/results.tgz -C "$RESULTS" . && mv /tmp/results.tgz "$RESULTS/results.tgz"
if [ -n "${OUT:-}" ] && [ "$OUT" != "$RESULTS" ]; then
  cp "$RESULTS/results.tgz" "$RESULTS/summary.md" "$OUT/" && rm -f "$OUT/partial.tgz"
fi
echo "total ${SECONDS}s"
