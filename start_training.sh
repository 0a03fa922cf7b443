#!/usr/bin/env bash
# The container's root process: a timed MLPerf run, like the reference's run_and_time.sh.
#
# Prints STARTING/ENDING TIMING RUN AT and the elapsed seconds, drops the page cache when
# asked and allowed (DROP_CACHES=1, set by the image, and a writable /proc/sys/vm/drop_caches,
# i.e. --privileged; never by default on a shared host) and logs `cache_clear` either way, runs train_model.sh (forwarding SIGTERM/SIGINT so the
# trainer checkpoints), then checks $LOGDIR/mlperf.log with `check-log`, and exits with the
# training's status.  With DATA_DIR unset and no arguments it announces and runs the built-in demo.
#
# Environment: everything train_model.sh reads (PRESET, DATA_DIR, EVAL_FILE, INIT_CHECKPOINT,
# BERT_CONFIG, OUTPUT_DIR [./output], LOGDIR [$OUTPUT_DIR], NUM_GPUS, NNODES, NODE_RANK,
# MASTER_ADDR, MASTER_PORT, SEED, PYTHON), plus
#   DROP_CACHES    1 = drop the page cache before the run (root and --privileged)
#                  [1 in the container image, 0 elsewhere]
#   CHECK_LOG      1 = run the log checker after training                    [1]
#   NUM_RUNS       runs in a row, each in $OUTPUT_DIR/run_N with its own seed, its log kept as
#                  $LOGDIR/result_N.txt (a submission has 10)                 [1]
#   TRAIN_MODEL    the training script                                       [./train_model.sh]
# Arguments are passed to train_model.sh (e.g. --preset=tpu_8192 --train_batch_size=512);
# --help prints this.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'; exit 0 ;;
  esac
done
case "${DROP_CACHES:-0}" in 0|1) ;; *) echo "error: start_training.sh: DROP_CACHES=$DROP_CACHES must be 0 or 1" >&2; exit 2 ;; esac

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHON
OUTPUT_DIR="$(realpath -m "${OUTPUT_DIR:-$PWD/output}")"
LOGDIR="$(realpath -m "${LOGDIR:-$OUTPUT_DIR}")"
export OUTPUT_DIR LOGDIR

if [[ -z "${DATA_DIR:-}" && -z "${INPUT_FILES:-}" ]]; then
  if (( $# )); then
    echo "error: start_training.sh: arguments ($*) but no DATA_DIR: set DATA_DIR (or INPUT_FILES) for a run; run without arguments for the demo" >&2
    exit 2
  fi
  echo "start_training.sh: DATA_DIR is not set: running the built-in demo (python -m mlperf_bert demo)"
  cd "$HERE" || exit 2
  exec "$PYTHON" -m mlperf_bert demo "--output_dir=$OUTPUT_DIR/demo"
fi

mkdir -p "$OUTPUT_DIR" "$LOGDIR" || exit 2

NUM_RUNS="${NUM_RUNS:-1}"
[[ "$NUM_RUNS" =~ ^[0-9]+$ ]] && (( NUM_RUNS >= 1 )) || { echo "error: start_training.sh: NUM_RUNS=$NUM_RUNS must be a whole number >= 1" >&2; exit 2; }
if (( NUM_RUNS > 1 )); then
  # A submission's runs, one after the other: run i in $OUTPUT_DIR/run_i with its own seed (SEED+i
  # when SEED is set, else the trainer's random one, kept in its checkpoints), its log copied to
  # $LOGDIR/result_i.txt once the run has finished. Rerunning skips finished runs and resumes the
  # one that stopped.
  self="${BASH_SOURCE[0]}"
  run_pid=
  trap '[[ -n "$run_pid" ]] && kill -TERM "$run_pid" 2>/dev/null' TERM INT
  for (( i = 0; i < NUM_RUNS; i++ )); do
    run_dir="$OUTPUT_DIR/run_$i"
    env NUM_RUNS=1 OUTPUT_DIR="$run_dir" LOGDIR="$run_dir" ${SEED:+SEED=$((SEED + i))} "$self" "$@" &
    run_pid=$!
    wait "$run_pid"; status=$?
    while kill -0 "$run_pid" 2>/dev/null; do wait "$run_pid"; status=$?; done
    run_pid=
    if [[ ! -f "$run_dir/run_finished.json" ]]; then
      echo "start_training.sh: run $i of $NUM_RUNS stopped (status $status); rerun the same command to go on"
      exit "$(( status == 0 ? 1 : status ))"
    fi
    cp "$run_dir/mlperf.log" "$LOGDIR/.result_$i.txt.tmp" && mv "$LOGDIR/.result_$i.txt.tmp" "$LOGDIR/result_$i.txt" || exit 2
    echo "start_training.sh: run $i of $NUM_RUNS done: $LOGDIR/result_$i.txt"
  done
  exit 0
fi
MLPERF_LOG="$LOGDIR/mlperf.log"

start=$(date +%s)
start_fmt=$(date +'%Y-%m-%d %r')
echo "STARTING TIMING RUN AT $start_fmt"

cleared=False
if [[ "${DROP_CACHES:-0}" == 1 ]]; then
  if sync && { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
    cleared=True
  else
    echo "start_training.sh: cannot drop the page cache (run the container with --privileged); logging cache_clear=False"
  fi
fi
# The trainer logs cache_clear (first line of its log) from this variable.
export MLPERF_CACHE_CLEARED=$cleared

"${TRAIN_MODEL:-$HERE/train_model.sh}" "$@" &
child=$!
# SIGINT goes on as SIGTERM: the trainer checkpoints only on SIGTERM (and a background job ignores SIGINT).
forward() { echo "start_training.sh: got SIG$1, sending SIGTERM to the trainer"; kill -TERM "$child" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
wait "$child"
status=$?
# `wait` returns early when a trapped signal arrives; wait for the trainer's own exit status.
while kill -0 "$child" 2>/dev/null; do
  wait "$child"
  status=$?
done
trap - TERM INT

end=$(date +%s)
end_fmt=$(date +'%Y-%m-%d %r')
echo "ENDING TIMING RUN AT $end_fmt"
result=$((end - start))
echo "RESULT,bert,${SEED:-},$result,${USER:-$(id -un 2>/dev/null)},$start_fmt"
echo "start_training.sh: training exited with status $status after $result s"

if [[ "${CHECK_LOG:-1}" == 1 ]]; then
  if [[ -f "$MLPERF_LOG" ]]; then
    (cd "$HERE" && "$PYTHON" -m mlperf_bert check-log "$MLPERF_LOG") || echo "start_training.sh: $MLPERF_LOG does not pass the log checker"
  else
    echo "start_training.sh: no $MLPERF_LOG to check"
  fi
fi
exit "$status"
