#!/usr/bin/env bash
# nanoGPT's shakespeare-char recipe in PyTorch on the GPU, beside our own run of the same config
# (scripts/gpu_session.sh, phase recipe): best val loss (nanoGPT publishes 1.4697), val curve,
# wall-clock and per-step time, tokens/s, GPU name and torch version.
#
#   RESULTS=bench_results/gpu TFJAX_DATA_DIR=... bash scripts/gpu_phase_nanogpt.sh
#
# Runs from the repo root with python3 holding torch (CUDA) and tfjax's dependencies (tfjax
# only builds the character data, on the CPU: JAX_PLATFORMS=cpu keeps JAX off the GPU). Writes
# $RESULTS/nanogpt/torch_nanogpt_reference.{json,md} and logs to $RESULTS/nanogpt.log, under a
# T_NANOGPT-second limit (default 150). The training loop (torch.compile and the evaluations
# included) gets MAX_SECONDS of it (default T_NANOGPT - 40: imports, data, the final evaluation
# and the whole-split val loss take the rest); if 5000 steps do not fit, it stops there,
# evaluates, and the JSON says how far it got (steps_done, stopped_at_max_seconds).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
T_NANOGPT=${T_NANOGPT:-150}
MAX_SECONDS=${MAX_SECONDS:-$((T_NANOGPT - 40))}
SECONDS=0
echo "=== nanogpt (limit ${T_NANOGPT}s, training loop ${MAX_SECONDS}s)"
JAX_PLATFORMS=cpu timeout --signal=TERM --kill-after=10 "$T_NANOGPT" \
  $PY experiments/torch_nanogpt.py --config=configs/shakespeare_char.py --mode=reference \
  --device=cuda --max_seconds="$MAX_SECONDS" --out="$RESULTS/nanogpt" >"$RESULTS/nanogpt.log" 2>&1
rc=$?
printf "%s\t%s\t%s\n" nanogpt "$rc" "$SECONDS" >>"$RESULTS/phases.tsv"
echo "=== nanogpt rc=$rc after ${SECONDS}s"
tail -n 40 "$RESULTS/nanogpt.log"
exit $rc
