#!/usr/bin/env bash
# The study on a Ray cluster: every (bias type, method, batch-plan chunk) is one Ray task, one accelerator per task
# (GPUs when the cluster has them), run where Ray places it. Run this on the head node (or anywhere with
# RAY_ADDRESS pointing at the cluster). A worker that dies mid-task is retried by Ray and the chunk resumes from its
# last checkpoint; a finished point is never redone, so rerunning the same command after any failure is safe.
#
#   ray up experiments/launch/ray_cluster.yaml          # start the cluster (or `ray start --head` / `ray start
#                                                        #  --address=HEAD:6379` on each machine by hand)
#   ray attach experiments/launch/ray_cluster.yaml      # a shell on the head node, then:
#   OUT=/mnt/shared/study experiments/launch/ray_cluster.sh
#
# OUT must be a path every node can read and write (checkpoints and records go there), and every node needs rbjax
# with the `ray` extra, the same model, tokenizer and data paths (or a hub id and network access).
# Environment as local.sh (OUT, BIAS, METHODS, MODEL, GRIDS, RBJAX), plus RAY_ADDRESS (default: auto, the cluster
# this node belongs to). Extra arguments go to `rbjax sweep` (e.g. --jobs 8, --grid-chunk 6).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:?set OUT to a folder every Ray node shares}"
BIAS="${BIAS:-all}"
METHODS="${METHODS:-lmd,add,hd,cda}"
MODEL="${MODEL:-microsoft/DialoGPT-small}"
GRIDS="${GRIDS:-$HERE/../grids}"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
read -r -a RBJAX_CMD <<< "${RBJAX:-rbjax}"

exec "${RBJAX_CMD[@]}" sweep --executor ray --method "$METHODS" --bias "$BIAS" --model "$MODEL" \
    --grid-config "$GRIDS" --out "$OUT" "$@"
