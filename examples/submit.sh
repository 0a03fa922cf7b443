#!/bin/bash
# usage: examples/submit.sh [sbatch options] [-- trainer flags]
# Checks a multi-node job's settings and files here, before it waits for nodes (the job's own
# checks, SBATCH_CHECK_ONLY=1, with the paths as this host sees them; start_training.sh's and
# train_model.sh's over the job's --nodes; a --time within the job's warning before its limit
# refused), then submits examples/slurm_multinode.sbatch with sbatch, from the repository root.
# JOB_SCRIPT: another job
# script (examples/slurm_multinode_pyxis.sbatch: the image, with pyxis/enroot). GPUS_PER_NODE, when
# set, is also the job's --gpus-per-node (0: a CPU run, e.g. PRESET=demo_cpu). The settings are the
# job script's (its header; docs/running.md, "SLURM"), e.g.
#   SUBMISSION_ORG=ORG SUBMISSION_PLATFORM=NAME DATA_DIR=/data/tfrecords \
#     INIT_CHECKPOINT=/data/tf1_ckpt/model.ckpt-28252 examples/submit.sh --nodes=4 --time=8:00:00
#   PRESET=demo_cpu GPUS_PER_NODE=0 NUM_RUNS=1 DATA_DIR=demo_out/tfrecords examples/submit.sh \
#     --cpus-per-task=4 -- --max_samples_termination=4096
set -euo pipefail
# (CDPATH='': a CDPATH made cd go to another folder's examples/, and print it: HERE was two lines)
HERE="$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
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
[[ -n "${GPUS_PER_NODE:-}" ]] && opts=("--gpus-per-node=$GPUS_PER_NODE" ${opts[@]+"${opts[@]}"})

# The job script's #SBATCH options, as sbatch reads them: those before its first command (a
# line neither blank nor a comment), each line's words up to a "#" (a comment), quotes removed.
script_opts=()
while IFS= read -r line || [[ -n "$line" ]]; do
  [[ "$line" =~ ^[[:space:]]*(#|$) ]] || break
  [[ "$line" =~ ^#SBATCH(.*)$ ]] || continue
  read -r -a words <<< "${BASH_REMATCH[1]}"
  for w in ${words[@]+"${words[@]}"}; do
    w="${w//[\"\']/}"
    [[ "$w" == *\#* ]] && { [[ -n "${w%%#*}" ]] && script_opts+=("${w%%#*}"); break; }
    script_opts+=("$w")
  done
done < "$JOB_SCRIPT"
# The last of an option in the words given (--NAME=V, --NAME V, -S V, -SV); sets opt (or empty).
last_opt() {  # NAME SHORT WORD...
  local name="$1" short="$2" i
  shift 2
  local a=("$@")
  opt=
  for (( i = 0; i < ${#a[@]}; i++ )); do
    case "${a[i]}" in
      "--$name="*) opt="${a[i]#*=}" ;;
      "--$name") opt="${a[i + 1]:-}" ;;
      "-$short") [[ -n "$short" ]] && opt="${a[i + 1]:-}" ;;
      "-$short"?*) [[ -n "$short" ]] && opt="${a[i]#-"$short"}" ;;
    esac
  done
  return 0
}
# An sbatch option as sbatch will read it: the options given, else the environment's SBATCH_
# variable, else the job script's; sets opt (or empty).
sbatch_opt() {  # NAME SHORT ENV
  last_opt "$1" "$2" ${opts[@]+"${opts[@]}"}
  [[ -n "$opt" ]] && return
  [[ -n "$3" && -n "${!3:-}" ]] && { opt="${!3}"; return; }
  last_opt "$1" "$2" ${script_opts[@]+"${script_opts[@]}"}
}
# The time limit against the warning the job script asks for before it (--signal=B:USR1@600): a
# limit within it sends the warning at once, every run stops at the start (and with
# REQUEUE_AT_TIME_LIMIT=1 requeues, to be stopped again, without end).
seconds_of() {  # a SLURM time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S): sets secs; 1: not one
  local t="$1" d=0 f
  [[ "$t" =~ ^[0-9]{1,7}(-[0-9]{1,7})?(:[0-9]{1,7}){0,2}$ ]] || return 1
  [[ "$t" == *-* ]] && { d=$((10#${t%%-*})); t="${t#*-}"; }
  IFS=: read -r -a f <<< "$t"
  if (( d )) || [[ "$1" == *-* ]]; then  # D-H[:M[:S]]
    secs=$(( d * 86400 + 10#${f[0]} * 3600 + 10#${f[1]:-0} * 60 + 10#${f[2]:-0} ))
  else
    case ${#f[@]} in
      1) secs=$(( 10#${f[0]} * 60 )) ;;
      2) secs=$(( 10#${f[0]} * 60 + 10#${f[1]} )) ;;
      *) secs=$(( 10#${f[0]} * 3600 + 10#${f[1]} * 60 + 10#${f[2]} )) ;;
    esac
  fi
}
sbatch_opt time t SBATCH_TIMELIMIT
time_limit="$opt"
sbatch_opt signal "" SBATCH_SIGNAL
lead=60  # sbatch's default @sig_time
[[ "$opt" == *@* ]] && lead="${opt##*@}"
warning="${opt%%@*}"
warning="${warning##*:}"  # [R][B:]SIGNAL: USR1, SIGUSR1 (in any case) or its number, 10
warning="${warning^^}"
[[ "$warning" =~ ^[0-9]{1,7}$ ]] && (( 10#$warning == 10 )) && warning=USR1
if [[ -n "$time_limit" && "$warning" =~ ^(SIG)?USR1$ && "$lead" =~ ^[0-9]{1,7}$ ]] && seconds_of "$time_limit" \
    && (( secs > 0 && secs <= 10#$lead )); then
  die "--time=$time_limit ($secs s) is within the $lead s before the limit at which SLURM's warning" \
      "(--signal=$opt) stops the runs: each would stop as it starts (and with REQUEUE_AT_TIME_LIMIT=1 requeue" \
      "again and again); give a --time above $(( (10#$lead + 59) / 60 )) minutes"
fi
# The job's shape as its nodes will see it, for its checks here (the world the batch is split over):
# a node count sbatch may choose from a range is left to the job.
check_env=(SBATCH_CHECK_ONLY=1 SBATCH_CHECK_FILES=1 "ME=$(basename "$JOB_SCRIPT")")
sbatch_opt nodes N SBATCH_NUM_NODES
[[ "$opt" =~ ^[0-9]{1,6}$ ]] && check_env+=("SBATCH_CHECK_NNODES=$opt")
sbatch_opt gpus-per-node "" SBATCH_GPUS_PER_NODE
[[ -n "$opt" ]] && check_env+=("SLURM_GPUS_PER_NODE=$opt")
# Settings given as sbatch's --export=ALL,NAME=VALUE,... (or SBATCH_EXPORT) are the job's: checked as
# such (they were this host's, so a DATA_DIR given there was "set DATA_DIR"). Split as sbatch splits
# them: at commas outside quotes (a ' and a " each counted apart), an item wholly quoted unquoted. Any
# --export but ALL alone (NONE, a list NAME=VALUE,NAME with or without ALL), or --get-user-env, starts
# the job in this user's login environment (slurmd's `su - USER`, the profile read; sbatch sets
# get_user_env for each, as seen under Slurm 22.05) with the job's variables over it: a list without ALL
# gives the job those (NAME: this host's value) and the SLURM_ ones; with ALL, this host's whole
# environment. Checked so: with this host's, a PRESET or DATA_DIR it alone had passed a job that its
# nodes then refused; without the profile's, one the profile sets was refused.
sbatch_opt export "" SBATCH_EXPORT
exported=() rest="$opt" all=1 environ=" $(compgen -e | tr '\n' ' ') "  # (the names this host exports)
[[ -n "$opt" ]] && all=0
user_env=0
[[ -n "$opt" && "${opt^^}" != ALL || -n "${SBATCH_GET_USER_ENV:-}" ]] && user_env=1
for o in ${opts[@]+"${opts[@]}"} ${script_opts[@]+"${script_opts[@]}"}; do [[ "$o" == --get-user-env* ]] && user_env=1; done
while [[ -n "$rest" ]]; do
  item= single=0 double=0
  while [[ -n "$rest" ]]; do
    c="${rest:0:1}" rest="${rest:1}"
    [[ "$c" == , ]] && (( !single && !double )) && break
    [[ "$c" == "'" ]] && single=$(( !single ))
    [[ "$c" == '"' ]] && double=$(( !double ))
    item+="$c"
  done
  [[ "$item" =~ ^([\'\"])(.*)([\'\"])$ && "${BASH_REMATCH[1]}" == "${BASH_REMATCH[3]}" ]] && item="${BASH_REMATCH[2]}"
  if [[ "${item^^}" == ALL ]]; then
    all=1
  elif [[ "$item" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
    exported+=("$item")
  elif [[ "$item" =~ ^[A-Za-z_][A-Za-z0-9_]*$ && "$environ" == *" $item "* ]]; then
    exported+=("$item=${!item}")
  fi
done
if (( user_env )); then
  for name in $environ; do
    (( all )) || [[ "$name" == SLURM_* ]] && exported=("$name=${!name}" ${exported[@]+"${exported[@]}"})
  done
  exported=(-i "HOME=${HOME:-/}" "USER=${USER:-}" "LOGNAME=${LOGNAME:-${USER:-}}" bash -l -c 'exec env "$@"' login
            ${exported[@]+"${exported[@]}"})
fi
env ${exported[@]+"${exported[@]}"} "${check_env[@]}" bash "$JOB_SCRIPT" ${flags[@]+"${flags[@]}"} || exit 2
command -v sbatch > /dev/null || die "no sbatch here: run this on a SLURM login node"
exec sbatch ${opts[@]+"${opts[@]}"} "$JOB_SCRIPT" ${flags[@]+"${flags[@]}"}
