#!/bin/bash
# usage: examples/submit.sh [sbatch options] [-- trainer flags]
# Checks a multi-node job's settings and files here, before it waits for nodes (the job's own
# checks, SBATCH_CHECK_ONLY=1, with the paths as this host sees them), then submits
# examples/slurm_multinode.sbatch with sbatch, from the repository root. JOB_SCRIPT: another job
# script (examples/slurm_multinode_pyxis.sbatch: the image, with pyxis/enroot). GPUS_PER_NODE, when
# set, is also the job's --gpus-per-node (0: a CPU run, e.g. PRESET=demo_cpu). The settings are the
# job script's (its header; docs/running.md, "SLURM"), e.g.
#   SUBMISSION_ORG=ORG SUBMISSION_PLATFORM=NAME DATA_DIR=/data/tfrecords \
#     INIT_CHECKPOINT=/data/tf1_ckpt/model.ckpt-28252 examples/submit.sh --nodes=4 --time=8:00:00
#   PRESET=demo_cpu GPUS_PER_NODE=0 NUM_RUNS=1 DATA_DIR=demo_out/tfrecords examples/submit.sh \
#     --cpus-per-task=4 -- --max_samples_termination=4096
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JOB_SCRIPT="${JOB_SCRIPT:-$HERE/slurm_multinode.sbatch}"
die() { echo "error: submit.sh: $*" >&2; exit 2; }

opts=()
flags=()
while (( $# )); do
  if [[ "$1" == -- ]]; then
    shift
    flags=("$@")
    break
  fi
  opts+=("$1")
  shift
done
[[ -f "$JOB_SCRIPT" ]] || die "JOB_SCRIPT=$JOB_SCRIPT does not exist"
SBATCH_CHECK_ONLY=1 SBATCH_CHECK_FILES=1 ME="$(basename "$JOB_SCRIPT")" \
  bash "$JOB_SCRIPT" ${flags[@]+"${flags[@]}"} || exit 2
[[ -n "${GPUS_PER_NODE:-}" ]] && opts=("--gpus-per-node=$GPUS_PER_NODE" ${opts[@]+"${opts[@]}"})
command -v sbatch > /dev/null || die "no sbatch here: run this on a SLURM login node"
exec sbatch ${opts[@]+"${opts[@]}"} "$JOB_SCRIPT" ${flags[@]+"${flags[@]}"}
