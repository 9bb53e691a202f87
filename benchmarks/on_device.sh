#!/usr/bin/env bash
# The prepared GPU run (benchmarks/on_device.py): installs the jax CUDA wheel matching the installed jax into the
# existing venv, then runs fp32 parity against transformers (DialoGPT-small and ~1B Llama shapes, random weights),
# LMB scoring, one HD debias update and one LoRA update against PyTorch CUDA, interleaved; writes one JSON.
# At most 8 minutes (the python run is stopped at 450 s).
#
#   bash benchmarks/on_device.sh [--wheels DIR] [--dry-run] [--out FILE] [on_device.py options]
#
# --wheels DIR: install the CUDA wheels from DIR (pip --no-index --find-links), for a machine without a package index.
# --dry-run: no install; tiny shapes on the CPU (what tests/test_on_device.py runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
WHEELS=""
DRY=0
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --dry-run) DRY=1; ARGS+=("$1"); shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
JAX_VERSION="$("$PY" -c 'import jax; print(jax.__version__)')"
if [ -n "$WHEELS" ]; then
  INSTALL=("$PY" -m pip install -q --no-index --find-links "$WHEELS" "jax[cuda12]==$JAX_VERSION")
else
  INSTALL=("$PY" -m pip install -q "jax[cuda12]==$JAX_VERSION")
fi
if [ "$DRY" = 1 ]; then
  echo "on_device.sh: dry run: would install with: ${INSTALL[*]}" >&2
elif ! "$PY" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; then
  echo "on_device.sh: installing the CUDA wheel of jax $JAX_VERSION" >&2
  "${INSTALL[@]}"
fi
exec timeout 450 "$PY" benchmarks/on_device.py "${ARGS[@]}"
