# Sourced by scripts/gpu_session.sh and its gpu_phase_*.sh: the repo root as working directory,
# the results folder ($RESULTS, default bench_results/gpu), unbuffered Python importing tfjax from
# this checkout, Tiny Shakespeare from $TFJAX_DATA_DIR (default .gpu/data, the carried copy), and
# the interpreter $PY (default python3).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS=${RESULTS:-bench_results/gpu}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 TFJAX_DATA_DIR=${TFJAX_DATA_DIR:-$PWD/.gpu/data}
case ":${PYTHONPATH:-}:" in
  *":$PWD:"*) ;;  # already first (a phase script started by gpu_session.sh)
  *) export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ;;
esac
PY=${PY:-python3}
