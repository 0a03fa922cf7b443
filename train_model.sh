#!/usr/bin/env bash
# Training entry point: a preset (configs/presets/NAME.sh) plus overrides -> run_pretraining.py
# (one process: run directly; several: `python -m mlperf_bert torchrun`, which shows a failure as
# the trainer's own line and answers SIGTERM with a checkpoint, one line and exit 143).
#
# usage: train_model.sh [--preset=NAME] [--dry_run] [--trainer_flag=value ...]
# Trainer flags given here replace the preset's flag of the same name, and so do those a --config
# file sets (one file; not --output_dir, --mlperf_log: OUTPUT_DIR, LOGDIR); a setting of the
# environment below (SEED, SUBMISSION_ORG, INIT_CHECKPOINT, ...) beats the file, a flag given beats
# it: preset < --config file < environment < command line. Before it runs it says
# what the run asks of each GPU, its flags and file read as the trainer reads them (sequences per GPU
# per micro-step = --train_batch_size / GPUs; global batch = that x GPUs x --steps_per_update) and
# warns above MAX_PER_GPU_BATCH sequences per GPU, naming the --steps_per_update that fits (the
# memory plan: mlperf_bert/trainer/memory_plan.py).
# Environment (defaults in brackets):
#   PRESET          reference_gpu | tpu_8192 | demo_cpu | rcp_<global batch>     [reference_gpu]
#   MAX_PER_GPU_BATCH  largest per-GPU micro-batch: rcp_* choose their accumulation
#                   by it; above it any preset is warned about (left unset: at seq 512 or more
#                   on GPUs) [the memory plan's: BERT-Large seq 512 bf16 on an 80 GB GPU with a
#                   margin, mlperf_bert/trainer/memory_plan.py]
#   PYTORCH_CUDA_ALLOC_CONF  torch's caching allocator settings        [expandable_segments:True,
#                   unless it or PYTORCH_ALLOC_CONF is set]
#   OMP_NUM_THREADS CPU threads of each process           [demo_cpu: 1; others: torch's, one a core]
#   DATA_DIR        directory of the training TFRecords (part-*), without * ? [ ] , [required; --dry_run
#                   without it shows the placeholder /DATA_DIR-not-set]
#   INPUT_FILES     training files, comma list/glob                              [$DATA_DIR/part-*]
#   EVAL_FILE       online eval set                                              [$DATA_DIR/eval_10k]
#   INIT_CHECKPOINT TF checkpoint prefix or .pt to start from; closed-division   [none; required
#                   presets need the phase-1 model.ckpt-28252 (a run without it is refused) when closed]
#   BERT_CONFIG     bert_config.json                                             [the preset's]
#   OUTPUT_DIR      checkpoints                                                  [./output]
#   LOGDIR          where mlperf.log goes                                        [$OUTPUT_DIR]
#   NUM_GPUS        processes per node: at most the GPUs present (without one,   [the preset's]
#                   or with --device=cpu, the CPU cores)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous           [1, 0, 127.0.0.1, 29500]
#   RDZV_TIMEOUT    seconds each node waits at that rendezvous for the others    [torchrun's: 900]
#                   (it says so when it starts waiting; when they do not come, one line naming
#                   what to check and exit 78: the nodes never met, not 75, a lost peer)
#   SEED            --seed for the trainer                                       [trainer default]
#   SUBMISSION_ORG, SUBMISSION_PLATFORM, SUBMISSION_STATUS  MLPerf log fields    [trainer defaults;
#                   a closed run without SUBMISSION_ORG or SUBMISSION_PLATFORM is refused]
#   PYTHON          interpreter                                                  [.venv/bin/python, else python3]
#   DRY_RUN=1       print the command instead of running it (same as --dry_run; a batch the ranks
#                   cannot split, or a flag the trainer cannot read, is refused as a run refuses it)
#   CHECK_ONLY=1    check the settings as a run does (an error line, status 2; NUM_GPUS against
#                   the host included, not the micro-batch against its memory nor --num_workers
#                   against its cores: the training host's, as a line says) and run nothing;
#                   CHECK_ONLY=files: also those, and that the data files, INIT_CHECKPOINT and BERT_CONFIG exist
#                   (start_training.sh's check before its first run, on the host that trains);
#                   CHECK_ONLY=reads: the paths the run reads, for start_training.sh's mount check
#   --help          print this and the presets, and exit; --helpfull (--helpshort): the trainer's flags
# NVIDIA's config_*.sh variables (BATCHSIZE, LR, MAX_STEPS, GRADIENT_STEPS, DGXNGPU, DATADIR, ...) are
# refused, each in one line naming what to use here.
set -euo pipefail
# A reader of this script's output that has gone (`... | tee log` and Ctrl-C, `| head`) ends neither it (141
# at its next line: the run never started) nor, under set -e, a failed echo: what start_training.sh does
trap : PIPE
echo() { builtin echo "$@" 2>/dev/null || :; }
# A stop (SIGTERM, SIGINT) while this script reads its settings, before the trainer starts (a second or
# less): nothing of this start is saved, so exit 79, as the trainer's own start says, not bash's death by
# the signal, 143 (130), which says a checkpoint holds the run (a script resubmits on it). Once: a SIGTERM
# after the SIGINT (start_training.sh sends both) adds nothing. exec gives the trainer the default back.
# A check (CHECK_ONLY), --dry_run and --help start no trainer: the signal ends them as it would any
# command (start_training.sh's check before its first run: its own line says the stop).
# Where OUTPUT_DIR holds a checkpoint (a resumed run), 128 + the signal instead, as the trainer's start
# and start_training.sh say: a script that resubmits on 143 stopped resubmitting a run stopped here.
# On a node other than 0 without one, still 79, with a line saying node 0's status tells (a Slurm job takes it).
stopped_early() {
  trap '' TERM INT
  local f
  for f in "${OUTPUT_DIR:-$PWD/output}"/model.ckpt-*.pt; do
    [[ "$f" =~ /model\.ckpt-[0-9]+\.pt$ && -f "$f" ]] || continue  # (start_signals.CKPT_RE's names: no Python in a trap)
    echo "train_model.sh: $1 before the trainer started: nothing trained; rerun the same command to resume" >&2
    [[ $1 == SIGINT ]] && exit 130
    exit 143
  done
  # Node 1 and up: rank 0 alone writes the checkpoints, and this node's OUTPUT_DIR (a disk of its own) may hold
  # none where node 0's holds the run: "no checkpoint written" was false there (start_signals.stopped_at_start's line)
  if [[ "${NNODES:-1}" =~ ^[0-9]{1,6}$ && "${NODE_RANK:-0}" =~ ^[0-9]{1,6}$ ]] && (( 10#${NNODES:-1} > 1 && 10#${NODE_RANK:-0} > 0 )); then
    echo "train_model.sh: $1 before the trainer started: stopped at once, nothing trained; this node's OUTPUT_DIR" \
         "holds no checkpoint (rank 0 on node 0 writes them): node 0's status says whether one holds the run (exit 79" \
         "here); rerun the same command on every node" >&2
    exit 79
  fi
  echo "train_model.sh: $1 before the trainer started: no checkpoint written (exit 79, not 143); rerun the same" \
       "command: it resumes from the newest checkpoint if there is one, else starts again" >&2
  exit 79
}
# While the trap is set, one `$(...)` a simple command (a line): bash 5.2 running a
# trap as it reads a statement's second (or a nested) one misreads it ("trap: unexpected EOF while
# looking for matching `)'", exit 2, the stop said as a failure; a review's signal storm, 5 of 800).
stop_trap=1
[[ "${CHECK_ONLY:-0}" == 0 && "${DRY_RUN:-0}" == 0 ]] || stop_trap=0
for arg in "$@"; do case "$arg" in --dry_run|-h|--help|--helpfull|--helpshort) stop_trap=0 ;; esac; done
if (( stop_trap )); then
  trap 'stopped_early SIGTERM' TERM
  trap 'stopped_early SIGINT' INT
fi
# this script's folder (the checkout's, started through a link too), by builtins
SELF=${BASH_SOURCE[0]}
[[ -L "$SELF" ]] && SELF="$(readlink -f -- "$SELF")"
HERE=$PWD
case "$SELF" in
  # -P: the folder the kernel found the script in (`../train_model.sh` from inside a linked folder: the link's
  # parent was taken, the wrong checkout); back to the caller's folder as it named it
  */*) CDPATH='' cd -P -- "${SELF%/*}" && HERE=$PWD || exit 2
       CDPATH='' cd -- "$OLDPWD" 2>/dev/null || { echo "error: train_model.sh: cannot return to the current folder $OLDPWD" \
         "(removed since?): run it from a folder that exists" >&2; exit 2; } ;;
esac

# one line: a value's newline (NUM_GPUS=$'8\n', a path) written \n, not a second line of the error
die() { local line="error: train_model.sh: $*"; line=${line//$'\r'/\\r}; echo "${line//$'\n'/\\n}" >&2; exit 2; }
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
# a relative PYTHON (venv/bin/python) names the caller's file: made absolute, so the steps run from the
# checkout (cd "$HERE") find it too (they ended "No such file or directory", blamed on PYTHON)
if [[ "$PYTHON" == */* && "$PYTHON" != /* ]]; then PYTHON="$PWD/$PYTHON"; fi
# the package importable with any PYTHON, without changing the directory relative paths are in
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
# MAX_PER_GPU_BATCH's one definition: mlperf_bert/trainer/memory_plan.py (no torch import); --help shows it.
# -S: without site (the standard library and PYTHONPATH are all it needs), a third of Python's start.
plan_max() { "$PYTHON" -S -c 'from mlperf_bert.trainer.memory_plan import MAX_PER_GPU_BATCH; print(MAX_PER_GPU_BATCH)'; }
max_given=1  # the memory plan's is seq 512's on a GPU: warned by where it is not given
if [[ -z "${MAX_PER_GPU_BATCH:-}" ]]; then
  max_given=0
  MAX_PER_GPU_BATCH="$(plan_max 2>/dev/null)" || die "cannot read MAX_PER_GPU_BATCH from mlperf_bert/trainer/memory_plan.py with PYTHON=$PYTHON: set PYTHON to the project's interpreter, or set MAX_PER_GPU_BATCH"
fi
# The caching allocator maps memory into growing segments instead of fixed blocks: less
# fragmentation near the memory plan's batch (its margin, memory_plan.py). A setting of the
# user's (either name; torch reads PYTORCH_ALLOC_CONF first) is left as it is.
if [[ -z "${PYTORCH_CUDA_ALLOC_CONF+x}${PYTORCH_ALLOC_CONF+x}" ]]; then
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  alloc_conf_set=1
fi
rcp_presets() {  # the rcp_<B> of every reference convergence point installed (mlperf_logging)
  "$PYTHON" -c 'from mlperf_bert.harness.rcp import load_rcps; print(" ".join("rcp_%d" % b for b in sorted(load_rcps())))' \
    2>/dev/null || echo "rcp_<B> (cannot list them: $PYTHON -c 'import mlperf_logging' fails)"
}
preset_line() {  # NAME GPUS PER_GPU ACCUM: one line of --help's preset table
  local unit=GPU
  [[ "$1" == demo_cpu ]] && unit="CPU process"
  if [[ "$3" == - ]]; then
    printf '  %-14s %3s %s(s): its global batch cannot be split over them\n' "$1" "$2" "$unit"
  else
    printf '  %-14s %3s %s(s) x %5s per %s per micro-step x %3s micro-step(s) = global batch %s\n' \
      "$1" "$2" "$unit" "$3" "$unit" "$4" "$(($2 * $3 * $4))"
  fi
}
usage() {
  sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'
  local nodes=1 max="$MAX_PER_GPU_BATCH"
  [[ "${NNODES:-}" =~ ^[1-9][0-9]{0,5}$ ]] && nodes="$NNODES"
  [[ "$max" =~ ^[1-9][0-9]{0,5}$ ]] || max="$(plan_max 2>/dev/null)" || max="?"  # (the run refuses it; the plan's)
  local table
  table="$(preset_table "$nodes" "$max")"
  echo "presets: $(awk '{printf "%s ", $1}' <<< "$table")"
  echo "What each asks of each GPU (NUM_GPUS x NNODES GPUs, NUM_GPUS the preset's unless set; rcp_* split"
  echo "by MAX_PER_GPU_BATCH=$max):"
  echo "$table"
}
preset_table() {  # NODES MAX_PER_GPU: preset_line of every preset
  local nodes="$1" max="$2" gpus f name
  for f in "$HERE"/configs/presets/*.sh; do
    name="$(basename "$f" .sh)"
    [[ "$name" == rcp ]] && continue
    (
      PRESET_FLAGS=() PRESET_NUM_GPUS=1
      # shellcheck source=/dev/null
      source "$f"
      micro=32 accum=1
      for a in "${PRESET_FLAGS[@]}"; do
        case "$a" in --train_batch_size=*) micro="${a#*=}" ;; --steps_per_update=*) accum="${a#*=}" ;; esac
      done
      # NUM_GPUS checked before bash's arithmetic reads it: there a name or $(...) would be evaluated
      gpus=$((PRESET_NUM_GPUS * nodes))
      [[ "${NUM_GPUS:-}" =~ ^[1-9][0-9]{0,5}$ ]] && gpus=$((NUM_GPUS * nodes))
      if (( micro % gpus )); then preset_line "$name" "$gpus" - -; else preset_line "$name" "$gpus" $((micro / gpus)) "$accum"; fi
    )
  done
  gpus=$((8 * nodes))  # rcp.sh's PRESET_NUM_GPUS
  [[ "${NUM_GPUS:-}" =~ ^[1-9][0-9]{0,5}$ ]] && gpus=$((NUM_GPUS * nodes))
  local listed
  if listed="$(cd "$HERE" && "$PYTHON" -m mlperf_bert.harness.rcp --list "--world=$gpus" "--max_per_gpu=$max" 2>/dev/null)"; then
    while read -r name per accum; do preset_line "$name" "$gpus" "$per" "$accum"; done <<< "$listed"
  else
    echo "  $(rcp_presets)"
  fi
}
int_env() {  # NAME MIN: the variable must be a whole number >= MIN; set to it in decimal (08 is 8)
  local v="${!1}" n
  [[ "$v" =~ ^[0-9]+$ ]] || die "$1=$v is not a whole number >= $2: fix the environment setting"
  [[ "${v#"${v%%[!0]*}"}" =~ ^[0-9]{0,9}$ ]] || die "$1=$v is too large: fix the environment setting"
  n=$((10#$v))  # bash reads a leading 0 as octal
  (( n >= $2 )) || die "$1=$v is not a whole number >= $2: fix the environment setting"
  printf -v "$1" '%d' "$n"
}

PRESET="${PRESET:-reference_gpu}"
DRY_RUN="${DRY_RUN:-0}"
case "$DRY_RUN" in 0|1) ;; *) die "DRY_RUN=$DRY_RUN must be 0 or 1 (1: print the trainer's command, run nothing)" ;; esac
case "${CHECK_ONLY:-0}" in 0|1|files|reads) ;; *) die "CHECK_ONLY=$CHECK_ONLY must be 0, 1 or files (1: check the settings, run nothing; files: also that the data files and INIT_CHECKPOINT exist)" ;; esac
overrides=()
for arg in "$@"; do
  case "$arg" in
    --preset=*) PRESET="${arg#--preset=}" ;;
    --dry_run) DRY_RUN=1 ;;
    --dry_run=*|--nodry_run) die "$arg: give --dry_run alone (or DRY_RUN=1) to print the trainer's command" ;;
    # absl takes what follows a bare -- as arguments, not flags (refused by the trainer, after its start)
    --) die "'--': give the trainer's flags without it (--name=value; after '--' they are arguments, which the trainer refuses)" ;;
    -h|--help) usage; exit 0 ;;
    # the trainer's flags, as the trainer lists them (passed on, its help came after the batch line and
    # the command, and only with DATA_DIR set; start_training.sh started a series of it)
    --helpfull|--helpshort) exec "$PYTHON" "$HERE/run_pretraining.py" "$arg" ;;
    # absl reads a flag file where it stands: its flags would pass the checks below unseen
    --flagfile|--flagfile=*) die "$arg: give the file's flags as arguments instead (the trainer reads a flag file" \
      "past this script's checks of the closed division and the preset)" ;;
    # the log goes to LOGDIR (OUTPUT_DIR unless set): a run's own --output_dir would leave it behind
    --output_dir|--output_dir=*) die "$arg: set OUTPUT_DIR instead (the run's checkpoints and state; its log goes to" \
      "LOGDIR/mlperf.log, LOGDIR being OUTPUT_DIR unless set)" ;;
    --mlperf_log|--mlperf_log=*) die "$arg: set LOGDIR instead (the run's log is LOGDIR/mlperf.log)" ;;
    --*) overrides+=("$arg") ;;
    *) die "unexpected argument '$arg': pass trainer flags as --name=value" ;;
  esac
done
# NVIDIA's run_and_time.sh and config_*.sh variables, which this script does not read: set (a config_*.sh
# sourced), each was ignored and the preset's numbers trained, exit 0. NAME what-to-use-instead, one a line.
nvidia_env="BATCHSIZE --train_batch_size=BATCHSIZE x GPUs x nodes (the global batch of a micro-step, not a GPU's)
GRADIENT_STEPS --steps_per_update
LR --learning_rate
MAX_STEPS --num_train_steps=MAX_STEPS x --steps_per_update (micro-steps, not updates)
MAX_SAMPLES_TERMINATION --max_samples_termination
OPT_LAMB_BETA_1 --lamb_beta_1
OPT_LAMB_BETA_2 --lamb_beta_2
WEIGHT_DECAY_RATE --lamb_weight_decay_rate
WARMUP_PROPORTION --num_warmup_steps=WARMUP_PROPORTION x --num_train_steps
WARMUP_STEPS --num_warmup_steps (micro-steps)
START_WARMUP_STEP --start_warmup_step (micro-steps)
TARGET_MLM_ACCURACY --target_mlm_accuracy
EVAL_ITER_START_SAMPLES --eval_frequency (samples between evals; 0: the MLPerf formula) and --eval_at_start
EVAL_ITER_SAMPLES --eval_frequency (samples between evals; 0: the MLPerf formula)
NUM_EVAL_EXAMPLES EVAL_FILE (the eval set is all of its records)
INIT_LOSS_SCALE --dtype=bf16 (no fp16, no loss scale)
EXTRA_PARAMS this project's flags as arguments (train_model.sh --helpfull lists them)
DGXNGPU NUM_GPUS
DGXNNODES NNODES
NEXP NUM_RUNS (start_training.sh)
DATADIR DATA_DIR
DATADIR_PHASE2 DATA_DIR
EVALDIR EVAL_FILE
CHECKPOINTDIR_PHASE1 INIT_CHECKPOINT
PACKING_FACTOR INPUT_FILES (the files python -m mlperf_bert pack made; docs/dataset.md)
MLPERF_SUBMISSION_ORG SUBMISSION_ORG
MLPERF_SUBMISSION_PLATFORM SUBMISSION_PLATFORM"
while read -r name instead; do
  [[ -z "${!name:-}" ]] || die "$name=${!name} is NVIDIA's variable, which this script does not read: use $instead," \
    "then unset $name"
done <<< "$nvidia_env"
# A --config file's values come before the command line's flags (the trainer's order), so a preset
# flag would beat the file: what the file sets replaces the preset's flags, as an argument does, and
# counts in the checks below (file_sets: its flags as the command line gives them). One file: the
# trainer reads the last --config only, and a first file's values replaced the preset's flags unread.
file_sets=()
config=""
for arg in "${overrides[@]+"${overrides[@]}"}"; do
  [[ "$arg" == --config=* ]] || continue
  [[ -z "$config" ]] || die "$arg: a second --config (after $config): the trainer reads the last one only (the" \
    "first's values would be lost): give one file"
  config="$arg"
  # (an empty --config: the trainer reads no file, as with none)
  [[ -n "${arg#--config=}" ]] || continue
  set_by_file="$(PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -S -m mlperf_bert.trainer.run_config \
      "${arg#--config=}" 2>&1)" || { set_by_file="${set_by_file##*$'\n'}"; die "${set_by_file#error: }"; }
  while IFS= read -r flag; do
    case "$flag" in
      --output_dir=*|--mlperf_log=*) name="${flag%%=*}"; name="${name#--}"
        die "$arg sets $name: leave it out of the file and set" \
        "$([[ $name == output_dir ]] && echo OUTPUT_DIR || echo LOGDIR) instead (the run's log is LOGDIR/mlperf.log)" ;;
      ?*) file_sets+=("$flag") ;;
    esac
  done <<< "$set_by_file"
done

[[ "$PRESET" == rcp ]] && die "--preset=rcp needs the global batch of a reference convergence point: choose one of $(rcp_presets)"
[[ "$PRESET" != */* ]] || die "PRESET=$PRESET: a preset is a name of configs/presets/ (NAME.sh), not a path"
preset_file="$HERE/configs/presets/$PRESET.sh"
[[ "$PRESET" =~ ^rcp_[0-9]+$ ]] && preset_file="$HERE/configs/presets/rcp.sh"
[[ -f "$preset_file" ]] || die "unknown preset '$PRESET': choose one of $(cd "$HERE/configs/presets" && ls -- *.sh | sed 's/\.sh$//' | grep -vx rcp | tr '\n' ' ')or rcp_<global batch> (a reference convergence point)"
PRESET_FLAGS=()
PRESET_NUM_GPUS=1
PRESET_BERT_CONFIG=""
PRESET_THREADS=""
# shellcheck source=/dev/null
source "$preset_file"
# the preset's CPU threads (demo_cpu: 1, as the demo runs it; torch's default of one a core ran it 3-12x
# slower beside other jobs); a setting of the user's is left as it is
if [[ -n "$PRESET_THREADS" && -z "${OMP_NUM_THREADS:-}" ]]; then
  export OMP_NUM_THREADS="$PRESET_THREADS"
  threads_set=1
fi

if [[ -z "${DATA_DIR:-}" && "$DRY_RUN" == 1 ]]; then
  # a command to read, not to run: the data's place clearly marked
  DATA_DIR=/DATA_DIR-not-set
  echo "train_model.sh: DATA_DIR is not set: the command shows /DATA_DIR-not-set in its place" >&2
fi
[[ -n "${DATA_DIR:-}" || -n "${INPUT_FILES:-}" ]] || die "set DATA_DIR (directory of part-* TFRecords) or INPUT_FILES"
# the trainer reads --input_file and --eval_input_file as comma lists of globs: such a character in
# DATA_DIR would be read as a pattern (another folder's data, matched silently) or a second path
if [[ -n "${DATA_DIR:-}" && ( -z "${INPUT_FILES:-}" || -z "${EVAL_FILE:-}" ) && "$DATA_DIR" == *[][*?,]* ]]; then
  die "DATA_DIR=$DATA_DIR holds one of * ? [ ] , which the trainer's file lists read as a pattern or a separator:" \
      "give the folder through a path (a symbolic link) without them"
fi
# What the environment sets itself (not the defaults below, DATA_DIR's files and the preset's config,
# which a --config file replaces as it replaces the preset's flags): it beats the file
from_env=" "
for var in INPUT_FILES EVAL_FILE BERT_CONFIG; do [[ -z "${!var:-}" ]] || from_env+="$var "; done
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
int_env MAX_PER_GPU_BATCH 1
[[ -z "${RDZV_TIMEOUT:-}" ]] || int_env RDZV_TIMEOUT 1
(( NODE_RANK < NNODES )) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
(( MASTER_PORT <= 65535 )) || die "MASTER_PORT=$MASTER_PORT is not a port number (1..65535): fix the environment setting"
# (unresolved, torch's rendezvous ended in a 26-line traceback); on the node that runs, not in a check
# elsewhere (CHECK_ONLY=1: a login node need not resolve the nodes' names; CHECK_ONLY=reads: the files check
# after it asks, and a name that times out is waited for once)
if (( NNODES > 1 )) && [[ "$DRY_RUN" != 1 && "${CHECK_ONLY:-0}" != 1 && "${CHECK_ONLY:-0}" != reads ]] \
    && command -v getent > /dev/null \
    && ! getent hosts "${MASTER_ADDR:-127.0.0.1}" > /dev/null; then
  die "MASTER_ADDR=${MASTER_ADDR:-} does not resolve on this node: give the first node's host name or address"
fi
# the trainer's seed is a 64-bit integer (start_training.sh adds a run's number to it)
[[ -z "${SEED:-}" || "$SEED" =~ ^[0-9]{1,18}$ ]] || die "SEED=$SEED must be a whole number >= 0 of at most 18" \
  "digits, or unset for a random seed"
# OUTPUT_DIR and LOGDIR: a file there (or above), or a folder that cannot be made, as the run would find it
# (not for --dry_run: a command to read, maybe for another host)
[[ "$DRY_RUN" == 1 ]] || for var in OUTPUT_DIR LOGDIR; do
  [[ -L "${!var}" && ! -e "${!var}" ]] && die "$var=${!var} is a symbolic link to a path that does not exist:" \
    "make its target, or give another path"
  above="${!var}"
  # (a relative path's first part: its parent is this folder, not itself, which looped for ever)
  while [[ -n "$above" && ! -e "$above" ]]; do
    if [[ "$above" == */* ]]; then above="${above%/*}"; else above=.; fi
  done
  [[ -z "$above" || -d "$above" ]] || die "$var=${!var}: $above is not a directory: give a directory (made if missing)"
  # (writable where the run makes it: not asked of CHECK_ONLY=1, a check maybe elsewhere, as a login node)
  [[ -z "$above" || -w "$above" || "${CHECK_ONLY:-0}" == 1 ]] || die "$var=${!var}: $above is not writable: give a" \
    "directory you can write"
done
if [[ "$PRESET" =~ ^rcp_([0-9]+)$ ]]; then
  # generated from mlperf_logging's rcps_bert.json for this number of GPUs (harness/rcp.py)
  rcp_batch="${BASH_REMATCH[1]}"
  world=$((NUM_GPUS * NNODES))
  # (its one line said with this script's name, as every refusal here is; it writes nothing else there)
  rcp="$(cd "$HERE" && "$PYTHON" -m mlperf_bert.harness.rcp "--batch_size=$rcp_batch" \
        "--world=$world" "--max_per_gpu=$MAX_PER_GPU_BATCH" 2>&1)" || die "${rcp#error: }"
  eval "$rcp"
fi

# flag name of --name=value / --name / --noname, to let an override replace the preset's flag; in
# $REPLY, not printed: a $(...) forks a shell, and this runs for each flag and override
flag_name() { REPLY="${1#--}"; REPLY="${REPLY%%=*}"; }
overridden() {  # FLAG [given]: whether a flag given (or, without "given", one the --config file sets) replaces FLAG
  local name o by=("${overrides[@]+"${overrides[@]}"}")
  [[ "${2:-}" == given ]] || by+=("${file_sets[@]+"${file_sets[@]}"}")
  flag_name "$1"
  name="$REPLY"
  for o in "${by[@]+"${by[@]}"}"; do
    flag_name "$o"
    [[ "$REPLY" == "$name" || "$REPLY" == "no$name" || "no$REPLY" == "$name" ]] && return 0
  done
  return 1
}

# The order: the preset's flags (and this script's defaults) < the --config file < the environment's
# settings < the flags given. The trainer reads the file before its command line: the preset's flags
# the file sets are left out, the environment's stay and beat it (env_kept: theirs, kept).
flags=(
  "--bert_config_file=$BERT_CONFIG"
  "--input_file=$INPUT_FILES"
  "--eval_input_file=$EVAL_FILE"
  "--output_dir=$OUTPUT_DIR"
  "--mlperf_log=$LOGDIR/mlperf.log"
  --do_train
  --do_eval
)
env_flags=" "  # the names of flags above set by the environment
[[ "$from_env" == *" BERT_CONFIG "* ]] && env_flags+="bert_config_file "
[[ "$from_env" == *" INPUT_FILES "* ]] && env_flags+="input_file "
[[ "$from_env" == *" EVAL_FILE "* ]] && env_flags+="eval_input_file "
env_flag() { flags+=("--$1=$2"); env_flags+="$1 "; }  # NAME VALUE
[[ -n "${INIT_CHECKPOINT:-}" ]] && env_flag init_checkpoint "$INIT_CHECKPOINT"
[[ -n "${SEED:-}" ]] && env_flag seed "$SEED"
[[ -n "${SUBMISSION_ORG:-}" ]] && env_flag submission_org "$SUBMISSION_ORG"
[[ -n "${SUBMISSION_PLATFORM:-}" ]] && env_flag submission_platform "$SUBMISSION_PLATFORM"
case "${SUBMISSION_STATUS:-onprem}" in onprem|cloud|research) ;; *)
  die "SUBMISSION_STATUS=$SUBMISSION_STATUS must be onprem, cloud or research (the MLPerf log's status)" ;; esac
[[ -n "${SUBMISSION_STATUS:-}" ]] && env_flag submission_status "$SUBMISSION_STATUS"
kept=()
env_kept=()
for f in "${flags[@]}"; do
  flag_name "$f"
  if [[ "$env_flags" == *" $REPLY "* ]]; then
    overridden "$f" given || { kept+=("$f"); env_kept+=("$f"); }
  else
    overridden "$f" || kept+=("$f")
  fi
done
for f in "${PRESET_FLAGS[@]}"; do
  overridden "$f" || kept+=("$f")
done
# An environment setting that replaces a value the --config file sets: said (under a launcher that
# exports a default, e.g. an sbatch's SUBMISSION_STATUS, the file's value was lost unsaid)
for f in "${env_kept[@]+"${env_kept[@]}"}"; do
  flag_name "$f"
  for a in "${file_sets[@]+"${file_sets[@]}"}"; do
    [[ "$a" == "--$REPLY="* && "${a#*=}" != "${f#*=}" ]] || continue  # (the same value: nothing replaced)
    case "$REPLY" in input_file) var=INPUT_FILES ;; eval_input_file) var=EVAL_FILE ;; bert_config_file) var=BERT_CONFIG ;;
      *) var="${REPLY^^}" ;; esac
    echo "train_model.sh: note: $var=${f#*=} (the environment) replaces ${config#--config=}'s $REPLY (${a#*=}): the" \
      "environment beats a --config file, a flag given beats both" >&2
  done
done

# A closed-division run starts from the reference's phase-1 checkpoint (the trainer refuses it
# too; said here, before a launcher starts). --dry_run shows a marked placeholder instead.
# (the trainer's order: the --config file < its command line, where the flags kept (the file left out the
# preset's flags it sets, not the environment's) come before those given)
flag_value() {  # NAME DEFAULT: the value the trainer gets (the last one given wins)
  local v="$2" a
  for a in "${file_sets[@]+"${file_sets[@]}"}" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}"; do
    [[ "$a" == "--$1="* ]] && v="${a#--$1=}"
  done
  printf '%s\n' "$v"  # (echo took a value -n or -e for its option: printed nothing)
}
source_of() {  # NAME: where the value of --NAME the trainer gets comes from: given, file (--config), or "" (the
  local a from=""  # environment's or the preset's)
  for a in "${file_sets[@]+"${file_sets[@]}"}"; do [[ "$a" == "--$1="* ]] && from=file; done
  for a in "${env_kept[@]+"${env_kept[@]}"}"; do [[ "$a" == "--$1="* ]] && from=; done
  for a in "${overrides[@]+"${overrides[@]}"}"; do [[ "$a" == "--$1="* ]] && from=given; done
  printf '%s\n' "$from"
}
given() {  # NAME: whether the trainer gets --NAME=... or --NAME (the last one given wins)
  local a got=1
  for a in "${file_sets[@]+"${file_sets[@]}"}" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}"; do
    if [[ "$a" == "--$1" || "$a" == "--$1="* ]]; then got=0
    elif [[ "$1" != *=* && "$a" == "--no$1" ]]; then got=1
    elif [[ "$1" == *=* && "$a" == "--${1%%=*}="* ]]; then got=1
    fi
  done
  return $got
}
if given do_train && given submission_division=closed && ! given init_checkpoint; then
  if [[ "$DRY_RUN" == 1 ]]; then
    kept+=("--init_checkpoint=/INIT_CHECKPOINT-not-set")
    echo "train_model.sh: INIT_CHECKPOINT is not set: the command shows /INIT_CHECKPOINT-not-set in its place" >&2
  else
    die "this run (preset $PRESET) is closed division, which starts from the reference's phase-1 checkpoint: download tf1_ckpt/model.ckpt-28252.* (the MLCommons BERT files, README 'From text to verified TFRecords'), check it with \`python -m mlperf_bert verify DIR/tf1_ckpt\` and set INIT_CHECKPOINT=DIR/tf1_ckpt/model.ckpt-28252, or pass --submission_division=open"
  fi
fi
# A closed run's log names the submitter and the system (package refuses one that does not, and a log
# is never rewritten): refused here, before ten runs are made with 'unknown' (the trainer refuses it
# too, as flag_checks.unnamed_submitter: empty or 'unknown' in any case). --dry_run says so instead.
if given do_train && given submission_division=closed; then
  unnamed=()
  for name in org platform; do
    value="$(flag_value "submission_$name" unknown)"
    value="${value#"${value%%[![:space:]]*}"}"; value="${value%"${value##*[![:space:]]}"}"
    [[ -z "$value" || "${value,,}" == unknown ]] && unnamed+=("SUBMISSION_${name^^}")
  done
  if (( ${#unnamed[@]} )); then
    what="${unnamed[*]}"; what="${what// / and }"
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "train_model.sh: $what not set: the run is refused until they are (closed division)" >&2
    else
      die "this run (preset $PRESET) is closed division, whose log names who submits it and on which system, and package refuses a log without them (a log cannot be fixed after the run): set $what (the package's --org and system name), or pass --submission_division=open"
    fi
  fi
fi

if (( NUM_GPUS * NNODES == 1 )); then
  # one process: no launcher between the user and the trainer's own error line and exit status
  cmd=("$PYTHON" "$HERE/run_pretraining.py" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}")
else
  # torchrun through python -m mlperf_bert torchrun (mlperf_bert/trainer/launch.py): SIGTERM -> every
  # rank checkpoints, one line, exit 143; a failed or killed rank -> its one line and status
  launcher=("$PYTHON" -m mlperf_bert torchrun)
  if [[ "$NNODES" == 1 ]]; then
    launcher+=(--standalone --nnodes=1 "--nproc_per_node=$NUM_GPUS")
  else
    launcher+=("--nnodes=$NNODES" "--node_rank=$NODE_RANK" "--nproc_per_node=$NUM_GPUS"
               "--master_addr=${MASTER_ADDR:-127.0.0.1}" "--master_port=$MASTER_PORT")
    # the static rendezvous' wait for the other nodes (torchrun's 900 s unless set); the wrapper says
    # that it waits, and when they do not come, what to check (exit 78)
    [[ -z "${RDZV_TIMEOUT:-}" ]] || launcher+=("--rdzv_conf=timeout=$RDZV_TIMEOUT")
  fi
  cmd=("${launcher[@]}" "$HERE/run_pretraining.py" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}")
fi

# Processes per node against what this host has (not for --dry_run: a command to read, maybe for
# another host): GPUs as torch counts them; without one, the trainer runs on the CPU, where more
# processes than cores only slow each other down.
if [[ "$DRY_RUN" != 1 && "${CHECK_ONLY:-0}" != reads ]] && (( NUM_GPUS > 1 )); then
  device="$(flag_value device auto)"
  found=0
  if [[ "$device" != cpu ]]; then
    # a CPU build of torch (version +cpu) sees no GPU: said without importing torch (1.5 s of CPU)
    found="$("$PYTHON" -c 'import importlib.metadata, sys
if importlib.metadata.version("torch").endswith("+cpu"): sys.exit(print(0))
import torch; print(torch.cuda.device_count())' 2>/dev/null)" || found=0
  fi
  if (( found > 0 )); then
    (( NUM_GPUS <= found )) || die "NUM_GPUS=$NUM_GPUS processes per node, but this host has $found GPU(s) (torch.cuda.device_count()): set NUM_GPUS=$found or fewer"
  elif [[ "$device" != cuda ]]; then  # --device=cuda without a GPU: the trainer says so
    # the cores this process may run on (nproc would report OMP_NUM_THREADS instead when it is set)
    cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"
    (( NUM_GPUS <= cores )) || die "NUM_GPUS=$NUM_GPUS processes per node, but this host has no GPU and $cores CPU cores (nproc), one process each at most: set NUM_GPUS=$cores or fewer"
  fi
fi
# What the run asks of each GPU (sets plan and warning): the trainer's --train_batch_size is the global
# batch of one micro-step, split over the ranks; --steps_per_update micro-steps make one update. Its
# figures as the trainer reads its flags and the --config file (flag_checks.launch_figures: absl's
# parsers, no torch, 0.1 s of CPU): bash's own reading took 064 as octal and left 0x40 or a string of
# the file unsaid. CHECK_ONLY reads them too, so a value the trainer cannot read is refused before a
# series' first run, not after its STARTING TIMING RUN; with --check (CHECK_ONLY) also the trainer's
# refusals of its flags alone (flag_checks.check_flags, no torch either): --nodo_train, a
# --train_batch_size of 0, --optimizer=adamw with accumulation were refused only by run 0's trainer.
# Its checks of this host's memory (its container's limit where smaller: the micro-batch) and cores
# (--num_workers) are the training host's:
# CHECK_ONLY=files (start_training.sh's, there) runs them, CHECK_ONLY=1 (a login node's check before a
# job is submitted) leaves them out (--check_off_host), as --dry_run does (a command maybe for another host).
read_figures() {  # --figures | --check | --check_off_host
  gpus=$((NUM_GPUS * NNODES))
  if ! figures="$("$PYTHON" -m mlperf_bert.trainer.flag_checks "$1" "$gpus" "${kept[@]}" "${overrides[@]+"${overrides[@]}"}" \
      2>&1)"; then
    figures="${figures##*$'\n'}"
    [[ "$figures" == "error: "* ]] && die "${figures#error: }"
    die "cannot read the trainer's flags with PYTHON=$PYTHON ($figures): set PYTHON to the project's interpreter" \
      "(make venv makes .venv/bin/python)"
  fi
  read -r micro accum global seq_len device optimizer <<< "${figures##*$'\n'}"
  plan=""
  if [[ "$micro" =~ ^[1-9][0-9]{0,8}$ && "$accum" =~ ^[1-9][0-9]{0,8}$ ]]; then
    per_gpu=$((micro / gpus))
    unit=GPU
    [[ "$PRESET" == demo_cpu || "$device" == cpu ]] && unit="CPU process"
    plan="global batch $global = $gpus ${unit}(s) x $per_gpu sequences of $seq_len per $unit per micro-step x $accum micro-step(s) per update"
    # (the plan's default is BERT-Large at seq 512 on an 80 GB GPU: at seq 128 it holds 467 rows, and a
    # CPU's memory is the trainer's own check; a longer sequence holds fewer rows still: warned too)
    warn_max=$max_given
    [[ "$unit" == GPU && "$seq_len" =~ ^[0-9]{1,9}$ ]] && (( seq_len >= 512 )) && warn_max=1
    if (( warn_max && per_gpu > MAX_PER_GPU_BATCH )); then
      warning="warning: train_model.sh: $per_gpu sequences per GPU per micro-step is above MAX_PER_GPU_BATCH=$MAX_PER_GPU_BATCH (what one GPU is taken to hold; the memory plan: python -m mlperf_bert.trainer.memory_plan, docs/training.md)"
      # the smallest accumulation that fits, among sane ones (a prime global batch has none but itself);
      # --optimizer=adamw takes none (the trainer refuses --steps_per_update above 1 with it)
      [[ "$optimizer" == adamw ]] && warning+="; --optimizer=adamw cannot accumulate micro-steps (the trainer refuses --steps_per_update above 1 with it): give a smaller --train_batch_size, more GPUs, or --optimizer=lamb"
      [[ "$optimizer" == adamw ]] || for (( n = accum + 1; n <= global && n <= 64 * accum; n++ )); do
        if (( global % (gpus * n) == 0 && global / (gpus * n) <= MAX_PER_GPU_BATCH )); then
          ratio=$((n / accum)); (( n % accum == 0 )) || ratio="$n/$accum"
          warning+="; to keep the global batch $global use --train_batch_size=$((global / n)) --steps_per_update=$n and multiply --num_train_steps, --num_warmup_steps and --start_warmup_step by $ratio (they count micro-steps)"
          break
        fi
      done
    fi
  fi
}

# The files the run reads, as the trainer's first check looks for them (comma lists of globs), each
# refusal naming the setting that gave it (DATA_DIR, INPUT_FILES, a flag, the --config file): by
# start_training.sh's check (CHECK_ONLY=files), on the node that runs (a login node may not see a
# node's local data), and before a run this script starts itself
said_as() {  # FLAG VALUE VAR: sets what to where the run got FLAG's VALUE (the command line, the --config file, VAR)
  case "$(source_of "$1")" in
    given) what="--$1=$2" ;;
    file) what="$1 $2 (${config#--config=})" ;;
    *) what="$3=$2" ;;
  esac
}
check_files() {
  # (the files the trainer gets: a --input_file, --eval_input_file or --init_checkpoint given, or set by the
  # --config file, replaces the environment's; the environment's were checked instead, and run 0 refused them)
  train_spec="$(flag_value input_file "$INPUT_FILES")"
  eval_spec="$(flag_value eval_input_file "$EVAL_FILE")"
  init="$(flag_value init_checkpoint "")"
  train_from="INPUT_FILES, or DATA_DIR's part-*" eval_from="EVAL_FILE, or DATA_DIR's eval_10k"
  train_fix="set DATA_DIR to the folder of the TFRecords (or INPUT_FILES to them)"
  case "$(source_of input_file)" in
    given) train_from="the --input_file given" train_fix="give it the TFRecords" ;;
    file) train_from="input_file of ${config#--config=}" train_fix="set it there to the TFRecords" ;;
  esac
  case "$(source_of eval_input_file)" in
    given) eval_from="the --eval_input_file given" ;;
    file) eval_from="eval_input_file of ${config#--config=}" ;;
  esac
  if given do_train; then
    # the trainer's own reading of the lists (mlperf_bert/fileio.py glob_parts): a path with a
    # backslash or a newline is the trainer's to read as it is
    # A list that takes what the run writes (OUTPUT_DIR=$DATA_DIR/part-run, INPUT_FILES=$DATA_DIR/* with
    # OUTPUT_DIR=$DATA_DIR/out): its trainer refused "OUTPUT_DIR/run_0 is a directory", after STARTING
    # TIMING RUN and the runs before it, or read the run's own files as records
    unmatched="$("$PYTHON" -S -c 'import os, sys
from mlperf_bert.fileio import comma_hint, glob_parts, glob_part_takes, missing_dirs
out, log = sys.argv[3:]
ours = [("OUTPUT_DIR", p) for p in (out, os.path.join(out, "run_0"), os.path.join(out, "model.ckpt-1.pt"))]
ours += [("LOGDIR", p) for p in (log, os.path.join(log, "mlperf.log"))]
ours += [(var, d) for var, p in (("OUTPUT_DIR", out), ("LOGDIR", log)) for d in missing_dirs(p)]  # (the folders made above)
for which, spec in zip(("train", "eval"), sys.argv[1:3]):
    bad = [(part, k) for k, (part, matches) in enumerate(glob_parts(spec)) if not matches]
    if bad:
        sys.exit(print(which, bad[0][0] + "\x1f" + comma_hint(spec, bad[0][1]), end="") or 1)
    taken = [(var, part) for part, _ in glob_parts(spec) for var, p in ours if glob_part_takes(part, p)]
    if taken:
        sys.exit(print(which, *taken[0], end="") or 3)' "$train_spec" "$eval_spec" "$OUTPUT_DIR" "$LOGDIR" 2>&1)" \
      && rc=0 || rc=$?
    case "$rc,$unmatched" in
      0,) ;;
      1,"train "*|1,"eval "*) which=${unmatched%% *} part=${unmatched#* } && hint=${part##*$'\x1f'} && part=${part%$'\x1f'*}
        # (the hint: a file whose name holds a ',' that the list split, given by a glob)
        if [[ "$which" == train ]]; then
          die "no training file matches $part ($train_from)${hint:-: $train_fix}"
        fi
        die "no eval file matches $part ($eval_from)${hint:-: give the eval set make-dataset (pick-eval-samples) made}" ;;
      3,*) which=${unmatched%% *} var=${unmatched#* } && part=${var#* } && var=${var%% *}  # (a part may hold \n)
        from=$train_from; [[ "$which" == train ]] || from=$eval_from
        die "$var=${!var} is where the run writes, and ${part} ($from) takes what it writes there (its" \
          "folders, checkpoints, log) as records: give $var outside what the run reads" ;;
      *) die "cannot check the files the run reads with PYTHON=$PYTHON: $unmatched" ;;
    esac
  fi
  # the init checkpoint by start_training.sh's check alone: run here, a resume whose --init_checkpoint is
  # gone (a scratch disk cleaned) goes on, holding the one it recorded, as the trainer decides
  if [[ "${CHECK_ONLY:-0}" == files && -n "$init" && ! -f "$init" && ! -f "$init.index" ]]; then
    said_as init_checkpoint "$init" INIT_CHECKPOINT
    die "$what not found: give a .pt file or a TF checkpoint prefix whose .index exists"
  fi
  # the model's config, which the trainer reads first (a resume too): missing, run 0 failed after STARTING
  # TIMING RUN, a job after its wait for nodes
  bert="$(flag_value bert_config_file "")"
  if [[ "${CHECK_ONLY:-0}" == files && -n "$bert" && ! -f "$bert" ]]; then
    said_as bert_config_file "$bert" BERT_CONFIG
    [[ "$from_env" == *" BERT_CONFIG "* || -n "$(source_of bert_config_file)" ]] ||
      die "preset $PRESET's BERT config $bert is not a file: restore it (git checkout configs), or set BERT_CONFIG"
    die "$what is not a file: give the model's bert_config.json"
  fi
}

# CHECK_ONLY=reads (start_training.sh's mount check, REQUIRE_MOUNT=1): the paths the run reads, as the
# trainer gets them, each NUL-ended after where it came from (said_as; DATA_DIR where its default gave it):
# WHAT, then a path or glob; the file lists part by part as the trainer splits them (fileio.glob_parts: at
# commas, white space around a part dropped), the checkpoint and the config whole (one path each, which a
# comma is part of) (the --config file: start_training.sh reads it before)
if [[ "${CHECK_ONLY:-0}" == reads ]]; then
  for pair in input_file:INPUT_FILES eval_input_file:EVAL_FILE init_checkpoint:INIT_CHECKPOINT \
              bert_config_file:BERT_CONFIG; do
    name=${pair%%:*} var=${pair#*:}
    spec="$(flag_value "$name" "")"
    [[ -n "$spec" ]] || continue
    said_as "$name" "$spec" "$var"
    # (INPUT_FILES' and EVAL_FILE's defaults: DATA_DIR's part-* and eval_10k)
    if [[ ( "$var" == INPUT_FILES || "$var" == EVAL_FILE ) && -z "$(source_of "$name")" && "$from_env" != *" $var "* ]]
    then what="DATA_DIR=$DATA_DIR"; fi
    if [[ "$var" == INPUT_FILES || "$var" == EVAL_FILE ]]; then rest="$spec,"; else rest=; printf '%s\0%s\0' "$what" "$spec"; fi
    while [[ -n "$rest" ]]; do
      part=${rest%%,*} rest=${rest#*,}
      part=${part#"${part%%[![:space:]]*}"} part=${part%"${part##*[![:space:]]}"}
      [[ -z "$part" ]] || printf '%s\0%s\0' "$what" "$part"
    done
  done
  exit 0
fi
if [[ "${CHECK_ONLY:-0}" == 1 || "${CHECK_ONLY:-0}" == files ]]; then  # the settings checked as a run checks them, nothing run
  # the trainer's packages, found without importing them (torch's import: 1.5 s of CPU); else a
  # started run's ModuleNotFoundError traceback
  missing="$("$PYTHON" -c 'import importlib.util
print(" ".join(m for m in ("absl", "numpy", "torch", "mlperf_logging", "tqdm", "crc32c") if importlib.util.find_spec(m) is None))' \
    2>/dev/null)" || missing="everything (it did not run)"
  [[ -z "$missing" ]] || die "PYTHON=$PYTHON lacks the trainer's packages ($missing): set PYTHON to the project's" \
    "interpreter (make venv makes .venv/bin/python), or install requirements.txt into it"
  if [[ "$CHECK_ONLY" == files ]]; then read_figures --check; else read_figures --check_off_host; fi
  # $TMPDIR against the loader workers' socket paths: the trainer's preflight check itself
  # (mlperf_bert/fileio.py check_tmpdir, torch-free), with the --num_workers the run gets
  if given do_train; then
    tmp_error="$("$PYTHON" -S -c 'import sys
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import check_tmpdir
try:
    check_tmpdir(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)  # else: the trainer refuses the flag
except UserError as e:
    sys.exit(print(e) or 1)' "$(flag_value num_workers 2)" 2>&1)" || die "$tmp_error"
  fi
  [[ "$CHECK_ONLY" == files ]] && check_files
  [[ "$CHECK_ONLY" == files ]] || echo "train_model.sh: CHECK_ONLY=1: the settings pass; left to the host that" \
    "trains (start_training.sh's check before its first run, and the trainer, check them there): the micro-batch" \
    "against its memory and --num_workers against its cores"
  exit 0
fi

read_figures --figures
if [[ "$DRY_RUN" == 1 ]]; then
  [[ -n "$plan" ]] && echo "train_model.sh: preset $PRESET: $plan" >&2
  [[ -n "${warning:-}" ]] && echo "$warning" >&2
  [[ -n "${alloc_conf_set:-}" ]] && echo "export PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF"
  [[ -n "${threads_set:-}" ]] && echo "export OMP_NUM_THREADS=$OMP_NUM_THREADS"
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
check_files
# OUTPUT_DIR and LOGDIR are the trainer's to make (and to remove again, empty, when it refuses the run)
[[ -n "$plan" ]] && echo "train_model.sh: preset $PRESET: $plan"
[[ -n "${warning:-}" ]] && echo "$warning" >&2
echo "train_model.sh: preset $PRESET: ${cmd[*]}"
# how the run was launched, which the trainer keeps in run_finished.json and package in launch.json
MLPERF_BERT_OVERRIDES=""
(( ${#overrides[@]} == 0 )) || printf -v MLPERF_BERT_OVERRIDES '%q ' "${overrides[@]}"
export MLPERF_BERT_PRESET="$PRESET" MLPERF_BERT_OVERRIDES="${MLPERF_BERT_OVERRIDES% }"
exec "${cmd[@]}"
