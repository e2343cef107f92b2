#!/usr/bin/env bash
# Issue 41's targets, "as shipped, same GPU", in one call: nanoGPT's own code (karpathy/nanoGPT's
# train.py and bench.py, torch.compile, bf16 autocast) beside tfjax's shipped configs.
#
#   RESULTS=bench_results/gpu NANOGPT_DIR=.gpu/nanoGPT bash scripts/gpu_phase_asshipped.sh
#
# Parts ($PARTS, default all, in this order; each under its own limit, logs in $RESULTS/asshipped/):
#   recipe  nanoGPT's `train.py config/train_shakespeare_char.py` (5000 steps, evals every 250)
#           and tfjax's `experiments/train.py --config=configs/shakespeare_char.py`, no flags:
#           wall time of the whole command and best val loss of each
#   gpt2    GPT-2 small at 16 x 1024, vocab 50304, dropout 0: nanoGPT's bench.py (random data)
#           and tfjax's experiments/bench_train.py on configs/gpt2_small.py with dtype and
#           attention as shipped: step time, tokens/s, MFU
#   owt     configs/gpt2_owt.py's micro-batch (12 x 1024, one micro-batch per step) as shipped,
#           on Tiny Shakespeare characters in its 50304 vocabulary: bench_train.py's MFU, beside
#           nanoGPT's train.py at the same batch and model (a data dir without meta.pkl, so its
#           vocabulary is 50304 too)
#   loop    the recipe's steady tokens/s logged by the real loop (the recipe part's metrics.jsonl)
#           against bench_train.py on the same config
# Then $RESULTS/asshipped/asshipped.json holds every number, with device, versions and date.
#
# nanoGPT's code is an uncommitted checkout carried with the call ($NANOGPT_DIR under the ignored
# .gpu/, named in the device call's carry: a nested git checkout travels without its files
# otherwise; never committed here). Needs torch with CUDA beside jax on the machine. Its shakespeare_char data is prepared by its own prepare.py from
# $TFJAX_DATA_DIR/tinyshakespeare/input.txt when the .bin files are missing (offline: the text is
# copied in first). NANOGPT_DIR unset or missing: the nanoGPT halves are skipped and say so.
# TOY=1 shrinks tfjax's halves to a few steps and rows (a CPU check of the flags; numbers
# meaningless).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
PARTS=${PARTS:-recipe gpt2 owt loop}
OUTDIR="$RESULTS/asshipped"
mkdir -p "$OUTDIR"
NANOGPT_DIR=${NANOGPT_DIR:-$PWD/.gpu/nanoGPT}
T_RECIPE=${T_RECIPE:-240} T_BENCH=${T_BENCH:-150}
TOY=${TOY:-0}
SECONDS=0
# tfjax's toy flags: the same commands, shrunk (TOY=1 only)
TOY_RECIPE="" TOY_BENCH=""
if [ "$TOY" = 1 ]; then
  TOY_RECIPE="--config.train.num_steps=4 --config.train.eval_every=2 --config.train.eval_batches=1
    --config.train.log_every=2 --config.train.sample_tokens=0 --config.model.num_layers=1
    --config.train.batch_size=4 --config.train.eval_batch_size=4"
  TOY_BENCH="--steps=2 --warmup=1 --config.model.num_layers=1 --config.data.seq_len=64
    --config.model.max_len=64 --config.train.batch_size=2 --config.train.eval_batch_size=2"
fi
have_nanogpt() { [ -f "$NANOGPT_DIR/train.py" ] && [ -f "$NANOGPT_DIR/bench.py" ]; }

part() {  # part NAME SECONDS COMMAND...: wall time in $OUTDIR/NAME.wall, output in NAME.log
  local name=$1 limit=$2; shift 2
  echo "=== asshipped $name (limit ${limit}s, at ${SECONDS}s)"
  local start; start=$(date +%s%N)
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  local rc=$?
  local end; end=$(date +%s%N)
  printf "%d.%03d\n" $(((end - start) / 1000000000)) $((((end - start) / 1000000) % 1000)) \
    >"$OUTDIR/$name.wall"
  printf "asshipped_%s\t%s\t%s\n" "$name" "$rc" "$SECONDS" >>"$RESULTS/phases.tsv"
  echo "=== asshipped $name rc=$rc wall $(cat "$OUTDIR/$name.wall") s"; tail -n 3 "$OUTDIR/$name.log"
}

nanogpt_data() {  # nanoGPT's own shakespeare_char preparation, offline
  local d="$NANOGPT_DIR/data/shakespeare_char"
  if [ ! -f "$d/train.bin" ]; then
    cp "$TFJAX_DATA_DIR/tinyshakespeare/input.txt" "$d/input.txt"
    (cd "$d" && $PY prepare.py) >"$OUTDIR/nanogpt_prepare.log" 2>&1
  fi
  # the same tokens without meta.pkl: nanoGPT's train.py then builds the 50304-token model
  mkdir -p "$NANOGPT_DIR/data/shakespeare_char_50304"
  (cd "$NANOGPT_DIR/data/shakespeare_char_50304" && \
    ln -sf ../shakespeare_char/train.bin train.bin && ln -sf ../shakespeare_char/val.bin val.bin)
}

GPT2_FLAGS="--config.data.name=tinyshakespeare --config.data.tokenizer=char
  --config.data.seq_len=1024 --config.data.mode=random --config.model.dropout=0.0"

for p in $PARTS; do
  case $p in
    recipe)
      if have_nanogpt; then
        nanogpt_data
        rm -rf "$NANOGPT_DIR/out-shakespeare-char"
        part nanogpt_recipe "$T_RECIPE" bash -c "cd '$NANOGPT_DIR' && \
          $PY train.py config/train_shakespeare_char.py"
      else
        echo "=== asshipped nanogpt_recipe skipped: no nanoGPT checkout at $NANOGPT_DIR"
      fi
      rm -rf /tmp/tfjax_asshipped_recipe
      # shellcheck disable=SC2086
      part tfjax_recipe "$T_RECIPE" $PY experiments/train.py \
        --config=configs/shakespeare_char.py --workdir=/tmp/tfjax_asshipped_recipe \
        --compilation_cache=none $TOY_RECIPE
      cp /tmp/tfjax_asshipped_recipe/metrics.jsonl "$OUTDIR/tfjax_recipe_metrics.jsonl"
      cp /tmp/tfjax_asshipped_recipe/config.json "$OUTDIR/tfjax_recipe_config.json" ;;
    gpt2)
      if have_nanogpt; then
        part nanogpt_bench "$T_BENCH" bash -c "cd '$NANOGPT_DIR' && $PY bench.py \
          --batch_size=16 --block_size=1024 --real_data=False --compile=True"
      fi
      # shellcheck disable=SC2086
      part tfjax_gpt2 "$T_BENCH" $PY experiments/bench_train.py --config=configs/gpt2_small.py \
        $GPT2_FLAGS --config.model.vocab_size=50304 --config.train.batch_size=16 --steps=20 \
        --warmup=3 --out="$OUTDIR/tfjax_gpt2" $TOY_BENCH ;;
    owt)
      if have_nanogpt; then
        nanogpt_data
        part nanogpt_owt "$T_BENCH" bash -c "cd '$NANOGPT_DIR' && $PY train.py \
          --dataset=shakespeare_char_50304 --batch_size=12 --block_size=1024 \
          --gradient_accumulation_steps=1 --max_iters=60 --eval_interval=100000 \
          --eval_iters=1 --log_interval=10 --dropout=0.0 --bias=False --compile=True \
          --always_save_checkpoint=False --out_dir=/tmp/nanogpt_owt"
      fi
      # shellcheck disable=SC2086
      part tfjax_owt "$T_BENCH" $PY experiments/bench_train.py --config=configs/gpt2_owt.py \
        --config.data.name=tinyshakespeare --config.data.tokenizer=char \
        --config.data.expect_tokenizer= --config.train.batch_size=12 \
        --config.optimizer.grad_accum_steps=1 --steps=20 --warmup=3 \
        --out="$OUTDIR/tfjax_owt" $TOY_BENCH ;;
    loop)
      # shellcheck disable=SC2086
      part tfjax_recipe_bench "$T_BENCH" $PY experiments/bench_train.py \
        --config=configs/shakespeare_char.py --steps=100 --warmup=10 \
        --out="$OUTDIR/tfjax_recipe_bench" $TOY_BENCH ;;
    *) echo "unknown asshipped part $p" ;;
  esac
done

# Every number into one JSON (missing parts are null): parsed from the commands' own output.
JAX_PLATFORMS=cpu $PY - "$OUTDIR" <<'EOF'
import datetime, json, os, re, statistics, sys
out = sys.argv[1]
def text(name):
  path = os.path.join(out, name)
  return open(path, errors="replace").read() if os.path.exists(path) else ""
def wall(name):
  t = text(name + ".wall").strip()
  return float(t) if t else None
def bench(name):
  t = text(os.path.join(name, "bench_train.json"))
  return json.loads(t) if t else None
nano_vals = [float(v) for v in re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)",
                                         text("nanogpt_recipe.log"))]
metrics = [json.loads(l) for l in text("tfjax_recipe_metrics.jsonl").splitlines() if l.strip()]
tf_vals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
# the loop's steady tokens/s: logged rates after the first two logs (compile, warm-up)
rates = [m["train/tokens_per_sec"] for m in metrics if "train/tokens_per_sec" in m][2:]
bench_line = re.findall(r"time per iteration: ([\d.]+)ms, MFU: ([\d.]+)%",
                        text("nanogpt_bench.log"))
owt_iters = re.findall(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms, mfu ([-\d.]+)%",
                       text("nanogpt_owt.log"))
owt_steady = [(float(ms), float(mfu)) for i, ms, mfu in owt_iters if int(i) >= 20]
recipe_bench = bench("tfjax_recipe_bench")
result = {
  "date": datetime.date.today().isoformat(),
  "env": text("../env.log")[-2000:] or None,
  "recipe": {"nanogpt_wall_s": wall("nanogpt_recipe"), "nanogpt_best_val": min(nano_vals, default=None),
             "tfjax_wall_s": wall("tfjax_recipe"), "tfjax_best_val": min(tf_vals, default=None),
             "tfjax_config_model": json.loads(text("tfjax_recipe_config.json") or "{}").get("model")},
  "gpt2_16x1024": {"nanogpt_bench_ms": float(bench_line[-1][0]) if bench_line else None,
                   "nanogpt_bench_mfu_pct": float(bench_line[-1][1]) if bench_line else None,
                   "tfjax": bench("tfjax_gpt2")},
  "owt_12x1024": {"nanogpt_train_ms_median": statistics.median([m for m, _ in owt_steady]) if owt_steady else None,
                  "nanogpt_train_mfu_pct_last": owt_steady[-1][1] if owt_steady else None,
                  "tfjax": bench("tfjax_owt")},
  "loop_vs_bench": {"loop_tokens_per_s_median": statistics.median(rates) if rates else None,
                    "bench_tokens_per_s": recipe_bench and recipe_bench.get("tokens_per_s")},
}
with open(os.path.join(out, "asshipped.json"), "w") as f:
  json.dump(result, f, indent=2)
print(json.dumps({k: v for k, v in result.items() if k != "env"}, indent=1, default=str)[:3000])
EOF
echo "=== asshipped done after ${SECONDS}s"
