#!/usr/bin/env bash
# The container's root process: a timed MLPerf run, like the reference's run_and_time.sh.
#
# Prints STARTING TIMING RUN AT, drops the page cache where it can (root with a writable
# /proc/sys/vm/drop_caches: in a container --privileged) and says so in one line, the trainer
# logging `cache_clear` true only after a drop that succeeded (a resumed run's log keeps its first
# start's, and the line says so); runs train_model.sh with the arguments. A run that finishes:
# ENDING TIMING RUN AT, RESULT,bert,<seed>,<seconds>,<user>,<start> (<seconds>: this invocation's,
# init included, as the reference counts; a run this invocation resumed adds a field saying so and
# giving the log's run_start to run_stop, which MLPerf scores), then `check-log $LOGDIR/mlperf.log`.
# A run stopped by SIGTERM/SIGINT (docker stop, a scheduler, Ctrl-C; passed on so the trainer
# checkpoints) or one that fails: one line saying so, which checkpoint holds it and that the same
# command resumes (its log is not checked: the run has not ended). Exits with the training's status:
# 143 after SIGTERM (130 after SIGINT) when a checkpoint holds the run, 79 when the stop came before
# anything was saved (no checkpoint: the same command starts it again; on a node other than 0, whose
# OUTPUT_DIR may be its own disk without them, the line says node 0's status tells), a failure's own status (a
# rank killed: 128 + its signal) also when it came with a stop. A run that finished
# earlier is not run again; one whose end marker and log disagree (its log cut since, a status
# edited) is refused in one line, a series' before run 0 trains, and so is a finished run, or one a
# checkpoint holds, given another SEED. With DATA_DIR unset and no arguments
# it runs the built-in demo.
#
# Environment: everything train_model.sh reads (PRESET, DATA_DIR, INPUT_FILES, EVAL_FILE,
# INIT_CHECKPOINT, BERT_CONFIG, OUTPUT_DIR [./output], LOGDIR [$OUTPUT_DIR], NUM_GPUS, NNODES,
# NODE_RANK, MASTER_ADDR, MASTER_PORT, SUBMISSION_ORG, SUBMISSION_PLATFORM, SUBMISSION_STATUS,
# PYTHON, MAX_PER_GPU_BATCH, PYTORCH_CUDA_ALLOC_CONF [expandable_segments:True unless it or
# PYTORCH_ALLOC_CONF is set, as train_model.sh sets it, here for a TRAIN_MODEL of one's own too]), plus
#   SEED           the trainer's --seed, a decimal number; NUM_RUNS: run i gets SEED+i
#                  [the trainer's: random, logged and kept in its checkpoints]
#   DROP_CACHES    auto = drop the page cache before each run when root (sync; echo 3 >
#                  /proc/sys/vm/drop_caches), 1 = try even when not root, 0 = never (a shared
#                  host whose cache must stay)                                [auto; 1 in the image]
#   CHECK_LOG      1 = run the log checker after a finished run                [1]
#   CHECK_ONLY     1 = only check the settings as train_model.sh does, and OUTPUT_DIR's runs as
#                  each run does (one line, no run); its DRY_RUN is refused here [0]
#   NUM_RUNS       runs in a row, each in $OUTPUT_DIR/run_N with its own seed, its log kept as
#                  $LOGDIR/result_N.txt (a submission has 10); a rerun skips finished runs and
#                  resumes the one that stopped                                [1]
#   TRAIN_MODEL    the training script                                       [./train_model.sh]
#   REQUIRE_MOUNT  1 = refuse an OUTPUT_DIR or LOGDIR outside every mounted folder, links and ..
#                  resolved (in a container: on its own filesystem, lost with it; mount one,
#                  docker run -v "$PWD/out":/output); and a folder the run reads (DATA_DIR, or
#                  that of an --input_file, --eval_input_file, --init_checkpoint, INPUT_FILES, ...)
#                  missing and in no mounted folder (the data's -v forgotten) [0; 1 in the image]
#   TORCHINDUCTOR_CACHE_DIR  torch.compile's cache (--compile), shared by every run of a series,
#                  so only the first compiles from scratch (in its untimed init) [$OUTPUT_DIR/compile_cache]
# Arguments are passed to train_model.sh (e.g. --preset=tpu_8192 --train_batch_size=512), but
# not --seed (nor a --config file's seed), --output_dir or --mlperf_log (SEED, OUTPUT_DIR and LOGDIR: it
# sets them for each run), nor --flagfile (give its flags as arguments);
# --help prints this and the presets with what each asks of each GPU (as train_model.sh --help does);
# --helpfull (--helpshort) the trainer's flags.
set -uo pipefail
ME=start_training.sh

# SIGTERM goes on to the trainer as SIGTERM; SIGINT as SIGINT, then SIGTERM: the trainer (and the
# torchrun wrapper) act on the first and name it, while a child that has not installed its handlers
# yet ignores SIGINT (a background job does) and ends on the SIGTERM. The run that was going on then
# says it stopped.
child=
got_signal=
launching=
pass_on() {  # the signal got, to $child
  [[ "$got_signal" == INT ]] && kill -INT "$child" 2>/dev/null
  kill -TERM "$child" 2>/dev/null
}
# Before a trainer runs, the first signal is the stop and the next ones are ignored: the processes
# that read what the stop's check needs (a run's state, its folder) then start with them ignored.
# Caught, a scheduler's signals in quick succession (to every process of the job) end such a process
# before bash has set its dispositions (a `$(...)` left empty), and bash 5.2 running the trap while
# it reads a `$(...)` reads it wrong ("unexpected EOF while looking for matching `)'"). Not while a
# trainer is being started (launching): it would start with them ignored.
# In a group with its stderr dropped: a signal caught just before the `trap ''` is left pending, and
# bash, finding it ignored, drops it (as one that comes after) with a warning on stderr ("run_pending_traps:
# bad value in trap_list[15]"), written inside the group: to /dev/null, not beside the run's one line.
ignore_signals() { { trap '' TERM INT; } 2>/dev/null; }
on_signal() {
  interrupted=1
  if [[ -n "$child" ]]; then
    got_signal=$1
    pass_on
  else
    got_signal=${got_signal:-$1}
    [[ -n "$launching" ]] || ignore_signals
  fi
}
catch_signals() { trap 'on_signal TERM' TERM; trap 'on_signal INT' INT; }
# Caught from the first line: a signal while the settings are read (the process group's, as a
# scheduler or `kill -TERM -PGID` sends it) is a stop the first run's check reports (79: nothing of it
# saved; 143 where its checkpoints or the series' finished runs hold it), not bash's own death (143,
# no line) or, as a container's process 1, a signal the kernel drops (pid_namespaces(7): process 1
# gets only the signals it has a handler for). The settings are read by bash alone (no process).
catch_signals
# `start_training.sh ... 2>&1 | tee run.log`, then Ctrl-C: the terminal's SIGINT ends tee with the run,
# and every line written after it (the stop's, its verdict) meets a broken pipe, whose SIGPIPE ended
# this script at that line: 141, not the stop's 130 that a script resubmits on. Caught (what it starts
# gets the default action back), a line nobody reads is dropped, and so is bash's "echo: write error"
# for it (on a terminal when only stdout went to tee): every line of this script is an echo.
trap : PIPE
echo() { builtin echo "$@" 2>/dev/null; }
signal_status() { if [[ "$got_signal" == INT ]]; then sig_status=130; else sig_status=143; fi; }  # sets sig_status
# A stop before anything was saved: no checkpoint to resume (143 says one holds the run);
# mlperf_bert/trainer/launch.py's NOT_SAVED_STATUS
NOT_SAVED=79
# Rank 0, on node 0, writes the MLPerf log and the checkpoints: the other nodes of a multi-node run neither
# copy nor check the log (on shared storage they would read it while rank 0 may still be writing its last lines)
log_node() { [[ "${NODE_RANK:-0}" =~ ^0*$ ]]; }
# A stop that found no checkpoint in this node's OUTPUT_DIR: nothing saved on node 0; another node's folder,
# where it is its own disk, holds none whatever node 0's holds (start_signals.stopped_at_start's line)
NODE0_TELLS="this node's OUTPUT_DIR holds no checkpoint (rank 0 on node 0 writes them): node 0's status says whether one holds the run (exit $NOT_SAVED here); rerun the same command on every node"
# this script's folder, by builtins (no process a signal could end)
HERE=$PWD
SELF=${BASH_SOURCE[0]}
# started through a symbolic link (one in PATH): the checkout's folder (a process, on this path alone)
[[ -L "$SELF" ]] && SELF="$(readlink -f -- "$SELF")"
case "$SELF" in
  # -P: the folder the kernel found the script in (`../start_training.sh` from inside a linked folder: the link's
  # parent was taken, the wrong checkout); back to the caller's folder as it named it
  */*) CDPATH='' cd -P -- "${SELF%/*}" && HERE=$PWD || exit 2
       CDPATH='' cd -- "$OLDPWD" 2>/dev/null || { echo "error: start_training.sh: cannot return to the current folder $OLDPWD" \
         "(removed since?): run it from a folder that exists" >&2; exit 2; } ;;
esac

# one line: a value's newline (SEED=$'5\n', a path) written \n, not a second line of the error
die() { local line="error: $ME: $*"; line=${line//$'\r'/\\r}; echo "${line//$'\n'/\\n}" >&2; exit 2; }
# (a missing or non-executable one was bash's "line 294: ...: Permission denied", and --help exit 0)
[[ -n "${TRAIN_MODEL:-}" || ( -f "$HERE/train_model.sh" && -x "$HERE/train_model.sh" ) ]] || die "$HERE/train_model.sh" \
  "is missing or not executable: restore it (git checkout train_model.sh; chmod +x train_model.sh), or set" \
  "TRAIN_MODEL to a training script"
seeds=()  # the seeds of the runs of a series finished so far
later_runs=()  # DIR LOG pairs of a series' later runs, whose state run_one reads with run 0's
run_index=  # the series' run run_one is given
stop_if_signalled() {  # NAME DIR: after a signal, a stop before that run's trainer started; 143 (130)
  # where a checkpoint in DIR or an earlier run of the series holds what was done, else NOT_SAVED, as
  # a trainer's stop says
  [[ -n "$got_signal" ]] || return 0
  newest_checkpoint "$2"
  signal_status
  if [[ -n "$newest" ]] || (( ${#seeds[@]} )); then
    echo "$ME: stopped by SIG$got_signal before $1; rerun the same command to go on"
    exit "$sig_status"
  fi
  if log_node; then
    echo "$ME: stopped by SIG$got_signal before $1 started: nothing saved (exit $NOT_SAVED, not $sig_status); rerun the same command to start it"
  else
    echo "$ME: stopped by SIG$got_signal before $1 started: $NODE0_TELLS"
  fi
  exit "$NOT_SAVED"
}
newest_checkpoint() {  # DIR: sets newest to its newest model.ckpt-<step>.pt, or empty
  local f n best_n=-1
  newest=
  for f in "$1"/model.ckpt-*.pt; do
    [[ "$f" =~ /model\.ckpt-([0-9]+)\.pt$ ]] || continue
    n=$((10#${BASH_REMATCH[1]}))
    if (( n > best_n )); then best_n=$n; newest=$f; fi
  done
}

for arg in "$@"; do
  case "$arg" in
    -h|--help)
      sed -n '2,/^set -/p' "$SELF" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'
      "${TRAIN_MODEL:-$HERE/train_model.sh}" --help | sed -n '/^presets: /,$p'  # with the rcp_<B> installed
      exit 0 ;;
    # the trainer's flags (train_model.sh lists them): passed on, a series started, its trainer printed
    # them and ended, and the run was said to have finished (a RESULT line, then no log to keep: exit 2)
    --helpfull|--helpshort) exec "${TRAIN_MODEL:-$HERE/train_model.sh}" "$arg" ;;
    # what it sets for each run itself: given as a flag, every run of a series would share it (one
    # seed for ten runs, which the package checker's seed check fails; one output folder), and
    # its checkpoints, state and log would be looked for where the trainer did not put them
    --seed|--seed=*) die "$arg: set SEED instead (run i of a series gets SEED+i: one --seed would be every run's)" ;;
    --output_dir|--output_dir=*) die "$arg: set OUTPUT_DIR instead (it keeps each run's checkpoints and state there)" ;;
    --mlperf_log|--mlperf_log=*) die "$arg: set LOGDIR instead (a run's log is its LOGDIR/mlperf.log, which it checks and keeps)" ;;
    # absl reads a flag file where it stands, after the --seed this script gives: its seed won
    --flagfile|--flagfile=*) die "$arg: give the file's flags as arguments instead (the trainer reads a flag file" \
      "past these checks: its --seed would be every run's, its --output_dir not where the runs are looked for)" ;;
    --) die "'--': give the trainer's flags without it (--name=value; after '--' they are arguments, which the trainer refuses)" ;;
    -*) ;;
    *) die "unexpected argument '$arg': pass trainer flags as --name=value (settings as environment variables, see --help)" ;;
  esac
done
case "${DROP_CACHES:=auto}" in 0|1|auto) ;; *) die "DROP_CACHES=$DROP_CACHES must be 0, 1 or auto" ;; esac
case "${CHECK_LOG:=1}" in 0|1) ;; *) die "CHECK_LOG=$CHECK_LOG must be 0 or 1 (1: the log checker on each finished run's log)" ;; esac
case "${CHECK_ONLY:=0}" in 0|1) ;; *) die "CHECK_ONLY=$CHECK_ONLY must be 0 or 1 (1: check the settings, start no run)" ;; esac
case "${REQUIRE_MOUNT:=0}" in 0|1) ;; *) die "REQUIRE_MOUNT=$REQUIRE_MOUNT must be 0 or 1 (1: OUTPUT_DIR and LOGDIR in a mounted folder)" ;; esac
DROP_CACHES_FILE="${MLPERF_DROP_CACHES_FILE:-/proc/sys/vm/drop_caches}"  # another file: the tests only
MOUNTINFO_FILE="${MLPERF_MOUNTINFO_FILE:-/proc/self/mountinfo}"  # another file: the tests only
# Decimal whole numbers (bash would read 010 as octal and fail on 08 or abc).
# set but empty (a job's NUM_RUNS=$TYPO): it ran one run, not the series, in OUTPUT_DIR itself, exit 0
[[ -v NUM_RUNS && -z "$NUM_RUNS" ]] && die "NUM_RUNS= is set but empty: give the number of runs (10 for a" \
  "submission), or unset it for one run"
[[ "${NUM_RUNS:=1}" =~ ^[0-9]{1,9}$ ]] && (( 10#$NUM_RUNS >= 1 )) || die "NUM_RUNS=$NUM_RUNS must be a whole number >= 1"
# At most MAX_RUNS: a series' runs are looked at before run 0 trains, every one in bash loops and in
# one run_state command line (DIR LOG per run). NUM_RUNS=100000 passed the kernel's limit on a
# command line (E2BIG, status 126: "cannot read the state of run 0 ... check PYTHON"); 999999999
# looped in bash over 10 minutes (then killed) before any run, its SIGTERM ignored until then.
MAX_RUNS=100
(( 10#$NUM_RUNS <= MAX_RUNS )) || die "NUM_RUNS=$NUM_RUNS is more than the $MAX_RUNS runs a series takes (a BERT" \
  "submission has 10): give a smaller NUM_RUNS"
NUM_RUNS=$((10#$NUM_RUNS))
if [[ -n "${SEED:-}" ]]; then
  [[ "$SEED" =~ ^[0-9]{1,18}$ ]] || die "SEED=$SEED must be a whole number >= 0 (decimal) of at most 18 digits, or unset for a random seed"
  SEED=$((10#$SEED))
  # run i gets SEED+i: the last run's seed must be one too (train_model.sh's check would refuse it
  # only once the runs before it had trained)
  (( SEED + NUM_RUNS - 1 <= 999999999999999999 )) || die "SEED=$SEED with NUM_RUNS=$NUM_RUNS: the last run's" \
    "seed SEED+$((NUM_RUNS - 1)) has more than 18 digits: give a smaller SEED"
fi

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
# a relative PYTHON (venv/bin/python) names the caller's file: made absolute, so the steps run from the
# checkout (cd "$HERE") find it too (they ended "No such file or directory", blamed on PYTHON)
if [[ "$PYTHON" == */* && "$PYTHON" != /* ]]; then PYTHON="$PWD/$PYTHON"; fi
export PYTHON
# A --config file's seed is refused as --seed is: unless SEED is set (its --seed beats the file),
# every run would have it. The flags the file sets, read as the trainer reads it (a file it refuses:
# that line, before any run); a signal meanwhile: the first run's check says the stop.
for arg; do
  [[ "$arg" == --config=?* ]] || continue  # (an empty --config: the trainer reads no file)
  if ! set_by_file="$(PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -S -m mlperf_bert.trainer.run_config \
      "${arg#--config=}" 2>&1)"; then
    [[ -n "$got_signal" ]] && break
    set_by_file="${set_by_file##*$'\n'}"
    die "${set_by_file#error: }"
  fi
  [[ $'\n'"$set_by_file" == *$'\n'--seed=* ]] && die "$arg sets seed: leave it out of the file and set SEED" \
    "instead (run i of a series gets SEED+i; unset, each run draws its own: the file's would be every run's)"
done
if [[ -z "${PYTORCH_CUDA_ALLOC_CONF+x}${PYTORCH_ALLOC_CONF+x}" ]]; then
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # train_model.sh's setting (see there)
fi
absolute() {  # VAR PATH: sets VAR to PATH made absolute against $PWD, without `.` or empty parts (`..` kept:
  # after a symbolic link it is not the part before)
  local path=$2
  [[ "$path" == /* ]] || path="$PWD/$path"
  path+=/
  while [[ "$path" == *//* || "$path" == */./* ]]; do
    path=${path//\/\//\/}
    path=${path//\/.\//\/}
  done
  path=${path%/}
  printf -v "$1" %s "${path:-/}"
}
absolute OUTPUT_DIR "${OUTPUT_DIR:-$PWD/output}"
absolute LOGDIR "${LOGDIR:-$OUTPUT_DIR}"
# Linux's limits on a path (PATH_MAX, with its NUL) and on each of its names (NAME_MAX), in bytes, and
# the room kept below OUTPUT_DIR and LOGDIR for what the runs write there (run_999999999/
# model.ckpt-999999999.pt.tmp-4194304, .result_N.txt.tmp-PID: 50 at most). Past them the trainer's
# first write was refused after STARTING TIMING RUN ("file name too long"), or the run's state, unread,
# was taken for a finished run's ("finished earlier, but its MLPerf log is not ...").
PATH_MAX=4095 NAME_MAX=255 PATH_ROOM=64
n_bytes() { local LC_ALL=C; n=${#1}; }  # sets n (bash counts characters in the caller's locale)
check_length() {  # VAR: its path within those limits
  local path=${!1} rest=${!1} name n
  n_bytes "$path"
  (( n + PATH_ROOM <= PATH_MAX )) || die "$1=$path is $n bytes long: the files the run writes in it" \
    "would pass the $PATH_MAX bytes a path may have: give a path of at most $((PATH_MAX - PATH_ROOM)) bytes (a" \
    "symbolic link to the folder from a shorter path will do)"
  while [[ -n "$rest" ]]; do
    rest=${rest#/} name=${rest%%/*} rest=${rest#"$name"}
    n_bytes "$name"
    (( n <= NAME_MAX )) || die "$1=$path has a name of $n bytes, more than the $NAME_MAX a" \
      "file system takes: give a path with shorter names"
  done
}
for var in OUTPUT_DIR LOGDIR; do  # a file there (or above) read as "finished earlier (unreadable)": exit 0
  check_length "$var"
  [[ -L "${!var}" && ! -e "${!var}" ]] && die "$var=${!var} is a symbolic link to a path that does not exist:" \
    "make its target, or give another path"
  above="${!var}"
  while [[ -n "$above" && ! -e "$above" ]]; do above="${above%/*}"; done
  [[ -z "$above" || -d "$above" ]] || die "$var=${!var}: $above is not a directory: give a directory (made if missing)"
done
# train_model.sh's checks alone, without runs: each run's train_model.sh would have taken them too (a
# run of no training: a RESULT line of 0 s)
[[ "${DRY_RUN:-0}" == 0 ]] || die "DRY_RUN=$DRY_RUN is train_model.sh's (it prints the trainer's command): run" \
  "train_model.sh with it; CHECK_ONLY=1 start_training.sh checks the settings"
for arg; do
  [[ "$arg" == --dry_run* || "$arg" == --nodry_run ]] && die "$arg is train_model.sh's: run train_model.sh --dry_run" \
    "(or DRY_RUN=1 train_model.sh) to print the trainer's command"
done
# one compile cache for the series: runs 1..N-1 (and reruns) load what run 0 compiled
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$OUTPUT_DIR/compile_cache}"

# REQUIRE_MOUNT=1 (the image's): OUTPUT_DIR and LOGDIR must be in a mounted folder. In a container
# without one (no -v, or one at another path) they are on the container's own filesystem: the run
# trained, said it finished (exit 0), and everything it wrote went with the container. By builtins
# (no process): a mount point of /proc/self/mountinfo at or above each, other than /, compared with
# the path resolved (mountinfo's are): as text, /output/../tmp passed as inside /output, a symbolic
# link out of a mount passed and one into a mount was refused.
# A DATA_DIR that is missing and in no mounted folder is the data's -v forgotten: train_model.sh's
# "no training file matches /data/tfrecords/part-* ... set DATA_DIR ..." named the wrong fix.
mount_of() {  # PATH (absolute): sets resolved (resolve_path's) and best, a mount point at or above it other than / (none: empty)
  local point _a _b _c _d _rest
  resolve_path "$1"
  best=
  while read -r _a _b _c _d point _rest; do
    point=${point//\\040/ } point=${point//\\011/$'\t'} point=${point//\\012/$'\n'} point=${point//\\134/\\}  # (its escapes)
    [[ "$point" != / && ( "$resolved" == "$point" || "$resolved" == "$point"/* ) ]] && best=$point
  done < "$MOUNTINFO_FILE"
}
check_mounted() {
  (( REQUIRE_MOUNT )) && [[ -r "$MOUNTINFO_FILE" ]] || return 0
  local var best shown
  for var in OUTPUT_DIR LOGDIR; do
    mount_of "${!var}"
    shown=
    [[ "$resolved" == "${!var}" ]] || shown=" (resolved: $resolved)"
    [[ -n "$best" ]] || die "$var=${!var}$shown is not in a mounted folder: what the run writes there would be lost" \
      "with the container; mount a host folder there (docker run -v \"\$PWD/out\":$resolved ...), or set REQUIRE_MOUNT=0"
  done
}
# The paths a run reads (ARGS: train_model.sh's): train_model.sh's reading of them (CHECK_ONLY=reads: a
# --input_file, --eval_input_file, --init_checkpoint or --bert_config_file given, or set by the --config
# file, over the environment's and DATA_DIR's), else (one's own TRAIN_MODEL) DATA_DIR
# where INPUT_FILES or EVAL_FILE leaves it read. A part whose folder (above any glob) is missing and in no
# mounted folder: the data's -v forgotten, named (train_model.sh's "no training file matches ... give it
# the TFRecords" named the wrong fix; a DATA_DIR that --input_file and --eval_input_file left unread was refused).
check_reads_mounted() {
  (( REQUIRE_MOUNT )) && [[ -r "$MOUNTINFO_FILE" ]] || return 0
  local reads=() i part dir top
  if [[ -z "${TRAIN_MODEL:-}" ]]; then
    # (its refusal, or a note, is said once, by its check that follows; so is a signal's end of it)
    mapfile -d '' reads < <(CHECK_ONLY=reads "$HERE/train_model.sh" "$@" 2>/dev/null; printf '%s' "$?")
    [[ "${reads[-1]}" == 0 ]] || return 0
    unset 'reads[-1]'
  elif [[ -n "${DATA_DIR:-}" && ( -z "${INPUT_FILES:-}" || -z "${EVAL_FILE:-}" ) ]]; then
    reads=("DATA_DIR=$DATA_DIR" "$DATA_DIR/part-*")
  fi
  # (each a part of a file list as the trainer splits it, or a checkpoint or config path whole:
  # train_model.sh's, so a space after a list's comma or a comma in a checkpoint's folder is no other path)
  for (( i = 0; i + 1 < ${#reads[@]}; i += 2 )); do
    part=${reads[i + 1]}
    absolute dir "$part"
    dir=${dir%%[*?[]*} dir=${dir%/*}  # its folder, above any glob
    [[ -e "${dir:-/}" ]] && continue
    mount_of "$dir"
    [[ -z "$best" ]] || continue
    top=${resolved#/} top=/${top%%/*}
    [[ "${reads[i]}" == "DATA_DIR=$DATA_DIR" ]] && die "DATA_DIR=$DATA_DIR does not exist, and no folder is" \
      "mounted at or above it: mount the host folder that holds the data (docker run -v /path/to/bert_data:$top:ro" \
      "...), or set DATA_DIR to where it is mounted"
    die "${reads[i]}: $dir does not exist, and no folder is mounted at or above it: mount the host folder that" \
      "holds it (docker run -v /path/to/it:$top:ro ...), or give its path where it is mounted"
  done
}
# PATH (absolute): sets resolved to it as `realpath -m` gives it, by builtins (a process here would be
# ended by a scheduler's signal storm, a `$(...)` left empty): `cd -P` into its deepest existing folder
# (links and `..` resolved as the kernel resolves them), then the parts that do not exist yet by text
# (a dangling link among them is taken as written: nothing can be written through it).
resolve_path() {
  local path=$1 rest= part here=$PWD
  until CDPATH='' cd -P -- "${path:-/}" 2>/dev/null; do
    [[ -n "$path" ]] || { resolved=$1; return; }
    rest=${path##*/}${rest:+/$rest}
    path=${path%/*}
  done
  resolved=$PWD
  CDPATH='' cd -- "$here" || die "cannot return to the working folder $here"
  while [[ -n "$rest" ]]; do
    part=${rest%%/*}
    if [[ "$rest" == */* ]]; then rest=${rest#*/}; else rest=; fi
    case "$part" in
      ''|.) ;;
      ..) resolved=${resolved%/*} resolved=${resolved:-/} ;;
      *) resolved=${resolved%/}/$part ;;
    esac
  done
}

if [[ -z "${DATA_DIR:-}" && -z "${INPUT_FILES:-}" ]]; then
  if (( $# )); then
    die "arguments ($*) but no DATA_DIR: set DATA_DIR (or INPUT_FILES) for a run; run without arguments for the demo"
  fi
  # the demo makes its data and runs once, with its own seed: nothing of these applies to it
  (( CHECK_ONLY == 0 )) || die "CHECK_ONLY=$CHECK_ONLY but no DATA_DIR: the built-in demo has no settings to check;" \
    "set DATA_DIR (or INPUT_FILES) to check a run's"
  [[ -z "${SEED:-}" && "$NUM_RUNS" == 1 ]] || die "SEED or NUM_RUNS set but no DATA_DIR: the built-in demo runs" \
    "once with its own seed; set DATA_DIR (or INPUT_FILES) for a run or a series"
  # a run's settings with DATA_DIR given empty (a job's DATA_DIR=$TYPO) ran the demo and exited 0
  empty=; [[ -v DATA_DIR ]] && empty=DATA_DIR; [[ -v INPUT_FILES ]] && empty="${empty:+$empty and }INPUT_FILES"
  [[ -z "$empty" ]] || die "$empty set but empty: set DATA_DIR to the folder of the TFRecords (or INPUT_FILES to" \
    "them), or unset $empty for the built-in demo"
  # (DATADIR, DATADIR_PHASE2: NVIDIA's name of DATA_DIR; their run ran the demo)
  for name in PRESET INIT_CHECKPOINT SUBMISSION_ORG SUBMISSION_PLATFORM SUBMISSION_STATUS DATADIR DATADIR_PHASE2; do
    [[ -z "${!name:-}" ]] || die "$name set but no DATA_DIR: the built-in demo takes none of a run's settings; set" \
      "DATA_DIR (or INPUT_FILES) for a run, or unset $name for the demo"
  done
  check_mounted
  launching=1
  stop_if_signalled "the demo" "$OUTPUT_DIR/demo/train"  # (where it keeps its checkpoints)
  echo "$ME: DATA_DIR is not set: running the built-in demo (python -m mlperf_bert demo)"
  cd "$HERE" || exit 2
  exec "$PYTHON" -m mlperf_bert demo "--output_dir=$OUTPUT_DIR/demo"
fi

check_mounted
check_reads_mounted "$@"
# The settings (preset, environment, a closed run's INIT_CHECKPOINT) checked once, before the first
# timed run: a mistake is train_model.sh's one error line, not a started and failed run.
if [[ -z "${TRAIN_MODEL:-}" ]]; then
  # (after a signal, or one that ended it: the first run's check says the stop)
  # (its stderr its own; bash's "Terminated" for a check a stop's signal ended goes to /dev/null: a line
  # beside the stop's, 6 of 6 at 0.02-0.2 s in)
  [[ -n "$got_signal" ]] || { CHECK_ONLY=files "$HERE/train_model.sh" "$@" 2>&3 3>&-; } 3>&2 2>/dev/null ||
    [[ -n "$got_signal" ]] || exit 2
else  # one's own script: its settings are its own to check; that it runs, ours (builtins: no process)
  command -v -- "$TRAIN_MODEL" >/dev/null && [[ ! -d "$TRAIN_MODEL" ]] || die "TRAIN_MODEL=$TRAIN_MODEL is not a" \
    "command or executable file: give the training script's path, or unset it for train_model.sh"
fi
# OUTPUT_DIR's layout against NUM_RUNS, before run 0 trains (each found only at its run, after the runs
# before it had trained) and by CHECK_ONLY=1 (it passed commands the run then refused): a series'
# folder rerun without its NUM_RUNS (any run_N folder: run_0 may have been moved away), a single run's
# folder started again as a series, a run_K folder past NUM_RUNS (a series started with more runs:
# told it was finished, its later runs left unfinished or unseen), a run_I that is not a folder (a
# file read as "finished earlier"). Builtins, and newest_checkpoint's.
check_layout() {
  local run_dir i
  if (( NUM_RUNS == 1 )); then
    for run_dir in "$OUTPUT_DIR"/run_*; do
      [[ "${run_dir##*/}" =~ ^run_(0|[1-9][0-9]{0,8})$ && -d "$run_dir" ]] || continue
      die "OUTPUT_DIR=$OUTPUT_DIR holds a series of runs (${run_dir##*/}, ...): set NUM_RUNS as" \
        "when it was started to go on with it, or use another OUTPUT_DIR for one run"
    done
    return 0
  fi
  newest_checkpoint "$OUTPUT_DIR"
  if [[ -n "$newest" || -e "$OUTPUT_DIR/run_finished.json" || -e "$OUTPUT_DIR/mlperf_log_path.json" ]]; then
    die "OUTPUT_DIR=$OUTPUT_DIR holds a single run (NUM_RUNS=1): unset NUM_RUNS to go on with it, or use another" \
      "OUTPUT_DIR for a series of $NUM_RUNS runs"
  fi
  for run_dir in "$OUTPUT_DIR"/run_*; do
    [[ "${run_dir##*/}" =~ ^run_(0|[1-9][0-9]{0,8})$ && -d "$run_dir" ]] || continue
    (( BASH_REMATCH[1] < NUM_RUNS )) || die "OUTPUT_DIR=$OUTPUT_DIR holds $run_dir, past NUM_RUNS=$NUM_RUNS: set" \
      "NUM_RUNS as when the series was started (more than ${BASH_REMATCH[1]}) to go on with it, or use another OUTPUT_DIR"
  done
  for (( i = 0; i < NUM_RUNS; i++ )); do
    run_dir="$OUTPUT_DIR/run_$i"
    [[ ! -e "$run_dir" && ! -L "$run_dir" || -d "$run_dir" ]] || die "$run_dir is not a directory: the series keeps" \
      "run $i there; move it away, or use another OUTPUT_DIR"
  done
}
check_layout
# CHECK_ONLY=1's end, once the runs' own refusals before their trainers (check_run) have passed
check_passed() {
  stop_if_signalled "the check's end" "$OUTPUT_DIR"
  [[ -n "${runs_unchecked:-}" ]] && echo "$ME: note: CHECK_ONLY=$CHECK_ONLY: PYTHON=$PYTHON cannot read the state of" \
    "the runs in $OUTPUT_DIR: their seeds, logs and end markers are left to the run's own check"
  if [[ -n "${TRAIN_MODEL:-}" ]]; then
    echo "$ME: CHECK_ONLY=$CHECK_ONLY: TRAIN_MODEL=$TRAIN_MODEL runs instead of train_model.sh: its settings are not" \
         "checked (only that it is there); no run started"
  else
    echo "$ME: CHECK_ONLY=$CHECK_ONLY: the settings pass train_model.sh's checks; no run started"
  fi
  exit 0
}

# Once a trainer has ended, what is left of its run (the verdict, the RESULT line, the log check, the
# log kept) is done with SIGTERM and SIGINT ignored (ignore_signals), by this shell and by what it starts: a scheduler
# may signal every process of the job again then (srun's --kill-on-bad-exit after another node's task
# ended 143, a second scancel). Caught, such a signal ended a `$(...)` looking for the checkpoint (a
# stopped run said "nothing saved", exit 79), and a trap run while bash read a `$(...)` misled it
# (a series said it had finished). One that comes then is not seen: a series starts its next run,
# which the scheduler's SIGKILL ends before anything of it is saved. The next run catches them again.
# (The log checker catches SIGTERM, as every command of ours: stopped, it is said to be, not failed.)
make_dirs() {  # DIR...: mkdir -p; a failure is a one-line error, unless a signal ended it (the caller's
  # stop_if_signalled says so). As `$(...)`: bash says nothing of a child a signal killed there.
  local err
  { err="$(mkdir -p "$@" 2>&1)"; } 2>/dev/null && return  # (bash's pending-trap warning: ignore_signals)
  [[ -n "$got_signal" ]] || die "${err:-mkdir -p $* failed}"
}
now() { printf -v "$1" "%($2)T" -1; }  # VAR FORMAT: the time now, as date +FORMAT (a builtin)

run_state() {  # DIR LOG [DIR LOG...]: sets run_seed (the seed its log records), run_status (its finished
  # marker's), run_cache_clear (the cache_clear its log records), run_seconds (its run_start to run_stop),
  # run_resumed (the steps its end marker's launch record says it was resumed at, "17,40"),
  # run_problem ("K WHAT": how the end marker and the log of pair K, from 0, disagree; or empty) and
  # state_rc (0: they were read; else the reader's status, all of them empty)
  local state try
  for try in 1 2 3; do
    # -S: without site (it reads the log with the standard library alone), a third of Python's start
    # (in a group with its stderr dropped: a signal pending as the `$(...)` starts, ignored by then, is
    # bash's "run_pending_traps: bad value in trap_list[15]" warning there, 2 of 100 in a storm)
    { state="$(cd "$HERE" && "$PYTHON" -S -m mlperf_bert.harness.run_state "$@" 2>/dev/null)"; } 2>/dev/null
    state_rc=$?
    (( state_rc > 128 )) || break  # 128 + N: a signal ended it (a scheduler signals every process), not the log: again
  done
  (( state_rc == 0 )) || state="- - - - -"
  run_problem=
  [[ "$state" == *$'\n'* ]] && run_problem=${state#*$'\n'}
  read -r run_seed run_status run_cache_clear run_seconds run_resumed <<<"${state%%$'\n'*}"
  [[ "$run_seed" == - ]] && run_seed=
  [[ "$run_status" == - ]] && run_status=
  [[ "$run_cache_clear" == - ]] && run_cache_clear=
  [[ "$run_seconds" == - ]] && run_seconds=
  [[ "$run_resumed" == - ]] && run_resumed=
}

say_drop() {  # WHAT CACHE_CLEAR: run_one's page cache line, ending with the cache_clear the log holds
  # (run_one's: resumed, the checkpoint a run resumes; run_cache_clear, what its log holds)
  if [[ -n "$resumed" && -n "$run_cache_clear" ]]; then
    echo "$ME: $1; the run resumes from ${resumed##*/}, whose log keeps cache_clear=$run_cache_clear from its first start"
  else
    echo "$ME: $1; logging cache_clear=$2"
  fi
}

# DIR: another start's trainer holds its lock (locking.DIR_LOCK_NAME), which this start's trainer is refused.
# (Only a held lock: one this user cannot open, another user's under umask 077, is the trainer's to
# refuse, naming its owner, locking.OutputLock; flock(1) ends 66 there, not 75.)
in_use() {
  [[ -e "$1/.mlperf_bert.lock" ]] && command -v flock >/dev/null || return 1
  flock -n -E 75 "$1/.mlperf_bert.lock" true 2>/dev/null
  (( $? == 75 ))
}

check_log() {  # LOG: the log checker on a finished run's log (CHECK_LOG=1)
  if [[ "$CHECK_LOG" == 1 && -f "$1" ]] && log_node; then
    (cd "$HERE" && "$PYTHON" -m mlperf_bert check-log "$1")
    local rc=$?
    if (( rc > 128 )); then  # a signal ended it (it catches SIGTERM, as every command does): no verdict
      echo "$ME: the log check of $1 was stopped by a signal (exit $rc); check it with: python -m mlperf_bert check-log $1"
    elif (( rc )); then
      echo "$ME: $1 does not pass the log checker"
    fi
  fi
}


# The refusals of run_one's run before anything of it is written (its state, read with a series' later
# runs for run 0, and its seed against SEED's), which CHECK_ONLY=1 makes too: check_run DIR LOG SEED NAME.
# Sets finished_before, and those run_state sets; not finished: resumed (its newest checkpoint) and
# ended (run_stopped.json there: killed after its run_stop).
check_run() {
  local dir=$1 log=$2 seed=$3 name=$4 want="SEED=$3" held fix
  (( ${run_index:-0} )) && want="$seed (SEED+$run_index)"  # (run i of a series gets SEED+i)
  resumed= ended=
  run_state "$dir" "$log" "${later_runs[@]+"${later_runs[@]}"}"
  later_runs=()
  if (( state_rc )); then
    # Unread, a run that finished earlier would look unfinished: its trainer started again, and its
    # old finished marker taken for this start's end (a RESULT line of 0 s). Signals in quick
    # succession end every try: that is a stop, before this run does anything.
    stop_if_signalled "$name" "$dir"
    # (CHECK_ONLY=1: examples/submit.sh's, with a login node's python3, which may not run it: the nodes'
    # runs read it; where train_model.sh's check ran, it ran with this PYTHON)
    if (( CHECK_ONLY )); then finished_before=0 runs_unchecked=1; return; fi
    die "cannot read the state of $name in $dir (python -S -m mlperf_bert.harness.run_state ended with status $state_rc): check PYTHON=$PYTHON"
  fi
  # A run whose end marker and log disagree (its log cut since it finished, its result_N.txt gone with
  # it; a marker's status edited): taken as finished, its log was kept as its result, which package
  # then refused (or said other than how it ended). A series' later runs are looked at with run 0
  # (later_runs), before it trains; node 0's alone (rank 0 writes the log).
  if [[ -n "$run_problem" ]] && log_node; then
    local k=$((${run_problem%% *} + ${run_index:-0}))
    (( NUM_RUNS == 1 )) && die "$name in $dir: ${run_problem#* }: put them back as the run left them, or use" \
      "another OUTPUT_DIR to run it again"
    die "run $k of $NUM_RUNS in $OUTPUT_DIR/run_$k: ${run_problem#* }: put them back as the run left them, or move" \
      "$OUTPUT_DIR/run_$k and $LOGDIR/result_$k.txt (where there) away to run run $k again"
  fi
  if [[ -n "$run_status" ]]; then
    # its seed is read from its log: under another LOGDIR there is none to compare, and none to check
    if [[ ! -f "$log" ]] && log_node; then
      # a series' run logs in its own folder, whatever LOGDIR is: there, its log was removed
      (( NUM_RUNS > 1 )) && die "$name in $dir finished earlier, but its MLPerf log $log is missing: put it back" \
        "(LOGDIR's result file of the run is a copy), or move $dir away to run it again"
      die "$name in $dir finished earlier, but its MLPerf log is not $log: rerun with the LOGDIR it had (the log's" \
        "path is in $dir/mlperf_log_path.json), or use another OUTPUT_DIR for a new run"
    fi
    if [[ -n "$seed" && -n "$run_seed" && "$seed" != "$run_seed" ]]; then
      die "$name in $dir finished earlier with seed $run_seed, not $want: use another OUTPUT_DIR for a new run"
    fi
    finished_before=1
    status=0
    # Ours compares this command's settings with the finished run's (trainer/preflight.py
    # finished_before): the same have nothing to do, others are refused in one line; its ranks meet
    # as a run's do, and rank 0 decides for every node.
    return
  fi
  finished_before=0
  # a checkpoint there: the trainer resumes it, and the log goes on from it (its first lines kept)
  newest_checkpoint "$dir"
  resumed=$newest
  # killed after its run_stop (run_stopped.json): the trainer writes what was left, trains nothing
  [[ -f "$dir/run_stopped.json" ]] && ended=1
  # Either goes on with the seed it started with (its checkpoint's; the last its log records), which
  # the trainer compared with another SEED's only after STARTING TIMING RUN, the page cache dropped
  # (preflight.check_resume, check_stopped), and its status 2 said "rerun the same command to resume".
  if [[ -n "$seed" && -n "$run_seed" && "$seed" != "$run_seed" ]] && [[ -n "$resumed" || -n "$ended" ]]; then
    held="${resumed##*/}"
    [[ -n "$held" ]] || held=run_stopped.json
    # (a later run of a series is checked only once run 0 passed, SEED being its seed: this run's
    # seed is no SEED+i, so the series was started without SEED, each run drawing its own)
    if (( ${run_index:-0} )); then
      fix="SEED unset, as the series was started (each run keeps its own seed),"
    elif [[ "$run_seed" =~ ^[0-9]{1,18}$ ]]; then
      fix="SEED=$run_seed"
    else
      fix="the SEED it was started with"
    fi
    die "$name in $dir was started with seed $run_seed ($held holds it), not $want: rerun with $fix to go on" \
      "with it, or use another OUTPUT_DIR for a new run"
  fi
}

# One timed run: run_one DIR LOGDIR SEED NAME ("the run", "run 1 of 10") TRAIN_MODEL_ARGS... Sets
# status, elapsed, finished_before, run_seed and run_status; prints one line when the run stops
# or fails; when it finishes or had finished earlier, the caller says so.
run_one() {
  local dir=$1 logdir=$2 seed=$3 name=$4 log="$2/mlperf.log" start start_fmt end end_fmt ckpt resumed ended fix oom_before oom
  shift 4
  launching=
  [[ -n "$got_signal" ]] || catch_signals  # (after one, the next are ignored until the stop)
  check_run "$dir" "$log" "$seed" "$name"
  if (( finished_before )) && [[ -n "${TRAIN_MODEL:-}" ]]; then
    # a trainer of one's own: its settings are not ours to compare
    ignore_signals  # what is left of a run that ended earlier (its log kept), as after a trainer's end
    return
  fi
  make_dirs "$dir" "$logdir"
  # Another start's trainer on this folder holds its lock (locking.DIR_LOCK_NAME): this start's
  # trainer would be refused, but only after this drop of the page cache under that timed run
  if in_use "$dir"; then
    stop_if_signalled "$name" "$dir"
    die "$dir is in use by another run (its trainer holds $dir/.mlperf_bert.lock): wait for it to end, or use" \
      "another OUTPUT_DIR"
  fi
  # The out-of-memory killer's count in our memory control group (fileio.oom_kills; empty: not readable),
  # to say after a SIGKILL whether the memory limit ended the trainer (a trainer run alone says nothing)
  { oom_before="$(cd "$HERE" && "$PYTHON" -S -m mlperf_bert.fileio oom_kills 2>/dev/null)"; } 2>/dev/null
  launching=1
  stop_if_signalled "$name" "$dir"  # nothing of the run started: no trainer to stop
  now start %s
  now start_fmt '%Y-%m-%d %r'
  (( finished_before )) || echo "STARTING TIMING RUN AT $start_fmt"

  # The trainer logs cache_clear (first line of its log) true only when MLPERF_CACHE_CLEARED says
  # that this drop succeeded; a resumed run's log keeps its first start's line, and says so.
  local cleared=False
  if [[ "$DROP_CACHES" == 0 ]] || (( finished_before )); then
    :  # asked for, or nothing to time: nothing to say
  elif [[ "$DROP_CACHES" == auto && "$EUID" != 0 ]]; then
    say_drop "not root: the page cache is not dropped (run as root; a container with --privileged)" False
  elif { sync && echo 3 > "$DROP_CACHES_FILE"; } 2>/dev/null; then  # (nor bash's "Terminated" of a killed sync)
    cleared=True
    say_drop "dropped the page cache (sync; echo 3 > $DROP_CACHES_FILE)" True
  else
    stop_if_signalled "$name" "$dir"  # a signal ended sync: a stop, not a file we cannot write
    fix="run the container with --privileged"
    [[ "$EUID" == 0 ]] || fix="not root; run as root, in a container with --privileged"  # (as a user: --privileged was the advice)
    say_drop "cannot drop the page cache ($DROP_CACHES_FILE is not writable: $fix)" False
  fi
  OUTPUT_DIR="$dir" LOGDIR="$logdir" SEED="$seed" MLPERF_CACHE_CLEARED=$cleared \
    "${TRAIN_MODEL:-$HERE/train_model.sh}" "$@" &
  child=$!
  [[ -n "$got_signal" ]] && pass_on  # arrived before $child was known
  interrupted=
  # (stderr dropped: bash's own report of a child a signal killed, "line N: PID Killed  OUTPUT_DIR=...",
  # the line below says it)
  wait "$child" 2>/dev/null
  status=$?
  # `wait` returns early (128 + the signal) when a trapped signal arrives (on_signal then runs): wait
  # again for the trainer's own exit status, also when it has ended meanwhile (bash keeps it; an older
  # bash may say 127, not a child, when the signal came after the wait that returned it)
  while [[ -n "$interrupted" ]]; do
    interrupted=
    wait "$child" 2>/dev/null
    again=$?
    (( again == 127 )) || status=$again
  done
  # Under signals in quick succession the loop can end on a 128 + N of bash's own (a finished run
  # said "stopped"): the trainer's status, asked again with the signals ignored; the first answer may
  # still be a signal bash noted before (a status that stays 128 + N is the trainer's)
  ignore_signals
  for try in 1 2 3; do
    wait "$child" 2>/dev/null
    again=$?
    (( again > 128 && again < 256 )) || break
  done
  (( again == 127 )) || status=$again
  child=
  now end %s
  now end_fmt '%Y-%m-%d %r'
  elapsed=$(( end - start ))
  if (( status < 0 || status > 255 )); then
    # bash 5.2's `wait` can lose the status of a child that ends as a trapped signal arrives (-1,
    # then at every later wait): the run's files say how it ended, the finished marker or the stop
    signal_status
    [[ -f "$dir/run_finished.json" ]] && status=0 || status=$sig_status
  fi

  if (( finished_before )); then
    (( status == 0 )) && return
    if [[ -n "$got_signal" ]]; then  # the run it found stays finished: a stop of this check alone
      signal_status
      echo "$ME: $name finished earlier; stopped by SIG$got_signal while its settings were compared; rerun the same command to go on"
      exit "$sig_status"
    fi
    exit "$status"  # its refusal is its one line above
  fi
  if (( status == 0 )); then
    run_state "$dir" "$log"
    echo "ENDING TIMING RUN AT $end_fmt"
    # <seconds>: this invocation's, as the reference's run_and_time.sh counts (init included). What
    # MLPerf scores is the log's run_start to run_stop: for a run stopped and resumed, the RESULT
    # line says so, and that span, which holds every invocation and the pauses between them.
    local note=
    if [[ -n "$ended" ]]; then
      note=",ended earlier at its run_stop: $elapsed s counts this invocation only (it wrote what was left and trained nothing); MLPerf scores the log's run_start to run_stop: ${run_seconds:-?} s"
      # resumed by an earlier invocation (killed after its run_stop since): that span holds the pause too
      # (no comma: the RESULT line's fields are comma-separated)
      [[ -n "$run_resumed" ]] && note+=" over every invocation of the run and the pauses between them (resumed at step ${run_resumed//,/ and step })"
    elif [[ -n "$resumed" ]]; then
      note=",resumed from ${resumed##*/}: $elapsed s counts this invocation only; MLPerf scores the log's run_start to run_stop: ${run_seconds:-?} s over every invocation of the run and the pauses between them"
    fi
    # the user, as the reference's run_and_time.sh gives it
    echo "RESULT,bert,${run_seed:-$seed},$elapsed,$(id -un 2>/dev/null || id -u),$start_fmt$note"
    return
  fi
  newest_checkpoint "$dir"
  ckpt=$newest
  # A stop, as the training's status says (not only ours: a scheduler may signal the whole job, a
  # terminal's Ctrl-C the trainer too): 143 (130) a checkpoint holds it, NOT_SAVED nothing was saved
  # yet. Any other status is a failure, even with a signal: the stop did not end as asked.
  local stopped=
  case "$status" in
    143) stopped=SIGTERM ;;
    130) stopped=SIGINT ;;
    "$NOT_SAVED") stopped="a signal" ;;
  esac
  # ours, when we got one: the first decides (a SIGINT goes on as SIGINT, then SIGTERM)
  [[ -n "$stopped" && -n "$got_signal" ]] && stopped="SIG$got_signal"
  if [[ -f "$dir/run_stopped.json" ]]; then  # (trainer/checkpoint.py's STOPPED: written at run_stop)
    echo "$ME: $name ended at its run_stop (its log $log is complete) but ended with status $status after" \
         "$elapsed s, before its end was written (see above): rerun the same command to finish it; nothing is" \
         "trained again"
  elif [[ -n "$stopped" && -n "$ckpt" ]]; then
    (( status == NOT_SAVED )) && status=143  # stopped before it trained: the checkpoint holds all of it
    [[ -n "$got_signal" ]] && signal_status && status=$sig_status
    echo "$ME: $name stopped by $stopped after $elapsed s: $ckpt holds it; rerun the same command to resume"
  elif [[ -n "$stopped" ]]; then  # also 143 from a trainer the signal killed before its handlers
    status=$NOT_SAVED
    if log_node; then
      echo "$ME: $name stopped by $stopped after $elapsed s, before its first checkpoint: nothing saved (exit $NOT_SAVED, not 143); rerun the same command to start it again"
    else
      echo "$ME: $name stopped by $stopped after $elapsed s: $NODE0_TELLS"
    fi
  else
    # 128 + N: a signal ended it or a rank (a trainer run alone, one process, killed says nothing itself)
    local why="see above"
    (( status > 128 && status < 193 )) && why+="; $status = 128 + SIG$(kill -l $((status - 128)) 2>/dev/null)"
    if (( status == 137 )) && [[ "$oom_before" =~ ^[0-9]+$ ]]; then
      { oom="$(cd "$HERE" && "$PYTHON" -S -m mlperf_bert.fileio oom_killed "$oom_before" 2>/dev/null)"; } 2>/dev/null
      [[ -n "$oom" ]] && why+=", $oom"
    fi
    if in_use "$dir"; then  # (two starts at once, both past the check before: the checkpoints are the other's)
      echo "$ME: $name failed with status $status after $elapsed s ($why): $dir is in use by another run (its" \
           "trainer holds $dir/.mlperf_bert.lock): wait for it to end, or use another OUTPUT_DIR"
    elif [[ -n "$ckpt" ]]; then
      echo "$ME: $name failed with status $status after $elapsed s ($why): $ckpt holds it; fix the cause and rerun the same command to resume"
    else
      echo "$ME: $name failed with status $status after $elapsed s ($why)"
    fi
  fi
}

if (( NUM_RUNS == 1 )); then
  if (( CHECK_ONLY )); then
    check_run "$OUTPUT_DIR" "$LOGDIR/mlperf.log" "${SEED:-}" "the run"
    check_passed
  fi
  run_one "$OUTPUT_DIR" "$LOGDIR" "${SEED:-}" "the run" "$@"
  if (( finished_before )); then
    echo "$ME: the run in $OUTPUT_DIR finished earlier (${run_status}${run_seed:+, seed $run_seed}): nothing to do;" \
         "its log is $LOGDIR/mlperf.log; use another OUTPUT_DIR for a new run"
  elif (( status == 0 )); then
    echo "$ME: the run finished${run_status:+ ($run_status)} in $elapsed s: $LOGDIR/mlperf.log"
    check_log "$LOGDIR/mlperf.log"
  fi
  exit "$status"
fi

# A submission's runs, one after the other: run i in $OUTPUT_DIR/run_i with its own seed (SEED+i
# when SEED is set, else the trainer's random one, kept in its checkpoints), its log copied to
# $LOGDIR/result_i.txt once the run has finished.
# (OUTPUT_DIR's layout: check_layout) a result_I.txt that is not run I's log (another series' in a
# shared LOGDIR, or run I's folder changed since: removed, its log cut), checked before run 0 trains.
for (( i = 0; i < NUM_RUNS; i++ )); do
  run_dir="$OUTPUT_DIR/run_$i"
  result="$LOGDIR/result_$i.txt"
  # a result_i.txt that is not this run's log: copied over, it was lost
  if log_node && [[ -f "$result" ]] && ! cmp -s -- "$result" "$run_dir/mlperf.log" 2>/dev/null; then
    stop_if_signalled "run 0 of $NUM_RUNS" "$OUTPUT_DIR/run_0"  # (a signal ended cmp)
    if [[ -f "$run_dir/mlperf.log" ]]; then what="differs from it"; else what="is missing"; fi
    [[ "$LOGDIR" == "$OUTPUT_DIR" ]] && die "$result is the log of run $i of the series in $OUTPUT_DIR, but" \
      "$run_dir/mlperf.log $what (the run's folder changed since it finished): put $run_dir back as it was, or" \
      "move both away to run run $i again"
    die "$result is not the log of run $i of the series in $OUTPUT_DIR ($run_dir/mlperf.log $what): LOGDIR=$LOGDIR" \
      "holds another series' results, or $run_dir changed since it finished; give each series its own LOGDIR," \
      "or put $run_dir back as it was"
  fi
done
# run 0's state is read with the later runs' (one process): one whose end marker and log disagree is
# refused before run 0 trains
later_runs=()
for (( i = 1; i < NUM_RUNS; i++ )); do later_runs+=("$OUTPUT_DIR/run_$i" "$OUTPUT_DIR/run_$i/mlperf.log"); done
if (( CHECK_ONLY )); then  # each run there, as the series comes to it (a later one's refusal: after run 0 trained)
  for (( i = 0; i < NUM_RUNS; i++ )); do
    (( i == 0 )) || [[ -d "$OUTPUT_DIR/run_$i" ]] || continue
    run_index=$i
    check_run "$OUTPUT_DIR/run_$i" "$OUTPUT_DIR/run_$i/mlperf.log" "${SEED:+$((SEED + i))}" "run $i of $NUM_RUNS"
  done
  check_passed
fi
make_dirs "$LOGDIR"
# the later runs start only with run 0's settings, its seed aside (the trainer compares them with its
# finished marker: trainer/preflight.py's check_series)
export MLPERF_SERIES_RUN0="$OUTPUT_DIR/run_0"
for (( i = 0; i < NUM_RUNS; i++ )); do
  stop_if_signalled "run $i of $NUM_RUNS" "$OUTPUT_DIR/run_$i"
  run_dir="$OUTPUT_DIR/run_$i"
  result="$LOGDIR/result_$i.txt"  # (checked above: absent, or this run's log)
  run_index=$i
  run_one "$run_dir" "$run_dir" "${SEED:+$((SEED + i))}" "run $i of $NUM_RUNS" "$@"
  (( status == 0 )) || exit "$status"
  seeds+=("${run_seed:-?}")
  if ! log_node; then
    echo "$ME: run $i of $NUM_RUNS finished on node $NODE_RANK; node 0 keeps its log as result_$i.txt"
    continue
  fi
  if [[ ! -f "$result" ]] || (( ! finished_before )); then
    # under a name of its own (two starts on one series), renamed when complete; a full or read-only
    # LOGDIR: one line naming the file (cp's own was two raw lines, a partial .tmp left)
    tmp="$LOGDIR/.result_$i.txt.tmp-$$"
    if ! { err="$(cp -- "$run_dir/mlperf.log" "$tmp" 2>&1 && mv -f -- "$tmp" "$result" 2>&1)"; } 2>/dev/null; then
      rm -f -- "$tmp"
      die "cannot write $result: ${err##*: }; run $i is finished and kept in $run_dir: free space" \
        "(or fix the disk), then rerun the same command"
    fi
  fi
  if (( finished_before )); then
    echo "$ME: run $i of $NUM_RUNS finished earlier ($run_status, seed ${run_seed:-?}): $result"
  else
    echo "$ME: run $i of $NUM_RUNS finished${run_status:+ ($run_status)} in $elapsed s: $result"
    check_log "$run_dir/mlperf.log"
  fi
done
echo "$ME: the series of $NUM_RUNS runs in $OUTPUT_DIR is finished (seeds ${seeds[*]}): $LOGDIR/result_0.txt" \
     "... result_$((NUM_RUNS - 1)).txt"
exit 0
