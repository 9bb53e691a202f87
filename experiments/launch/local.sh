#!/usr/bin/env bash
# The RedditBias debiasing study on one machine: every bias type x LMD, ADD, HD (the paper's 54-point grid each) and
# CDA (the reference's single run), each selected on the valid split. One command: `rbjax sweep` runs every chunk
# of every (bias type, method) sweep on all of this machine's devices (one CPU, a GPU, several GPUs or a TPU host:
# the chunk's grid points are spread over a grid x data device mesh).
#
#   experiments/launch/local.sh                                   # the whole study into runs/study
#   OUT=runs/rel1 BIAS=religion1 METHODS=lmd experiments/launch/local.sh
#   experiments/launch/local.sh --precision bf16 --grid-chunk 6   # extra options go to `rbjax sweep`
#   BIAS=religion1 METHODS=lmd,cda experiments/launch/local.sh --max-steps 2 --dev-max-pairs 8 \
#       --lmp-max-lines 50 --out runs/smoke                       # a smoke run of the pipeline (minutes)
#
# Environment: OUT (result folder, default runs/study), BIAS (all, or a comma list), METHODS (default
# lmd,add,hd,cda), MODEL (default microsoft/DialoGPT-small; a local HF folder works), GRIDS (grid files, default
# experiments/grids), RBJAX (the command, default `rbjax`; e.g. "python -m rbjax.cli" from a checkout).
# A killed study resumes when the same command is run again: finished points are never redone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-runs/study}"
BIAS="${BIAS:-all}"
METHODS="${METHODS:-lmd,add,hd,cda}"
MODEL="${MODEL:-microsoft/DialoGPT-small}"
GRIDS="${GRIDS:-$HERE/../grids}"
read -r -a RBJAX_CMD <<< "${RBJAX:-rbjax}"

exec "${RBJAX_CMD[@]}" sweep --method "$METHODS" --bias "$BIAS" --model "$MODEL" --grid-config "$GRIDS" \
    --out "$OUT" "$@"
