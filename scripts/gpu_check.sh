#!/usr/bin/env bash
# GPU check of the `xla` kernel (issue 6 item 5) and of kernel `tokamax` (issue 20 item 3):
# twin parity on the GPU, and forward+backward timing of a Mixtral 8x7B layer (both kernels)
# and two plain-JAX baselines against the measured matmul peak.
#
#   scripts/gpu_check.sh prepare        here: render 1-device modules into .gpu_check/ (.venv)
#   scripts/gpu_check.sh run [--quick]  on the GPU machine: plain python3 with jax (0.11.2)
#
# Through the device tool: run(command="scripts/gpu_check.sh run", carry=[".gpu_check"]).
# `run --quick` shrinks the timing shapes and allows CPU: JAX_PLATFORMS=cpu scripts/gpu_check.sh run --quick
# Figures go to stdout and, when $OUT is set, to $OUT/gpu_check.txt and $OUT/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; }

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  prepare)
    py=${MOEGEN_PYTHON_VENV:-.venv/bin/python}
    [ -x "$py" ] || make setup
    exec "$py" scripts/gpu_check.py prepare "$@"
    ;;
  run)
    export PYTHONUNBUFFERED=1
    # Leave the GPU's memory to JAX's own allocator, but not all of it (baselines need room).
    export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
    if command -v nvidia-smi >/dev/null 2>&1; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    fi
    # tokamax and what it imports that the machine lacks travel as wheels (prepare): offline.
    wheels=${GPU_CHECK_WORK:-.gpu_check}/wheels
    if compgen -G "$wheels/*.whl" >/dev/null; then
      site=$(mktemp -d)
      "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "$wheels"/*.whl
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # Hard stop under 8 minutes; the script itself skips timings past --budget-s (400 s).
    stop=()
    command -v timeout >/dev/null 2>&1 && stop=(timeout -k 10 470)
    exec "${stop[@]}" "${PYTHON:-python3}" scripts/gpu_check.py run "$@"
    ;;
  *)
    usage
    exit 2
    ;;
esac
