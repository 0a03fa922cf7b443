#!/usr/bin/env bash
# Training entry point: a preset (configs/presets/NAME.sh) plus overrides -> run_pretraining.py
# (one process: run directly; several: under torchrun, its errors shown as the trainer's own line).
#
# usage: train_model.sh [--preset=NAME] [--dry_run] [--trainer_flag=value ...]
# Trainer flags given here replace the preset's flag of the same name.
# Environment (defaults in brackets):
#   PRESET          reference_gpu | tpu_8192 | demo_cpu | rcp_<global batch>     [reference_gpu]
#   MAX_PER_GPU_BATCH  rcp_*: largest per-GPU micro-batch; sets the accumulation   [48]
#   DATA_DIR        directory of the training TFRecords (part-*)                 [required]
#   INPUT_FILES     training files, comma list/glob                              [$DATA_DIR/part-*]
#   EVAL_FILE       online eval set                                              [$DATA_DIR/eval_10k]
#   INIT_CHECKPOINT TF checkpoint prefix or .pt to start from                    [none]
#   BERT_CONFIG     bert_config.json                                             [the preset's]
#   OUTPUT_DIR      checkpoints                                                  [./output]
#   LOGDIR          where mlperf.log goes                                        [$OUTPUT_DIR]
#   NUM_GPUS        processes per node                                           [the preset's]
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous           [1, 0, 127.0.0.1, 29500]
#   SEED            --seed for the trainer                                       [trainer default]
#   SUBMISSION_ORG, SUBMISSION_PLATFORM  MLPerf log fields                       [trainer defaults]
#   PYTHON          interpreter                                                  [.venv/bin/python, else python3]
#   DRY_RUN=1       print the command instead of running it (same as --dry_run)
#   --help          print this and exit
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "error: train_model.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'; }
int_env() {  # NAME MIN: the variable must be a whole number >= MIN
  local v="${!1}"
  [[ "$v" =~ ^[0-9]+$ ]] && (( v >= $2 )) || die "$1=$v is not a whole number >= $2: fix the environment setting"
}

PRESET="${PRESET:-reference_gpu}"
DRY_RUN="${DRY_RUN:-0}"
overrides=()
for arg in "$@"; do
  case "$arg" in
    --preset=*) PRESET="${arg#--preset=}" ;;
    --dry_run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    --*) overrides+=("$arg") ;;
    *) die "unexpected argument '$arg': pass trainer flags as --name=value" ;;
  esac
done

preset_file="$HERE/configs/presets/$PRESET.sh"
[[ "$PRESET" =~ ^rcp_[0-9]+$ ]] && preset_file="$HERE/configs/presets/rcp.sh"
[[ -f "$preset_file" ]] || die "unknown preset '$PRESET': choose one of $(cd "$HERE/configs/presets" && ls -- *.sh | sed 's/\.sh$//' | grep -vx rcp | tr '\n' ' ')or rcp_<global batch> (a reference convergence point)"
PRESET_FLAGS=()
PRESET_NUM_GPUS=1
PRESET_BERT_CONFIG=""
# shellcheck source=/dev/null
source "$preset_file"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
[[ -n "${DATA_DIR:-}" || -n "${INPUT_FILES:-}" ]] || die "set DATA_DIR (directory of part-* TFRecords) or INPUT_FILES"
INPUT_FILES="${INPUT_FILES:-$DATA_DIR/part-*}"
[[ -n "${EVAL_FILE:-}" || -n "${DATA_DIR:-}" ]] || die "set EVAL_FILE (the eval_10k TFRecord) when DATA_DIR is not set"
EVAL_FILE="${EVAL_FILE:-$DATA_DIR/eval_10k}"
BERT_CONFIG="${BERT_CONFIG:-$HERE/$PRESET_BERT_CONFIG}"
OUTPUT_DIR="${OUTPUT_DIR:-$PWD/output}"
LOGDIR="${LOGDIR:-$OUTPUT_DIR}"
NUM_GPUS="${NUM_GPUS:-$PRESET_NUM_GPUS}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_PORT="${MASTER_PORT:-29500}"
int_env NUM_GPUS 1
int_env NNODES 1
int_env NODE_RANK 0
int_env MASTER_PORT 1
(( NODE_RANK < NNODES )) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
if [[ "$PRESET" =~ ^rcp_([0-9]+)$ ]]; then
  # generated from mlperf_logging's rcps_bert.json for this number of GPUs (harness/rcp.py)
  rcp_batch="${BASH_REMATCH[1]}"
  MAX_PER_GPU_BATCH="${MAX_PER_GPU_BATCH:-48}"
  int_env MAX_PER_GPU_BATCH 1
  rcp="$(cd "$HERE" && "$PYTHON" -m mlperf_bert.harness.rcp "--batch_size=$rcp_batch" \
        "--world=$((NUM_GPUS * NNODES))" "--max_per_gpu=$MAX_PER_GPU_BATCH")" || exit 2
  eval "$rcp"
fi

# flag name of --name=value / --name / --noname, to let an override replace the preset's flag
flag_name() { local f="${1#--}"; f="${f%%=*}"; echo "$f"; }
overridden() {
  local name o on
  name="$(flag_name "$1")"
  for o in "${overrides[@]+"${overrides[@]}"}"; do
    on="$(flag_name "$o")"
    [[ "$on" == "$name" || "$on" == "no$name" || "no$on" == "$name" ]] && return 0
  done
  return 1
}

flags=(
  "--bert_config_file=$BERT_CONFIG"
  "--input_file=$INPUT_FILES"
  "--eval_input_file=$EVAL_FILE"
  "--output_dir=$OUTPUT_DIR"
  "--mlperf_log=$LOGDIR/mlperf.log"
  --do_train
  --do_eval
)
[[ -n "${INIT_CHECKPOINT:-}" ]] && flags+=("--init_checkpoint=$INIT_CHECKPOINT")
[[ -n "${SEED:-}" ]] && flags+=("--seed=$SEED")
[[ -n "${SUBMISSION_ORG:-}" ]] && flags+=("--submission_org=$SUBMISSION_ORG")
[[ -n "${SUBMISSION_PLATFORM:-}" ]] && flags+=("--submission_platform=$SUBMISSION_PLATFORM")
kept=()
for f in "${flags[@]}" "${PRESET_FLAGS[@]}"; do
  overridden "$f" || kept+=("$f")
done

if (( NUM_GPUS * NNODES == 1 )); then
  # one process: no launcher between the user and the trainer's own error line and exit status
  cmd=("$PYTHON" "$HERE/run_pretraining.py" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}")
else
  if [[ -x "$(dirname "$PYTHON")/torchrun" ]]; then launcher=("$(dirname "$PYTHON")/torchrun")
  else launcher=("$PYTHON" -m torch.distributed.run); fi
  if [[ "$NNODES" == 1 ]]; then
    launcher+=(--standalone --nnodes=1 "--nproc_per_node=$NUM_GPUS")
  else
    launcher+=("--nnodes=$NNODES" "--node_rank=$NODE_RANK" "--nproc_per_node=$NUM_GPUS"
               "--master_addr=${MASTER_ADDR:-127.0.0.1}" "--master_port=$MASTER_PORT")
  fi
  cmd=("${launcher[@]}" "$HERE/run_pretraining.py" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}")
fi

if [[ "$DRY_RUN" == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
mkdir -p "$OUTPUT_DIR" "$LOGDIR"
echo "train_model.sh: preset $PRESET: ${cmd[*]}"
if (( NUM_GPUS * NNODES == 1 )); then
  exec "${cmd[@]}"
fi
# torchrun: its stderr goes through launch_filter (the ranks' lines once, not torchrun's
# traceback), SIGTERM/SIGINT go on to it (it passes SIGTERM to every rank, which checkpoints),
# and the exit status is the first failed rank's.
exit_file="$(mktemp)"
fifo="$exit_file.stderr"
mkfifo "$fifo"
trap 'rm -f "$exit_file" "$fifo"' EXIT
(cd "$HERE" && exec "$PYTHON" -m mlperf_bert.harness.launch_filter "$exit_file" <"$fifo" >&2) &
filter=$!
"${cmd[@]}" 2>"$fifo" &
child=$!
got_term=0
set +e  # the statuses below are read, not fatal
trap 'got_term=1; kill -TERM "$child" 2>/dev/null' TERM INT
wait "$child"
status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
wait "$filter"
if [[ -s "$exit_file" ]]; then status="$(cat "$exit_file")"; fi
if (( got_term )) && (( status != 0 )); then status=143; fi
exit "$status"
