#!/usr/bin/env bash
# The study on several hosts as ONE JAX program: a TPU slice (v4-32, v5e-16 ...), or several multi-GPU nodes.
# Every host runs this same script; `rbjax sweep --distributed` calls jax.distributed.initialize(), after which the
# device mesh spans all hosts' devices: each chunk's grid points are split over them (grid axis), batches over the
# data axis. Process 0 appends the records; OUT must be the SAME shared folder on every host (NFS, Filestore,
# gcsfuse), and the model, tokenizer and data paths must exist on every host.
#
# How the hosts find each other (jax.distributed.initialize):
#   * Cloud TPU VM slices, Slurm (srun) and Open MPI (mpirun): automatic, nothing to set.
#       gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all \
#           --command="cd rbjax && OUT=/mnt/shared/study experiments/launch/multihost.sh"
#       srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 experiments/launch/multihost.sh
#   * Anywhere else, set on every host (the coordinator is process 0's address and any free port):
#       JAX_COORDINATOR_ADDRESS=10.0.0.1:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0 experiments/launch/multihost.sh
#       JAX_COORDINATOR_ADDRESS=10.0.0.1:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1 experiments/launch/multihost.sh
#     and optionally JAX_LOCAL_DEVICE_IDS=0,1,... (the GPUs this process drives; default: all of the host's).
#
# Environment as local.sh: OUT, BIAS, METHODS, MODEL, GRIDS, RBJAX. Extra arguments go to `rbjax sweep`.
# With one process per GPU (Slurm/Open MPI on GPUs give one device per process) the mesh is the same.
# Alternatives: one machine -> local.sh; independent machines, each taking whole chunks -> ray_cluster.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:?set OUT to a folder every host shares}"
BIAS="${BIAS:-all}"
METHODS="${METHODS:-lmd,add,hd,cda}"
MODEL="${MODEL:-microsoft/DialoGPT-small}"
GRIDS="${GRIDS:-$HERE/../grids}"
read -r -a RBJAX_CMD <<< "${RBJAX:-rbjax}"

exec "${RBJAX_CMD[@]}" sweep --distributed --method "$METHODS" --bias "$BIAS" --model "$MODEL" \
    --grid-config "$GRIDS" --out "$OUT" --no-progress "$@"
