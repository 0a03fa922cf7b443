"""examples/slurm_multinode.sbatch and examples/submit.sh with stand-ins for srun, scontrol and
sbatch (the real SLURM: ``make slurm-test``, tests/slurm/check_slurm.py). The srun stand-in runs
each node's task at once in a process group of its own and, as --kill-on-bad-exit does, sends the
other tasks' groups SIGTERM when one fails (SLURM signals every process of a task)."""
import contextlib
import os
import re
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(ROOT, "examples", "slurm_multinode.sbatch")
SUBMIT = os.path.join(ROOT, "examples", "submit.sh")

SRUN = r"""#!/bin/bash
ntasks="${SLURM_NTASKS:-$SLURM_NNODES}"  # (the job's, as srun reads it, unless --ntasks says otherwise)
while [[ "$1" == -* ]]; do [[ "$1" == --ntasks=* ]] && ntasks="${1#*=}"; shift; done
pids=()
for (( t = 0; t < ntasks; t++ )); do  # the tasks spread over the nodes, as many on each
  SLURM_NODEID=$(( t * SLURM_NNODES / ntasks )) setsid "$@" &
  pids+=($!)
done
term_all() { for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done; }
echo "${pids[*]}" > "$FAKE_RECORD.pids"  # (for the scancel stand-in)
term_batch() {  # the batch shell: the outermost of the script's processes (run_on_nodes's subshell is one too)
  p=$PPID
  until [[ "$(tr '\0' ' ' < /proc/$p/cmdline)" == *slurm_multinode.sbatch* ]]; do p=$(ps -o ppid= -p "$p"); done
  while q=$(ps -o ppid= -p "$p") && [[ "$(tr '\0' ' ' < /proc/${q// /}/cmdline)" == *slurm_multinode.sbatch* ]]; do
    p=${q// /}
  done
  kill -TERM "$p"
}
if [[ -n "${FAKE_SCANCEL:-}" ]]; then  # once every node has started
  until [[ -f "$FAKE_RECORD" ]] && (( $(wc -l < "$FAKE_RECORD") == SLURM_NNODES )); do sleep 0.05; done
  if [[ "$FAKE_SCANCEL" == plain ]]; then
    # a plain scancel (or scontrol requeue): SIGTERM to the batch shell and to srun too, which
    # then ends at once, its tasks still stopping
    term_batch
    term_all
    exit 143
  elif [[ "$FAKE_SCANCEL" == batch ]]; then  # scancel --batch --signal=TERM: the batch shell alone
    term_batch
  else
    term_all
  fi
fi
worst=0
if [[ -n "${FAKE_LOST:-}" ]]; then  # node FAKE_LOST lost once every node has started: its task gone, no status
  until [[ -f "$FAKE_RECORD" ]] && (( $(wc -l < "$FAKE_RECORD") == SLURM_NNODES )); do sleep 0.05; done
  kill -KILL -- "-${pids[FAKE_LOST]}"
  # its status now: once bash has reported the job ("Killed", sooner on a busy machine), `wait -n` no longer
  # sees it, and the loop's last wait said 127 (no child)
  wait "${pids[FAKE_LOST]}"
  worst=$? gone=1
  [[ -n "${FAKE_LOST_TERM:-}" ]] && term_batch  # the job ended (a requeue after the node failure): SIGTERM
  term_all
fi
# each task's status, the first to fail ending the others: `wait -n` sees only the jobs bash still holds, and
# tasks that ended together (a busy machine) may be held no longer ("srun 127", every node 0); `wait PID`
# then gives each one's saved status
left=("${pids[@]}")
[[ -n "${gone:-}" ]] && unset 'left[FAKE_LOST]'
while (( ${#left[@]} )); do
  done_pid=
  wait -n -p done_pid "${left[@]}"
  s=$?
  if [[ -z "$done_pid" ]]; then
    for p in "${left[@]}"; do wait "$p"; s=$?; (( s > worst )) && worst=$s; done
    break
  fi
  for i in "${!left[@]}"; do [[ "${left[i]}" == "$done_pid" ]] && unset 'left[i]'; done
  (( s > worst )) && worst=$s
  (( s )) && term_all
done
exit "$worst"
"""
# a node: FAKE_<rank>=STATUS:SECONDS exits STATUS after SECONDS, whatever it is sent; else it runs
# until SIGTERM -> 143. Its trap ends the sleep itself: a group's SIGTERM that came as bash forked it
# reached bash alone (bash blocks the signal from just before fork(), and the child's pending set
# starts empty), and the sleep held the job's pipe 60 s (13 of 5,000 in loops of the script alone; 0 of 3,000)
START = r"""#!/bin/bash
echo "$NODE_RANK $MASTER_ADDR $MASTER_PORT $NUM_GPUS $*" >> "$FAKE_RECORD"
v="FAKE_$NODE_RANK"
if [[ -n "${!v:-}" ]]; then trap '' TERM; sleep "${!v#*:}"; exit "${!v%%:*}"; fi
trap 'kill $! 2>/dev/null; sleep "${FAKE_STOP_SECONDS:-0}"; exit 143' TERM
sleep "${FAKE_RUN_SECONDS:-60}" >/dev/null 2>&1 &
wait
"""


@pytest.fixture
def job(tmp_path):
    bin_dir, cwd = tmp_path / "bin", tmp_path / "submit"
    bin_dir.mkdir()
    cwd.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", 'printf "n1\\nn2\\n"\n'),
                       # the job's step is there; its lines written apart, as a real squeue may write them (a
                       # reader that ends at its first line then fails its second write: SIGPIPE)
                       ("squeue", '[[ "$*" == *%T* ]] && { echo "${FAKE_JOB_STATE:-RUNNING}"; exit; }\n'
                                  'echo 40007.0\nsleep 0.05\necho 40007.batch\n'),
                       ("sbatch", '#!/bin/bash\necho "sbatch $*" >> "$FAKE_RECORD"\necho "Submitted batch job 7"\n'),
                       # a node SLURM has down, not responding: FAKE_DOWN (sinfo -h -N -n NODE -o %t)
                       ("sinfo", '[[ -n "${FAKE_DOWN:-}" && "$*" == *" $FAKE_DOWN "* ]] && echo "down*" || echo alloc\n'),
                       # scancel --signal=TERM JOBID: SIGTERM to every task's group (the srun stand-in's pids)
                       ("scancel", 'echo "scancel $*" >> "$FAKE_RECORD.scancel"\n'
                                   'for p in $(cat "$FAKE_RECORD.pids"); do kill -TERM -- "-$p" 2>/dev/null; done\n')):
        (bin_dir / name).write_text(body if body.startswith("#!") else "#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (cwd / "start_training.sh").write_text(START)
    (cwd / "start_training.sh").chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "FAKE_", "SBATCH"))
           and k not in ("PRESET", "DATA_DIR", "INPUT_FILES", "EVAL_FILE", "MASTER_PORT", "GPUS_PER_NODE",
                         "EXTRA_FLAGS", "OUTPUT_DIR", "SUBMISSION_ORG", "SUBMISSION_PLATFORM", "SUBMISSION_STATUS",
                         "INIT_CHECKPOINT")}
    env.update(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), SLURM_NNODES="2", SLURM_JOB_NODELIST="n[1-2]",
               SLURM_JOB_ID="40007", PRESET="demo_cpu", GPUS_PER_NODE="0", DATA_DIR=str(data),
               FAKE_RECORD=str(tmp_path / "record"))

    def run(*args, script=SBATCH, **extra):
        proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, env=dict(env, **extra),
                              cwd=str(cwd), timeout=60)
        record = (tmp_path / "record").read_text().splitlines() if (tmp_path / "record").exists() else []
        return proc, record
    run.data = data
    return run


@pytest.mark.parametrize("case,status,last", [
    # node 1 refuses its settings at once; node 0 then gets --kill-on-bad-exit's SIGTERM (143)
    (dict(FAKE_1="2:0.2"), 2, "node 1 failed first, with status 2 (node 0 (%s) 143 node 1 (%s) 2; srun 143)"),
    # node 1's rank killed (137); node 0's rank, which lost its peer (75), ended first
    (dict(FAKE_0="75:0.1", FAKE_1="137:0.6"), 137, "node 1 failed first, with status 137 "
                                                   "(node 0 (%s) 75 node 1 (%s) 137; srun 137)"),
    # scancel --signal=TERM: every node stopped (its run checkpointed)
    (dict(FAKE_SCANCEL="1"), 143, "stopped: status 143 (node 0 (%s) 143 node 1 (%s) 143; srun 143)"),
    # scancel --signal=TERM before the ranks trained: every node stopped with nothing saved (a review: "node 0
    # failed first, with status 79")
    (dict(FAKE_0="79:0.1", FAKE_1="79:0.3"), 79, "stopped before anything was saved (resubmit the same job to start "
                                                 "the runs): status 79 (node 0 (%s) 79 node 1 (%s) 79; srun 79)"),
], ids=["config-error", "rank-killed", "scancel-TERM", "scancel-before-training"])
def test_the_job_exits_with_the_first_failing_nodes_status(job, case, status, last):
    """Issue 45 (2): under --kill-on-bad-exit a configuration error on one node ended the job 143,
    the SIGTERM the other node then got, the documented "stopped, resume" status (a script that
    resubmits on 143 loops on it). The job's status is the node that failed first, not one that
    only followed it (143, or 75: lost its peer); every node 143 is a stop."""
    proc, record = job("--num_workers=3", **case)
    host = socket.gethostname()
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "slurm_multinode.sbatch: " + last % (host, host), proc.stdout
    # both nodes ran, each with its rank, the first node's address and the job's port, on the CPU
    assert sorted(record) == ["%d n1 %d 1 --preset=demo_cpu --device=cpu --num_workers=3" % (n, 20000 + 40007 % 20000)
                              for n in (0, 1)]


def test_submit_checks_the_settings_before_sbatch(job, tmp_path):
    """Issue 45 (3): a mistake is said before the job waits for nodes: submit.sh runs the job's
    checks with the paths as the login node sees them, and calls sbatch only when they pass (with
    GPUS_PER_NODE as --gpus-per-node, sbatch's options before --, trainer flags after it)."""
    proc, record = job("--time=30", "--", "--num_workers=3", script=SUBMIT)
    assert proc.returncode == 2 and record == [], proc.stdout + proc.stderr
    assert proc.stderr == "error: slurm_multinode.sbatch: DATA_DIR=%s holds no part-* TFRecords: set DATA_DIR to " \
                          "the folder make-dataset wrote\n" % job.data
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    proc, record = job("--time=30", "--", "--num_workers=3", "--preset=tpu_8192", script=SUBMIT)
    assert proc.returncode == 2 and record == [] and proc.stderr.startswith(
        "error: slurm_multinode.sbatch: set the preset with PRESET=tpu_8192, not --preset=tpu_8192"), proc.stderr
    # a flag start_training.sh sets for each run (the header's example was --seed=3: ten runs, one seed)
    proc, record = job("--time=30", "--", "--seed=3", script=SUBMIT)
    assert proc.returncode == 2 and record == [] and proc.stderr == (
        "error: slurm_multinode.sbatch: --seed=3: set SEED, OUTPUT_DIR or LOGDIR instead: start_training.sh sets "
        "them for each run (run i gets SEED+i)\n"), proc.stderr
    proc, record = job("--time=30", "--", "--num_workers=3", script=SUBMIT)
    assert proc.returncode == 0 and proc.stdout == "Submitted batch job 7\n", proc.stdout + proc.stderr
    assert record == ["sbatch --gpus-per-node=0 --time=30 %s --num_workers=3" % SBATCH]
    closed, record = job(script=SUBMIT, PRESET="rcp_3072", GPUS_PER_NODE="8")
    assert closed.returncode == 2 and len(record) == 1 and closed.stderr.startswith(
        "error: slurm_multinode.sbatch: set SUBMISSION_ORG SUBMISSION_PLATFORM INIT_CHECKPOINT ")


def test_the_pyxis_variant_runs_the_images_script_with_the_folders_mounted_at_their_paths(job, tmp_path):
    """Issue 45 (3): examples/slurm_multinode_pyxis.sbatch is the same job in the image: srun gets
    --container-image and the data (read-only) and output folders mounted at their own paths, and
    each node runs the image's start_training.sh with the image's Python; without CONTAINER_IMAGE it
    stops at once. (The srun stand-in records its arguments and runs nothing: no pyxis here.)"""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" "$PYTHON" >> "$FAKE_RECORD"\n')
    refused, record = job(script=pyxis)
    assert refused.returncode == 2 and record == [] and refused.stderr.startswith(
        "error: slurm_multinode_pyxis.sbatch: set CONTAINER_IMAGE "), refused.stderr
    out = tmp_path / "out"
    proc, record = job("--num_workers=3", script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out))
    # srun ran nothing: no node's status, which the job's status says
    assert proc.returncode == 1 and "not every node with one of its own" in proc.stdout, proc.stdout + proc.stderr
    srun, python = record
    assert srun.startswith("--export=ALL --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
                           "--container-image=/images/bert.sqsh "
                           "--container-mounts=%s:%s,%s:%s:ro --container-workdir=/workspace/bert "
                           "--container-env=OUTPUT_DIR,DROP_CACHES,PYTHON,REQUIRE_MOUNT bash -c "
                           % (out, out, job.data, job.data)), srun
    assert srun.endswith(" node_task /workspace/bert/start_training.sh --preset=demo_cpu --device=cpu --num_workers=3")
    assert python == "/opt/venv/bin/python"


# The Dockerfile's ENV that the job leaves to the image: its own interpreter's setup (PATH, the venv,
# pip and apt quiet, unbuffered output), paths of its own (a host's MLPERF_BERT_CACHE would
# name a folder not mounted), and the GPUs, which enroot's hook and Slurm set.
IMAGE_OWN_ENV = {"DEBIAN_FRONTEND", "PYTHONUNBUFFERED", "PIP_DISABLE_PIP_VERSION_CHECK", "VIRTUAL_ENV", "PATH",
                 "MLPERF_BERT_CACHE", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}


def test_the_pyxis_variant_gives_the_jobs_settings_precedence_over_the_images_env():
    """Found under a real pyxis 0.24 + enroot 4.1 (docs/running.md, "Pyxis/enroot"): pyxis sets the
    job's environment in the container, but a variable the image defines keeps the image's value
    unless --container-env names it, so the Dockerfile's OUTPUT_DIR=/output took every run into the
    container's own file system (read-only there: "mkdir: cannot create directory '/output'"; a
    writable one is removed with the container) and its DROP_CACHES=1 beat the job's. Every ENV
    the Dockerfile sets is either named in the sbatch's --container-env or the image's own."""
    import re
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read().replace("\\\n", " ")
    image_env = set()
    for line in text.splitlines():
        if line.startswith("ENV "):
            image_env.update(m.group(1) for m in re.finditer(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", line[4:]))
    assert {"OUTPUT_DIR", "DROP_CACHES", "PYTHON"} <= image_env, image_env
    with open(os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")) as f:
        named = re.findall(r"--container-env=([A-Z0-9_,]+)", f.read())
    assert len(named) == 1, named
    assert set(named[0].split(",")) == image_env - IMAGE_OWN_ENV, (named, image_env - IMAGE_OWN_ENV)


def test_the_pyxis_variant_refuses_a_path_its_mounts_would_split(job, tmp_path):
    """A hostile sweep: a DATA_DIR or OUTPUT_DIR holding ',' or ':' went into --container-mounts as
    it is, where pyxis splits mounts at ',' and each at ':' (another folder mounted, or none). One
    line naming the path, before srun."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    for var, path in (("DATA_DIR", tmp_path / "co,mma"), ("OUTPUT_DIR", tmp_path / "sp ace" / "o:ut")):
        path.mkdir(parents=True)
        proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", **{var: str(path)})
        assert (proc.returncode, record) == (2, []), proc.stdout + proc.stderr
        assert proc.stderr == "error: slurm_multinode_pyxis.sbatch: the path %s holds ',' or ':', which " \
                              "--container-mounts reads as separators: give it through a path (a symbolic link) " \
                              "without them\n" % path


def test_paths_with_a_backslash_or_a_leading_dash_pass_the_check_and_run(job, tmp_path):
    """A hostile sweep of paths: the login node's check refused a DATA_DIR with a backslash that holds the
    files ("holds no part-* TFRecords": compgen -G read the backslash as an escape; the trainer reads it as
    it is); OUTPUT_DIR=-out (relative) ended the job 1 with mkdir's "invalid option", once it had its
    nodes, and the pyxis variant's check passed it with realpath's "invalid option" (OUTPUT_DIR then
    empty: the job's mkdir failed)."""
    data = tmp_path / "back\\slash"
    data.mkdir()
    for f in ("part-00000", "eval_10k"):
        (data / f).write_text("")
    proc, record = job(DATA_DIR=str(data), SBATCH_CHECK_ONLY="1", SBATCH_CHECK_FILES="1")
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    proc, record = job(OUTPUT_DIR="-out", FAKE_0="0:0", FAKE_1="0:0")
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert sorted(os.listdir(tmp_path / "submit" / "-out" / "slurm" / "40007.0")) == ["node_0", "node_1"]
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR="-out", SBATCH_CHECK_ONLY="1")
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


def test_submit_started_by_a_relative_path_under_a_cdpath_finds_its_job_script(tmp_path):
    """A hostile sweep of paths: with CDPATH set (a shell user's), `examples/submit.sh` run from the
    checkout went to CDPATH's examples/ and took cd's echo of it too: "JOB_SCRIPT=<two lines> does not
    exist". It finds its own job script, whose check then runs."""
    (tmp_path / "examples").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "INPUT_FILES", "JOB_SCRIPT")}
    proc = subprocess.run(["bash", os.path.join("examples", "submit.sh")], capture_output=True, text=True, cwd=ROOT,
                          env=dict(env, CDPATH=str(tmp_path), PRESET="demo_cpu", GPUS_PER_NODE="0"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: slurm_multinode.sbatch: set DATA_DIR "), proc.stderr


def test_the_pyxis_variant_mounts_each_folder_of_a_comma_list_and_of_a_glob(job, tmp_path):
    """A sweep: INPUT_FILES as the docs allow it, a comma list, was one path to the variant (realpath
    of "a/part-*,b/part-*": a folder "a/part-*,b" refused for its ','), and a glob in a folder's name
    was mounted as it is ("/data/*:/data/*:ro", which fails once the job runs). Each part's folder,
    above any glob, is mounted once, and the parts go on made absolute."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" "$INPUT_FILES" >> "$FAKE_RECORD"\n')
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b / "x1", b / "x2"):
        d.mkdir(parents=True)
        (d / "part-00000").write_text("")
    out = tmp_path / "out"
    proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out), EVAL_FILE=str(a / "part-00000"),
                       INPUT_FILES="%s/part-*,%s/x*/part-0000*,%s/part-00000" % (a, b, a))
    srun, given = record
    assert "--container-mounts=%s:%s,%s:%s:ro,%s:%s:ro,%s:%s:ro " % (out, out, job.data, job.data, a, a, b, b) in srun, srun
    assert given == "%s/part-*,%s/x*/part-0000*,%s/part-00000" % (a, b, a), given


def test_the_pyxis_variant_mounts_logdir_and_node_status_dir_where_set_apart(job, tmp_path):
    """A hostile sweep: only OUTPUT_DIR was mounted writable, so a LOGDIR (relative: the container's
    /workspace/bert) or a NODE_STATUS_DIR outside it was the container's own: the log lost with it (or
    refused by the image's REQUIRE_MOUNT=1 once the job had its nodes), and no node's status could be
    written, so a job whose every node finished ended 1. Each is made absolute, made and mounted; one
    inside OUTPUT_DIR goes with it."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" "$LOGDIR $NODE_STATUS_DIR" >> "$FAKE_RECORD"\n')
    out, status, logs = tmp_path / "out", tmp_path / "status", tmp_path / "submit" / "logs"
    proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out), LOGDIR="logs",
                       NODE_STATUS_DIR=str(status))
    srun, given = record
    assert "--container-mounts=%s:%s,%s:%s,%s:%s,%s:%s:ro " % (out, out, logs, logs, status, status, job.data,
                                                              job.data) in srun, srun
    assert given == "%s %s/40007.0" % (logs, status) and logs.is_dir() and status.is_dir(), given
    os.remove(str(tmp_path / "record"))
    proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out), LOGDIR=str(out / "l"))
    assert "--container-mounts=%s:%s,%s:%s:ro " % (out, out, job.data, job.data) in record[0], record

def test_the_pyxis_variant_mounts_a_folder_before_those_inside_it(job, tmp_path):
    """A hostile review: the written folders were mounted first, the read-only ones after, and pyxis mounts
    in order: a LOGDIR (or OUTPUT_DIR) inside DATA_DIR was hidden by DATA_DIR's read-only mount, its writes
    refused. A folder now comes before those inside it, the rest in their order."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" >> "$FAKE_RECORD"\n')
    out, logs = tmp_path / "out", job.data / "logs"
    proc, record = job(script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out), LOGDIR=str(logs))
    assert "--container-mounts=%s:%s,%s:%s:ro,%s:%s " % (out, out, job.data, job.data, logs, logs) in record[0], record

def test_the_pyxis_variant_mounts_a_config_files_folder_and_gives_its_path_absolute(job, tmp_path):
    """A review: a --config=FILE (an argument or in EXTRA_FLAGS) was passed on as given and not
    mounted: the nodes' start_training.sh, in the container, could not read it (or read the image's
    file of a relative path's name, the container's working folder being /workspace/bert). Its folder
    is mounted read-only at itself, the flag made absolute; one in OUTPUT_DIR goes with it."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" >> "$FAKE_RECORD"\n')
    out, conf = tmp_path / "out", tmp_path / "submit" / "cfg"
    conf.mkdir()
    (conf / "run.toml").write_text("learning_rate = 1e-3\n")
    for args, extra in ((["--config=cfg/run.toml"], ""), ([], "--num_workers=2 --config=cfg/run.toml")):
        proc, record = job(*args, script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out),
                           EXTRA_FLAGS=extra)
        assert "--container-mounts=%s:%s,%s:%s:ro,%s:%s:ro " % (out, out, job.data, job.data, conf, conf) in record[0], \
            record
        assert record[0].endswith(" --config=%s/run.toml" % conf), record
        os.remove(str(tmp_path / "record"))
    (out / "run.toml").write_text("learning_rate = 1e-3\n")
    proc, record = job("--config=%s/run.toml" % out, script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", OUTPUT_DIR=str(out))
    assert "--container-mounts=%s:%s,%s:%s:ro " % (out, out, job.data, job.data) in record[0], record


def test_the_pyxis_variant_leaves_out_a_read_only_mount_of_a_folder_it_writes(job, tmp_path):
    """A hostile review: a read-only folder at the path of a written one (OUTPUT_DIR=DATA_DIR, which
    train_model.sh takes; INIT_CHECKPOINT in OUTPUT_DIR) was mounted after it, at the same path: the
    output read-only in the container, every write refused. The written mount reads it too. So inside
    it (a second review): a --config file in a LOGDIR inside OUTPUT_DIR mounted LOGDIR read-only over
    OUTPUT_DIR's mount, the run's log refused."""
    pyxis = os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch")
    bin_srun = tmp_path / "bin" / "srun"
    bin_srun.write_text('#!/bin/bash\na="$*"\nprintf "%s\\n" "${a//$\'\\n\'/ }" >> "$FAKE_RECORD"\n')
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "run.toml").write_text("learning_rate = 1e-3\n")
    for args, extra, mounts in (([], {"OUTPUT_DIR": str(job.data)}, "%s:%s " % (job.data, job.data)),
                                ([], {"OUTPUT_DIR": str(out), "INIT_CHECKPOINT": str(out / "model.ckpt-28252")},
                                 "%s:%s,%s:%s:ro " % (out, out, job.data, job.data)),
                                (["--config=%s/logs/run.toml" % out], {"OUTPUT_DIR": str(out), "LOGDIR": str(out / "logs")},
                                 "%s:%s,%s:%s:ro " % (out, out, job.data, job.data))):
        with contextlib.suppress(FileNotFoundError):
            os.remove(str(tmp_path / "record"))
        proc, record = job(*args, script=pyxis, CONTAINER_IMAGE="/images/bert.sqsh", **extra)
        assert "--container-mounts=" + mounts in record[0], record


def test_submit_refuses_a_flag_file_and_a_config_files_seed_before_sbatch(job, tmp_path):
    """start_training.sh refuses --flagfile and a --config file that sets seed (every run of the
    series would have it), but on the nodes, once the job had waited for them: submit.sh says so
    before sbatch, the config read as start_training.sh reads it; a file without a seed is sent."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    os.symlink(os.path.join(ROOT, "mlperf_bert"), tmp_path / "submit" / "mlperf_bert")  # the checkout's reader
    seeded, bad, plain = tmp_path / "seeded.toml", tmp_path / "bad.json", tmp_path / "plain.json"
    seeded.write_text("[runtime]\nseed = 7\n")
    bad.write_text('{"sed": 7}')
    plain.write_text('{"learning_rate": 0.001}')
    for flag, why in (("--flagfile=%s" % plain, "--flagfile=%s: give the file's flags as arguments instead" % plain),
                      ("--config=%s" % seeded, "--config=%s sets seed: leave it out of the file and set SEED" % seeded),
                      ("--config=%s" % bad, "--config %s: unknown key sed (did you mean seed?)" % bad)):
        proc, record = job("--time=30", "--", flag, script=SUBMIT)
        assert proc.returncode == 2 and record == [], proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: slurm_multinode.sbatch: " + why), proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
    proc, record = job("--time=30", "--", "--config=%s" % plain, script=SUBMIT)
    assert proc.returncode == 0 and record == ["sbatch --gpus-per-node=0 --time=30 %s --config=%s" % (SBATCH, plain)], \
        proc.stdout + proc.stderr


def test_a_plain_scancel_waits_for_the_nodes_statuses(job):
    """A hostile sweep under the real Slurm: a plain ``scancel`` (or ``scontrol requeue``) of a
    running job signals srun too, which ends at once while the tasks still stop (their checkpoint
    written): the job's last line said "srun ended with status 143, not every node with one of its
    own (node 0 no status (killed, or never started) ...)" before both nodes said their run stopped.
    The statuses are waited for while the job's step is there."""
    proc, record = job(FAKE_SCANCEL="plain", FAKE_STOP_SECONDS="0.5")
    host = socket.gethostname()
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "slurm_multinode.sbatch: stopped by SIGTERM: status 143 (node 0 (%s) " \
                                           "143 node 1 (%s) 143; srun 143)" % (host, host), proc.stdout
    assert len(record) == 2


def test_a_sigterm_to_the_batch_shell_alone_stops_every_node(job, tmp_path):
    """A Slurm sweep: ``scancel --batch --signal=TERM JOBID`` (a --signal=B:TERM) signals the batch
    shell alone: it noted the stop and waited, the runs went on to their end, and the job said "every
    node finished", exit 0. The shell passes it on to every node, as the time limit's warning."""
    proc, record = job(FAKE_SCANCEL="batch", FAKE_RUN_SECONDS="3")
    host = socket.gethostname()
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "slurm_multinode.sbatch: stopped by SIGTERM: status 143 (node 0 (%s) " \
                                           "143 node 1 (%s) 143; srun 143)" % (host, host), proc.stdout
    assert (tmp_path / "record.scancel").read_text() == "scancel --signal=TERM 40007\n"
    # a job being ended or requeued (SLURM signals its tasks itself): no scancel, which would wait for it
    # (the first job's record gone too: the srun stand-in, seeing its lines, signalled the tasks before
    # they had started, whose sleeps then held the job 60 s on a busy machine)
    for name in ("record", "record.scancel"):
        (tmp_path / name).unlink()
    proc, record = job(FAKE_SCANCEL="plain", FAKE_JOB_STATE="COMPLETING")
    assert proc.returncode == 143 and not (tmp_path / "record.scancel").exists(), proc.stdout + proc.stderr


@pytest.mark.parametrize("stopped", [False, True], ids=["srun-ended", "job-ended"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "checkpoint"])
def test_a_lost_node_is_named_and_not_waited_for(job, tmp_path, stopped, checkpoint):
    """A Slurm sweep: node 1's slurmd and task killed (a node lost). The job, requeued by SLURM after
    the node failure, signalled the batch shell, which waited for node 1's status until KillWait's
    SIGKILL: no last line (or, had srun ended first, "node 0 lost contact with another rank first", node 1
    "no status (killed, or never started)"). The line names the lost node; nothing waits for it. It says
    what OUTPUT_DIR (node 0's) holds: "the checkpoints written so far are kept" was said of none too."""
    out = tmp_path / "submit" / "output"
    if checkpoint:
        (out / "run_3").mkdir(parents=True)
        (out / "run_3" / "model.ckpt-40.pt").write_text("")
    extra = dict(FAKE_LOST_TERM="1") if stopped else {}
    proc, record = job(FAKE_0="75:0.5", FAKE_LOST="1", FAKE_DOWN="n2", **extra)
    host = socket.gethostname()
    last = proc.stdout.splitlines()[-1]
    kept = ("the checkpoints written so far are kept: a requeue (--requeue, after a node failure) or a resubmission "
            "resumes" if checkpoint else "no checkpoint was written, nothing saved (%s on node 0 holds none): a requeue "
            "(--requeue, after a node failure) or a resubmission starts again" % out)
    assert last.startswith("slurm_multinode.sbatch: node 1 (n2) was lost: SLURM has it down or not responding (its "
                           "slurmd gone: the host failed or left the network); %s (" % kept), proc.stdout + proc.stderr
    m = re.search(r"\(node 0 \(%s\) 75 node 1 \(n2\) lost: down or not responding; srun (\d+)\)$" % re.escape(host), last)
    assert m and proc.returncode == int(m.group(1)) != 0, (last, proc.returncode)  # srun's (SLURM: NODE_FAIL)


def test_one_task_a_node_whatever_tasks_the_job_asked_for(job):
    """A Slurm sweep: ``submit.sh --ntasks-per-node=2`` (a habit) gave the job SLURM_NTASKS=4, which srun
    took over the script's --ntasks-per-node=1: two start_training.sh a node, the second torchrun's port
    busy (exit 2), its node status overwritten by the other's 79, and the job said "stopped before
    anything was saved (resubmit the same job ...)". srun runs one task a node."""
    proc, record = job(SLURM_NTASKS="4", SLURM_NTASKS_PER_NODE="2", FAKE_0="0:0.1", FAKE_1="0:0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(r.split()[0] for r in record) == ["0", "1"], record


def test_srun_passes_the_jobs_environment_as_the_script_set_it(job, tmp_path):
    """A hostile sweep: sbatch --export=LIST (not ALL alone) leaves SLURM_EXPORT_ENV=LIST in the job,
    which srun reads as its own --export: with ALL,NODE_STATUS_DIR=D srun set D again over the
    script's D/JOBID.ATTEMPT, every node wrote its status where the job did not look, and a job
    whose nodes all finished ended 1 ("not every node with one of its own"); with NONE the nodes
    got no NNODES or MASTER_ADDR. srun is given --export=ALL. (The stand-in applies the variable as
    srun does where no --export is given.)"""
    srun = tmp_path / "bin" / "srun"
    os.rename(str(srun), str(tmp_path / "bin" / "srun_nodes"))
    srun.write_text('#!/bin/bash\nexport_env="${SLURM_EXPORT_ENV:-ALL}"\n'
                    'for a in "$@"; do [[ "$a" == --export=* ]] && export_env="${a#--export=}"; done\n'
                    'IFS=, read -ra items <<< "$export_env"\n'
                    'for i in "${items[@]}"; do [[ "$i" == *=* ]] && export "${i?}"; done\n'
                    'exec "${0}_nodes" "$@"\n')
    srun.chmod(0o755)
    status = tmp_path / "status"
    proc, record = job(SLURM_EXPORT_ENV="ALL,NODE_STATUS_DIR=%s" % status, NODE_STATUS_DIR=str(status),
                       FAKE_0="0:0", FAKE_1="0:0")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith(
        "slurm_multinode.sbatch: every node finished"), proc.stdout + proc.stderr
    assert sorted(os.listdir(str(status / "40007.0"))) == ["node_0", "node_1"]

def test_extra_flags_on_several_lines_are_every_ones(job, tmp_path):
    """A hostile sweep: EXTRA_FLAGS written over several lines (a script's quoted block) was read up
    to its first newline, the flags after it left out unsaid; every line's are passed now."""
    proc, record = job(EXTRA_FLAGS="--num_workers=3\n  --num_warmup_steps=5 \n--nodo_eval", FAKE_SCANCEL="1")
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert sorted(record) == ["%d n1 %d 1 --preset=demo_cpu --device=cpu --num_workers=3 --num_warmup_steps=5 "
                              "--nodo_eval" % (n, 20000 + 40007 % 20000) for n in (0, 1)]
    # no shell reads EXTRA_FLAGS again: its quotes were passed as characters ('"My' a flag of its own,
    # --submission_platform='"My'); refused, naming the word and the way that passes spaces
    before = record
    proc, record = job(EXTRA_FLAGS='--num_workers=3 --submission_platform="My System"')
    assert (proc.returncode, record) == (2, before), proc.stdout + proc.stderr
    assert proc.stderr == (
        "error: slurm_multinode.sbatch: EXTRA_FLAGS word --submission_platform=\"My holds a quote, which would be part "
        "of the value: EXTRA_FLAGS is split at white space, without quoting; give a value with spaces as one argument "
        "after the script (sbatch ... slurm_multinode.sbatch '--name=a b')\n")
    (tmp_path / "record").unlink()  # (the fake srun's scancel waits for one line a node)
    # a value with spaces as an argument after the script; a quote inside a word is the value's own
    proc, record = job("--submission_platform=My System", EXTRA_FLAGS="--num_workers=3 --submission_org=O'Brien",
                       FAKE_SCANCEL="1")
    assert proc.returncode == 143 and sorted(record) == [
        "%d n1 %d 1 --preset=demo_cpu --device=cpu --num_workers=3 --submission_org=O'Brien --submission_platform=My "
        "System" % (n, 20000 + 40007 % 20000) for n in (0, 1)], record


@pytest.mark.parametrize("opts,env,said", [
    (["--time=5"], {}, "--time=5 (300 s)"),
    (["-t", "0-0:10"], {}, "--time=0-0:10 (600 s)"),
    (["--hold"], dict(SBATCH_TIMELIMIT="9:59"), "--time=9:59 (599 s)"),
], ids=["minutes", "days-hours:minutes", "SBATCH_TIMELIMIT"])
def test_submit_refuses_a_time_limit_within_the_warning(job, opts, env, said):
    """A hostile sweep under the real Slurm: with --time=3 SLURM's warning (the script's
    --signal=B:USR1@600) came at the job's first check, every run stopped as it started, and with
    REQUEUE_AT_TIME_LIMIT=1 the job requeued itself, to be stopped again, without end (attempt 2,
    3, ...). submit.sh refuses such a limit (sbatch's own reading: its option, SBATCH_TIMELIMIT, the
    script's line) in one line; one above the warning, or none (0), goes to sbatch."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    proc, record = job(*opts, script=SUBMIT, REQUEUE_AT_TIME_LIMIT="1", **env)
    assert (proc.returncode, record) == (2, []), proc.stdout + proc.stderr
    assert proc.stderr == (
        "error: submit.sh: %s is within the 600 s before the limit at which SLURM's warning (--signal=B:USR1@600) "
        "stops the runs: each would stop as it starts (and with REQUEUE_AT_TIME_LIMIT=1 requeue again and again); "
        "give a --time above 10 minutes\n" % said)
    for ok in ("--time=11", "--time=0", "--time=1-0"):
        proc, record = job(ok, script=SUBMIT)
        assert proc.returncode == 0 and record[-1] == "sbatch --gpus-per-node=0 %s %s" % (ok, SBATCH), proc.stderr


@pytest.mark.parametrize("lines,opts,said,signal", [
    (["#SBATCH -t 5", "#SBATCH --signal=B:USR1@600"], [], "--time=5 (300 s)", "B:USR1@600"),
    (["#SBATCH --time 0-0:10  # ten minutes", "#SBATCH --signal=B:USR1@600"], [], "--time=0-0:10 (600 s)",
     "B:USR1@600"),
    (["#SBATCH --signal=B:10@600"], ["--time=9"], "--time=9 (540 s)", "B:10@600"),
    (["#SBATCH --signal B:SIGUSR1@900", "#SBATCH -t14"], [], "--time=14 (840 s)", "B:SIGUSR1@900"),
    # a review: quotes, a "#" in a word, no space after #SBATCH, the signal's case and a leading 0
    (["#SBATCH --time=\"5\"", "#SBATCH --signal='B:usr1@600'"], [], "--time=5 (300 s)", "B:usr1@600"),
    (["#SBATCH--time=5#five", "#SBATCH --signal=B:010@600"], [], "--time=5 (300 s)", "B:010@600"),
    (["#SBATCH --signal=B:USR1@600"], ["--time=5", "--signal=b:Usr1@900"], "--time=5 (300 s)", "b:Usr1@900"),
], ids=["short", "spaced", "numeric-signal", "SIGUSR1", "quoted", "comment-in-word", "signal-case"])
def test_submit_reads_the_job_scripts_options_in_every_spelling_sbatch_takes(job, tmp_path, lines, opts, said,
                                                                            signal):
    """The last stop's "left": submit.sh read the job script's #SBATCH lines only as --NAME=VALUE, and
    a warning signal only by its name: a script with `#SBATCH -t 5`, `--time 5` or
    `--signal=B:10@600` (SIGUSR1's number) skipped the time check and queued a job whose every run
    stops as it starts (with REQUEUE_AT_TIME_LIMIT=1, for ever); a review found quotes, a "#" comment
    in a word, `#SBATCH--time`, `usr1` and `010` skipped it too. Lines after the script's first
    command are not sbatch's and are not read."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    script = tmp_path / "job.sbatch"
    head, rest = open(SBATCH).read().split("#SBATCH --time=12:00:00\n#SBATCH --signal=B:USR1@600\n")
    script.write_text(head + "".join(line + "\n" for line in lines) + rest)
    proc, record = job(*opts, script=SUBMIT, JOB_SCRIPT=str(script))
    assert (proc.returncode, record) == (2, []), proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: submit.sh: %s is within the %s s before the limit at which SLURM's warning "
                                  "(--signal=%s) stops the runs" % (said, signal.split("@")[1], signal)), proc.stderr
    # an #SBATCH line after the first command is a comment to sbatch
    script.write_text(head + "#SBATCH --signal=B:USR1@600\ntrue\n#SBATCH -t 5\n" + rest)
    proc, record = job(script=SUBMIT, JOB_SCRIPT=str(script))
    assert proc.returncode == 0 and record[-1] == "sbatch --gpus-per-node=0 %s" % script, proc.stderr


def test_submit_checks_the_settings_given_with_export_as_the_jobs(job):
    """A hostile sweep: settings given as sbatch's --export=ALL,NAME=VALUE (the job's environment)
    were checked with this host's: a DATA_DIR given so was refused ("set DATA_DIR"), a bad value so
    went to sbatch. They are the job's to the checks, split as sbatch splits them (commas outside
    quotes, an item wholly quoted unquoted; SBATCH_EXPORT alike)."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    export = "--export=ALL,DATA_DIR=%s" % job.data
    proc, record = job(export, script=SUBMIT, DATA_DIR="")
    assert proc.returncode == 0 and record == ["sbatch --gpus-per-node=0 %s %s" % (export, SBATCH)], proc.stderr
    for opts, env, said in ((["--export", "ALL,REQUEUE_AT_TIME_LIMIT=2"], {}, "REQUEUE_AT_TIME_LIMIT=2 must be 0 or 1"),
                            ([], dict(SBATCH_EXPORT="ALL,'GPUS_PER_NODE=4,x'"), "GPUS_PER_NODE=4,x must be a whole")):
        before = record
        proc, record = job(*opts, script=SUBMIT, **env)
        assert (proc.returncode, record) == (2, before), proc.stderr  # (no sbatch)
        assert proc.stderr.startswith("error: slurm_multinode.sbatch: " + said), proc.stderr

def test_submit_checks_a_job_exported_without_all_with_what_it_gets(job):
    """A hostile review: --export=NAME=VALUE,NAME (a list without ALL) gives the job those, the SLURM_
    variables and the login profile's, but the check ran with this host's whole environment: the host's PRESET
    (demo_cpu) passed it, and the job, given the closed preset, was refused on its node. Without ALL the
    check has the job's variables (a name alone: the host's value); with ALL (any case) this host's too."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    for export in ("--export=NONE,DATA_DIR=%s" % job.data, "--export=DATA_DIR"):
        proc, record = job(export, script=SUBMIT)
        assert (proc.returncode, record) == (2, []), proc.stderr  # (no sbatch)
        assert proc.stderr.startswith("error: slurm_multinode.sbatch: set SUBMISSION_ORG "), proc.stderr
    for opts in (["--export=DATA_DIR,PRESET,GPUS_PER_NODE"], ["--export", "all,DATA_DIR=%s" % job.data]):
        proc, record = job(*opts, script=SUBMIT)
        assert proc.returncode == 0 and record[-1] == "sbatch --gpus-per-node=0 %s %s" % (" ".join(opts), SBATCH), \
            proc.stderr


def test_submit_checks_a_job_exported_with_none_or_a_list_in_the_users_login_environment(job, tmp_path):
    """A hostile review: sbatch's --export=NONE starts the job "as if --get-user-env was specified"
    (sbatch(1)): in the user's login environment, the profile read. The check ran with PATH and HOME
    alone, so a PRESET and DATA_DIR the profile sets were refused ("set SUBMISSION_ORG ...") though the
    job gets them; this host's own (not the job's) still do not pass."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    home = tmp_path / "home"
    home.mkdir()
    proc, record = job("--export=NONE", script=SUBMIT, HOME=str(home))
    assert (proc.returncode, record) == (2, []), proc.stderr  # (the fixture's PRESET and DATA_DIR: this host's)
    assert proc.stderr.startswith("error: slurm_multinode.sbatch: set SUBMISSION_ORG "), proc.stderr
    (home / ".bash_profile").write_text("export PRESET=demo_cpu DATA_DIR=%s\n" % job.data)
    proc, record = job("--export=NONE", script=SUBMIT, HOME=str(home))
    assert proc.returncode == 0 and record[-1] == "sbatch --gpus-per-node=0 --export=NONE %s" % SBATCH, proc.stderr
    # A list, with ALL or without, does as NONE (sbatch sets get_user_env for every --export but ALL
    # alone: under Slurm 22.05 a job given --export=FOO=bar had the profile's variables too): the list
    # without ALL was checked with PATH and HOME alone (the profile's PRESET refused), the list with
    # ALL without the profile's (its REQUEUE_AT_TIME_LIMIT=2, which the job gets, passed)
    proc, record = job("--export=GPUS_PER_NODE", script=SUBMIT, HOME=str(home))
    assert proc.returncode == 0 and record[-1] == "sbatch --gpus-per-node=0 --export=GPUS_PER_NODE %s" % SBATCH, \
        proc.stderr
    (home / ".bash_profile").write_text("export PRESET=nonsense REQUEUE_AT_TIME_LIMIT=2\n")
    sent = len(record)
    proc, record = job("--export=ALL,SEED=5", script=SUBMIT, HOME=str(home))  # (this host's PRESET over the profile's)
    assert (proc.returncode, len(record)) == (2, sent) and proc.stderr.startswith(
        "error: slurm_multinode.sbatch: REQUEUE_AT_TIME_LIMIT=2 must be 0 or 1"), proc.stderr


def test_submit_checks_the_nodes_settings_before_sbatch(job, tmp_path):
    """A hostile sweep under the real Slurm: NUM_RUNS=abc, SEED=abc, a mistyped PRESET or a trainer
    flag the trainer cannot read went to sbatch: the job waited for its nodes, then each refused it.
    submit.sh runs start_training.sh's and train_model.sh's own checks (CHECK_ONLY=1, the one for
    another host) with this checkout's scripts, over the job's ranks (--nodes, GPUS_PER_NODE): one
    line, before sbatch."""
    (job.data / "part-00000").write_text("")
    (job.data / "eval_10k").write_text("")
    import sys
    cwd = tmp_path / "submit"
    (cwd / "start_training.sh").unlink()
    for name in ("start_training.sh", "train_model.sh"):  # the checkout's (they find it through the link)
        os.symlink(os.path.join(ROOT, name), cwd / name)
    checkout = dict(PYTHON=sys.executable)
    for opts, env, said in (
            ([], dict(NUM_RUNS="abc"), "error: start_training.sh: NUM_RUNS=abc must be a whole number >= 1"),
            ([], dict(SEED="abc"), "error: start_training.sh: SEED=abc must be a whole number >= 0 (decimal)"),
            ([], dict(PRESET="demo_cpux", SUBMISSION_ORG="O", SUBMISSION_PLATFORM="P",
                      INIT_CHECKPOINT=str(job.data / "eval_10k")), "error: train_model.sh: unknown preset 'demo_cpux'"),
            (["--", "--num_workers=abc"], {}, "error: train_model.sh: flag --num_workers=abc: invalid literal"),
            # the world of the job's --nodes: 3 ranks do not split the preset's batch of 16
            (["--nodes=3"], {}, "error: train_model.sh: --train_batch_size=16 is not a multiple of the 3 ranks")):
        proc, record = job("--time=30", *opts, script=SUBMIT, **checkout, **env)
        assert (proc.returncode, record) == (2, []), proc.stdout + proc.stderr
        assert proc.stderr.startswith(said) and len(proc.stderr.splitlines()) == 1, proc.stderr
    proc, record = job("--time=30", "--nodes=4", "--", "--num_workers=1", script=SUBMIT, **checkout)
    assert proc.returncode == 0 and record == ["sbatch --gpus-per-node=0 --time=30 --nodes=4 %s --num_workers=1"
                                               % SBATCH], proc.stdout + proc.stderr
    # a review: a login node whose Python lacks the trainer's packages (here: without its site-packages)
    # refused the default rcp preset (its reading imports absl: a ModuleNotFoundError line) and a --config
    # file: both are the job's to check, on the nodes' Python (the image's /opt/venv)
    bare = tmp_path / "bare_python"
    bare.write_text('#!/bin/sh\nexec %s -S "$@"\n' % sys.executable)
    bare.chmod(0o755)
    conf = tmp_path / "run.toml"
    conf.write_text("learning_rate = 0.002\n")
    os.remove(str(job.data.parent / "record"))
    proc, record = job("--time=30", "--", "--config=%s" % conf, script=SUBMIT, PYTHON=str(bare), PRESET="rcp_3072",
                       SUBMISSION_ORG="O", SUBMISSION_PLATFORM="P", INIT_CHECKPOINT=str(job.data / "eval_10k"))
    assert proc.returncode == 0 and record == ["sbatch --gpus-per-node=0 --time=30 %s --config=%s" % (SBATCH, conf)], \
        proc.stdout + proc.stderr


def test_submission_status_reaches_the_nodes_only_where_set(job):
    """A review: the sbatch exported SUBMISSION_STATUS=onprem where it was unset, and train_model.sh's
    environment beats a --config file: a file's submission_status (cloud) was replaced by the default,
    unsaid. Unset, the nodes get none (the trainer's default is onprem); set, they get it."""
    start = job.data.parent / "submit" / "start_training.sh"
    start.write_text('#!/bin/bash\necho "$NODE_RANK ${SUBMISSION_STATUS-unset}" >> "$FAKE_RECORD"\n')
    proc, record = job()
    assert proc.returncode == 0 and sorted(record) == ["0 unset", "1 unset"], proc.stdout + proc.stderr
    os.remove(str(job.data.parent / "record"))
    proc, record = job(SUBMISSION_STATUS="cloud")
    assert proc.returncode == 0 and sorted(record) == ["0 cloud", "1 cloud"], proc.stdout + proc.stderr


def test_each_task_of_a_job_array_has_its_own_runs(job, tmp_path):
    """A Slurm sweep: the tasks of ``sbatch --array=0-1`` shared OUTPUT_DIR and SEED (MASTER_PORT is the
    job id's, each task's own): the second task found the first's run finished, nothing done, exit 0, or
    ran beside it and was refused ("in use by another run", exit 2). Task T runs in OUTPUT_DIR/array_T
    (LOGDIR/array_T), its run i with seed SEED + T x NUM_RUNS + i; a job that is no array is unchanged."""
    start = tmp_path / "submit" / "start_training.sh"
    start.write_text('#!/bin/bash\necho "$NODE_RANK $OUTPUT_DIR ${SEED-unset} ${LOGDIR-unset}" >> "$FAKE_RECORD"\n')
    out = tmp_path / "out"
    proc, record = job(OUTPUT_DIR=str(out), SEED="7", NUM_RUNS="3", LOGDIR="logs", SLURM_ARRAY_TASK_ID="1")
    assert proc.returncode == 0 and sorted(record) == ["%d %s/array_1 10 logs/array_1" % (n, out) for n in (0, 1)], \
        proc.stdout + proc.stderr
    assert "array task 1: OUTPUT_DIR=%s/array_1 SEED=10," % out in proc.stdout
    os.remove(str(tmp_path / "record"))
    proc, record = job(OUTPUT_DIR=str(out), NUM_RUNS="3", SLURM_ARRAY_TASK_ID="0")
    assert proc.returncode == 0 and sorted(record) == ["%d %s/array_0 unset unset" % (n, out) for n in (0, 1)], \
        proc.stdout + proc.stderr
    os.remove(str(tmp_path / "record"))
    proc, record = job(OUTPUT_DIR=str(out), SEED="7")
    assert proc.returncode == 0 and sorted(record) == ["%d %s 7 unset" % (n, out) for n in (0, 1)], \
        proc.stdout + proc.stderr
    # a review: past start_training.sh's 18 digits, its nodes refused a SEED never set ("SEED=1000000000000000002")
    os.remove(str(tmp_path / "record"))
    proc, record = job(OUTPUT_DIR=str(out), SEED="999999999999999990", NUM_RUNS="3", SLURM_ARRAY_TASK_ID="4")
    assert (proc.returncode, record, proc.stderr) == (2, [], (
        "error: slurm_multinode.sbatch: SEED=999999999999999990 with NUM_RUNS=3: array task 4's seeds, from SEED + 4 x "
        "NUM_RUNS = 1000000000000000002, pass 18 digits: give a smaller SEED\n")), proc.stdout + proc.stderr


@pytest.mark.parametrize("checkpoint", ["", "model.ckpt-8.pt", "run_0/model.ckpt-8.pt"])
def test_a_node_without_status_is_named_before_the_peer_that_lost_it(job, tmp_path, checkpoint):
    """A Slurm sweep: node 1's slurmd and task killed (its host lost) before SLURM had it down or not
    responding (SlurmdTimeout: minutes): the job ended 75, "node 0 lost contact with another rank first",
    the node that failed named only as "no status". Its line names node 1; the status is srun's. What is
    kept is what OUTPUT_DIR (node 0's: the batch shell's) holds: a run's checkpoint, or a series' run's
    (it said "the checkpoints written so far are kept" of an OUTPUT_DIR that held none)."""
    out = tmp_path / "submit" / "output"
    (out / "run_0").mkdir(parents=True)
    (out / "run_0" / "model.ckpt-8.pt.tmp-99").write_text("")  # one being written: not a checkpoint
    if checkpoint:
        (out / checkpoint).write_text("")
    proc, record = job(FAKE_0="75:0.5", FAKE_LOST="1")
    host = socket.gethostname()
    last = proc.stdout.splitlines()[-1]
    kept = ("the checkpoints written so far are kept: a requeue or a resubmission resumes" if checkpoint else
            "no checkpoint was written, nothing saved (%s on node 0 holds none): a requeue or a resubmission starts "
            "again" % out)
    assert last == ("slurm_multinode.sbatch: node 1 (n2) left no status (its task killed, or its node lost: SLURM does "
                    "not have it down yet) and node 0 lost contact with it; %s (node 0 (%s) 75 node 1 no status "
                    "(killed, or never started); srun 137)" % (kept, host)), proc.stdout + proc.stderr
    assert proc.returncode == 137, proc.returncode


def test_a_rendezvous_that_failed_names_the_node_that_never_came(job):
    """A review: a job that ended 78 (a node never came to the rendezvous) said "no node met the others
    ... Node 0 gave up first", not which node never came. Node 1's task killed as node 0 waited (it
    wrote no status): the line names it."""
    proc, record = job(FAKE_0="78:0.5", FAKE_LOST="1")
    host = socket.gethostname()
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == (
        "slurm_multinode.sbatch: no node met the others at the rendezvous n1:20007 (MASTER_ADDR:MASTER_PORT) within "
        "RDZV_TIMEOUT (900 s): check that every node reaches n1 by that name and port 20007 on it (a firewall), and "
        "that every node's task started in that time; then resubmit. Node 0 gave up first, status 78; never came: "
        "node 1 (n2), which left no status (its task never started, or was killed) (node 0 (%s) 78 node 1 no status "
        "(killed, or never started); srun 137)" % host), proc.stdout


def test_a_stop_at_start_is_node_0s_status_not_another_nodes_79(job):
    """A review: a resumed job with a node-local OUTPUT_DIR stopped as it started: node 0, whose folder
    holds the checkpoint, said 143; node 1, whose folder holds none (rank 0 alone writes them), 79
    ("nothing saved"), first: the job ended 79, "stopped before anything was saved", and a script
    that resubmits on 143 stopped resubmitting it. Node 0's status is the stop's."""
    proc, record = job(FAKE_0="143:0.5", FAKE_1="79:0.1")
    host = socket.gethostname()
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == ("slurm_multinode.sbatch: stopped: status 143 (node 0 (%s) 143 node 1 (%s) "
                                            "79; srun 143)" % (host, host)), proc.stdout
    # both 79 (a fresh job): nothing saved, as before
    proc, record = job(FAKE_0="79:0.5", FAKE_1="79:0.1")
    assert proc.returncode == 79 and "stopped before anything was saved" in proc.stdout.splitlines()[-1], proc.stdout


def test_a_nodes_status_line_has_its_time_without_epochrealtime(tmp_path):
    """A review: a node's status line took its time from EPOCHREALTIME alone, which bash before 5.0
    (RHEL 7's 4.2) does not have: the line read `143  n2`, the host name became the time, and the job's
    summary ended on `set -u` (`n2: unbound variable`). Without it, the time is whole seconds."""
    text = open(SBATCH, encoding="utf-8").read()
    task = re.search(r"^node_task='(.*?)'$", text, re.S | re.M).group(1)
    env = dict(os.environ, NODE_STATUS_DIR=str(tmp_path), SLURM_NODEID="1")
    for unset in ("", "unset EPOCHREALTIME; "):  # (bash 5 unset: as bash 4 has none)
        proc = subprocess.run(["bash", "-c", unset + task, "node_task", "bash", "-c", "exit 143"], env=env)
        status, when, host = (tmp_path / "node_1").read_text().split()
        assert (proc.returncode, status, host) == (143, "143", socket.gethostname()), unset
        assert when.isdigit() and abs(int(when) / 1e6 - time.time()) < 60, (unset, when)
