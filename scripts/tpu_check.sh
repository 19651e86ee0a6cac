#!/usr/bin/env bash
# TPU check (issue 52 item 1): generated modules on one TPU chip against peers and a float32
# reference: forward and forward+backward time, useful TF/s, % of the dense balanced ceiling,
# x faster than a MaxText-style megablox layer and jax.lax.ragged_dot, peak memory beside the
# plan's, and parity of y and of every gradient.
#
#   scripts/tpu_check.sh prepare [--tiny] [--kernels pallas,xla]   here: .tpu_check/ (.venv)
#   scripts/tpu_check.sh run [--budget-s N]   on the TPU machine: python3 with jax, no moegen
#
# Through the device tool: run(command="scripts/tpu_check.sh run", carry=[".tpu_check"]).
# On a CPU: scripts/tpu_check.sh prepare --tiny && JAX_PLATFORMS=cpu scripts/tpu_check.sh run
# Figures go to stdout and, when $OUT is set, to $OUT/tpu_check.txt and $OUT/tpu_check.json.
# $TPU_CHECK_WORK moves the work folder (default .tpu_check/).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; }

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  prepare)
    py=${MOEGEN_PYTHON_VENV:-.venv/bin/python}
    [ -x "$py" ] || make setup
    exec "$py" scripts/tpu_check_prepare.py "$@"
    ;;
  run)
    export PYTHONUNBUFFERED=1
    # Hard stop under 9 minutes ($TPU_CHECK_STOP_S moves it); the script itself skips what is
    # left past --budget-s (460 s), which must stay under it.
    stop=()
    command -v timeout >/dev/null 2>&1 && stop=(timeout -k 10 "${TPU_CHECK_STOP_S:-520}")
    exec "${stop[@]}" "${PYTHON:-python3}" scripts/tpu_check_run.py "$@"
    ;;
  *)
    usage
    exit 2
    ;;
esac
