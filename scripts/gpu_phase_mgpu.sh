#!/usr/bin/env bash
# The Mosaic GPU forward (tfjax/nn/kernels/flash_attention_mgpu.py) on a Hopper GPU, as one phase:
#
#   RESULTS=bench_results/gpu bash scripts/gpu_phase_mgpu.sh
#
#   1. its GPU-marked tests (tests/nn/kernels/test_flash_attention_mgpu.py: out, lse and gradients against
#      xla in bf16), limit T_MGPU_TESTS (60 s), log in $RESULTS/mgpu/tests.log;
#   2. a forward-only bench, bf16, L 4096 and 16384, D 64 and 128, causal and not, limit
#      T_MGPU_BENCH (90 s) in all: first ours with the Triton forward ('pallas') and cuDNN, then,
#      in a second process so that a faulting or hanging kernel cannot take the first one's rows,
#      ours with the Mosaic forward ('pallas_mosaic'); merged into $RESULTS/mgpu/results.{json,md}.
# The Mosaic bench runs when the tests passed or failed on values (pytest rc 0 or 1); after a
# timeout or crash only the Triton / cuDNN bench runs. Either way the tests' error tail is printed.
# LENGTHS, HEAD_DIMS, TOKENS, D_MODEL override the bench sizes (small ones check the script on CPU).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
OUT_DIR=$RESULTS/mgpu
mkdir -p "$OUT_DIR"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
T_MGPU_TESTS=${T_MGPU_TESTS:-60} T_MGPU_BENCH=${T_MGPU_BENCH:-90}
LENGTHS=${LENGTHS:-4096,16384} HEAD_DIMS=${HEAD_DIMS:-64,128}
TOKENS=${TOKENS:-16384} D_MODEL=${D_MODEL:-2048}
SECONDS=0

# Versions first: JAX's own Mosaic attention refuses causal masks on CUDA 12.8.0-12.9.0 (a ptxas
# miscompilation), so a causal failure below is read against this line.
$PY -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)
try:
  from jax._src.lib import cuda_versions; print('cuda runtime', cuda_versions.cuda_runtime_get_version())
except Exception as e: print('cuda runtime unknown:', e)" 2>&1 | tee "$OUT_DIR/versions.log" | tail -n 2

echo "=== mgpu tests (limit ${T_MGPU_TESTS}s)"
# -v: a test's verdict is logged as it ends, so a run cut by the limit still shows which passed.
XDIST=""; $PY -c "import xdist" 2>/dev/null && XDIST="-n 4"
timeout --signal=TERM --kill-after=5 "$T_MGPU_TESTS" $PY -m pytest -v $XDIST -p no:cacheprovider \
  -rfE -m gpu tests/nn/kernels/test_flash_attention_mgpu.py --junitxml="$OUT_DIR/tests.xml" \
  >"$OUT_DIR/tests.log" 2>&1
tests_rc=$?
echo "=== mgpu tests rc=$tests_rc after ${SECONDS}s"
if [ "$tests_rc" -ne 0 ]; then tail -n 40 "$OUT_DIR/tests.log"; else tail -n 3 "$OUT_DIR/tests.log"; fi

bench() {  # bench NAME LIMIT IMPLS: forward-only sweep into $OUT_DIR/NAME
  echo "=== mgpu bench $1 (limit ${2}s, at ${SECONDS}s)"
  timeout --signal=TERM --kill-after=5 "$2" $PY experiments/bench_attention.py --out="$OUT_DIR/$1" \
    --impls="$3" --phases=fwd --variant_impls=none --lengths="$LENGTHS" --head_dims="$HEAD_DIMS" \
    --causal=false,true --dtype=bfloat16 --tokens="$TOKENS" --d_model="$D_MODEL" --iters=5 \
    --min_seconds=0.2 --compile_workers=8 >"$OUT_DIR/$1.log" 2>&1
  local rc=$?
  echo "=== mgpu bench $1 rc=$rc after ${SECONDS}s"; tail -n 3 "$OUT_DIR/$1.log"
}

T_TRITON=$((T_MGPU_BENCH / 2))
bench triton_cudnn "$T_TRITON" pallas,cudnn
if [ "$tests_rc" -eq 0 ] || [ "$tests_rc" -eq 1 ]; then
  bench mosaic $((T_MGPU_BENCH - T_TRITON)) pallas_mosaic
else
  echo "=== mgpu bench mosaic skipped: the tests timed out or crashed (rc=$tests_rc)"
fi

# One table: every row of the runs that wrote results (a run cut short keeps its partial rows).
$PY - "$OUT_DIR" <<'PYEOF'
import json, os, runpy, sys
out = sys.argv[1]
bench = runpy.run_path("experiments/bench_attention.py", run_name="bench_attention")
meta, rows = None, []
for run in ("triton_cudnn", "mosaic"):
  path = os.path.join(out, run, "results.json")
  if os.path.exists(path):
    with open(path) as f:
      result = json.load(f)
    meta = meta or dict(result["meta"], runs=[])
    meta["runs"].append(dict(run=run, partial=result.get("partial", False)))
    rows += result["rows"]
if meta is None:
  sys.exit("no bench results were written")
with open(os.path.join(out, "results.json"), "w") as f:
  json.dump(dict(meta=meta, rows=rows), f, indent=1)
bench["write_markdown"](os.path.join(out, "results.md"), meta, rows, [])
print(open(os.path.join(out, "results.md")).read())
PYEOF
echo "mgpu phase done after ${SECONDS}s"
